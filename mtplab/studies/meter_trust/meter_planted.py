"""Planted host delays per step: the meter's bubble must rise by d (overlap off), and how
much of d overlap + zero_bubble hides (part `planted`)."""
from __future__ import annotations

import statistics
import time

import numpy as np

from mtplab import Engine, RunConfig
from mtplab.nogc import gc_paused

from .meter_common import (DELAYS_MS, OVERLAP, REGIMES, SLACK_US, prompts, sleep_us,
                           verdict)
from .meter_stats import planted_tolerance


def _decode_bubble(eng, first: int) -> tuple[float, float]:
    """(median bubble, median wall) µs per decode step since meter step `first`."""
    df = eng.meter_frame()
    df = df[(df["step"] >= first) & df["name"].str.startswith("step[decode")].iloc[1:]
    return float(df["bubble_us"].median()), float(df["wall_us"].median())  # (after prefill)


def planted(rows: list, regime: str, mode: str, reps: int = 15,
            data: dict | None = None) -> None:
    """Each delayed generate is paired with a d = 0 generate right before it (the machine's
    drift cancels in the pair); rise = median over the pairs of the difference of their
    median bubbles per decode step. GC is off while timing (both arms alike). The hook also
    reads the host clock at every step: the host's step period (hook to hook, the delay
    included) rises by d plus whatever the host itself slows by after being away for d; the
    meter's rise is compared with both. `data` (given) gets every pair's figures under
    "planted" (one record per regime and mode)."""
    cfg, bs, tokens = REGIMES[regime]
    eng = Engine(RunConfig(**cfg, **OVERLAP[mode], bubble_meter=True, max_running_requests=bs))
    ps = prompts(eng, bs)
    delay, starts = {"us": 0.0}, []

    def hook(_step):
        starts.append(time.perf_counter_ns())
        sleep_us(delay["us"])
    eng.on_step(hook)
    eng.generate(ps, max_new_tokens=16, ignore_eos=True)          # warm-up

    def bubble(d: float) -> tuple[float, float, float]:
        """(meter bubble, meter wall, host step period) µs, medians over decode steps."""
        delay["us"] = d * 1e3
        first = eng.meter.step + 1
        starts.clear()
        eng.generate(ps, max_new_tokens=tokens, ignore_eos=True)
        period = float(np.median(np.diff(starts[1:]))) / 1e3      # after the prefill step
        return (*_decode_bubble(eng, first), period)
    base, walls, rise, host = [], [], {d: [] for d in DELAYS_MS}, {d: [] for d in DELAYS_MS}
    with gc_paused(collect=True):
        for _ in range(reps):
            for d in DELAYS_MS:
                b0, w0, p0 = bubble(0.0)
                base.append(b0)
                walls.append(w0)
                b, _, p = bubble(d)
                rise[d].append(b - b0)
                host[d].append(p - p0)
    if data is not None:
        data.setdefault("planted", []).append(
            {"regime": regime, "mode": mode, "model": cfg["model"], "draft": cfg["draft"],
             "bs": bs, "tokens": tokens, "base_us": base, "wall_us": walls,
             "delays": [{"d_ms": d, "rise_us": rise[d], "host_us": host[d]}
                        for d in DELAYS_MS]})
    wall = statistics.median(walls)
    rows += ["", f"Planted host delay per step (a sleep, its last {SLACK_US:.0f} µs spun), "
             f"{regime} ({cfg['model']} draft {cfg['draft']}, bs {bs}), overlap {mode}: rise = "
             f"median over {reps} pairs (a d = 0 generate, then d) of the difference of their "
             f"median bubbles per decode step; host rise = the same for the host's step period "
             f"(host clock, hook to hook); baseline bubble {statistics.median(base):.1f} µs of a "
             f"{wall:.0f} µs step:", ""]
    if mode == "off":
        rows += ["| d µs | rise µs [IQR] | error vs d | target | verdict | host rise µs [IQR] | "
                 "host slowdown (host rise - d) | meter - host (per pair, median) |",
                 "|---|---|---|---|---|---|---|---|"]
    else:
        rows += ["| d µs | rise µs [IQR] | hidden µs | hidden % | host rise µs |",
                 "|---|---|---|---|---|"]
    for d in DELAYS_MS:
        r, h = float(np.median(rise[d])), float(np.median(host[d]))
        q1, q3 = np.percentile(rise[d], [25, 75])
        want = d * 1e3
        if mode == "off":
            tol = planted_tolerance(want)
            h1, h3 = np.percentile(host[d], [25, 75])
            diff = float(np.median(np.subtract(rise[d], host[d])))
            rows.append(f"| {want:.0f} | {r:.1f} [{q1:.0f}, {q3:.0f}] | {r - want:+.1f} µs | "
                        f"±{tol:.0f} µs | {verdict(abs(r - want) <= tol)} | {h:.1f} [{h1:.0f}, "
                        f"{h3:.0f}] | {h - want:+.1f} µs | {diff:+.1f} µs |")
        else:
            rows.append(f"| {want:.0f} | {r:.1f} [{q1:.0f}, {q3:.0f}] | {want - r:.1f} | "
                        f"{100 * (want - r) / want:.1f}% | {h:.1f} |")
