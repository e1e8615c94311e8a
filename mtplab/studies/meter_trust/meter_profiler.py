"""The meter against the profiler in the same profiled runs: GPU-backlogged and host-bound
(part `profiler`), and each planted delay (part `planted-profiler`)."""
from __future__ import annotations

from pathlib import Path

from mtplab.studies.run_cells import sleep_cycles
from mtplab import Engine, RunConfig

from .meter_common import (BASE, DELAYS_MS, OVERLAP, REGIMES, prompts, spin_us,
                           verdict)
from .meter_stats import PROFILER_POINTS


def _same_steps(eng, steps, w: int, u: int):
    """The meter's rows of the analyser's profiled `steps` (whose count starts at the
    profiler's window, w + u engine steps in), and a note when their names disagree."""
    mf = eng.meter_frame()
    mf = mf[mf["step"].isin(steps["step"] + w + u)]
    same = list(mf["name"]) == list(steps["name"])
    return mf, "" if same else " (step names differ: windows misaligned)"


def vs_profiler(rows: list, d: Path, data: dict | None = None) -> None:
    """`data` (given) gets each regime's bubble fractions under "profiler"."""
    import torch
    from mtplab.analysis.bubbles import analyze
    w, u, a = 6, 2, 12
    rows += ["", "Meter vs profiler, same profiled run (tiny-code frozen, overlap + zero_bubble, "
             f"bs 8, {a} profiled steps, the first left out of both):", "",
             "| regime | meter bubble % | profiler bubble % | profiler - meter (points) | "
             "target | verdict |", "|---|---|---|---|---|---|"]
    for regime in ("backlogged", "host-bound"):
        eng = Engine(RunConfig(**BASE, **OVERLAP["on+zb"], bubble_meter=True, profile=True,
                               profile_wait=w, profile_warmup=u, profile_active=a,
                               trace_dir=str(d), run_name=f"meter-{regime}",
                               max_running_requests=8))
        if regime == "backlogged":
            cycles = sleep_cycles(5.0)
            # The planted work carries a stage interval so the meter counts it busy, as the
            # profiler does; which stage name labels it does not matter to either tool.
            b, e = (eng.meter.stamp_code("stash", "forward", x) for x in (False, True))

            def hold(_step, eng=eng, b=b, e=e, cycles=cycles):   # planted GPU work, stamped
                # so that both tools count it busy
                with torch.cuda.stream(eng.scheduler.forward_stream):
                    eng.meter.stamp(b)
                    torch.cuda._sleep(cycles)
                    eng.meter.stamp(e)
            eng.on_step(hold)
        eng.generate(prompts(eng, 8), max_new_tokens=96, ignore_eos=True)
        files = eng.finish()
        res = analyze(files["trace0"], skip_steps=1)
        sel, note = _same_steps(eng, res.steps, w, u)
        meter = float(sel["bubble_us"].sum() / sel["wall_us"].sum())
        prof = float(res.summary["bubble_frac"])
        diff = 100 * (prof - meter)
        tgt = (f"≤ {PROFILER_POINTS:g} points" if regime == "backlogged"
               else "(idle inside stages)")
        ok = verdict(abs(diff) <= PROFILER_POINTS) if regime == "backlogged" else "-"
        if data is not None:
            data.setdefault("profiler", []).append(
                {"regime": regime, "meter_frac": meter, "profiler_frac": prof,
                 "steps": int(len(sel)), "aligned": not note})
        rows.append(f"| {regime} | {100 * meter:.1f} | {100 * prof:.1f} | {diff:+.1f} | {tgt} | "
                    f"{ok}{note} |")


def planted_vs_profiler(rows: list, d: Path, data: dict | None = None) -> None:
    """The host-bound planted delays once more, each d in its own profiled run: the meter's
    and the profiler's median bubble per decode step over the same profiled steps, so what
    the meter reads beyond d (wake-up after idle, or the meter) is checked by an independent
    clock. `data` (given) gets each d's medians under "planted_profiler"."""
    from mtplab.analysis.bubbles import analyze
    cfg, bs, _ = REGIMES["host-bound"]
    w, u, a = 6, 2, 40
    med = {}
    for ms in (0.0,) + DELAYS_MS:
        eng = Engine(RunConfig(**cfg, **OVERLAP["off"], bubble_meter=True, profile=True,
                               profile_wait=w, profile_warmup=u, profile_active=a,
                               trace_dir=str(d), run_name=f"planted-{ms:g}",
                               max_running_requests=bs))
        eng.on_step(lambda _step, us=ms * 1e3: spin_us(us))
        eng.generate(prompts(eng, bs), max_new_tokens=160, ignore_eos=True)
        res = analyze(eng.finish()["trace0"], skip_steps=1)
        st = res.steps[res.steps["name"].str.startswith("step[decode")]
        mf, note = _same_steps(eng, st, w, u)
        med[ms] = (float(mf["bubble_us"].median()), float(st["bubble_us"].median()),
                   f"{len(st)}{note}")
        if data is not None:
            data.setdefault("planted_profiler", []).append(
                {"d_ms": ms, "meter_us": med[ms][0], "profiler_us": med[ms][1],
                 "steps": int(len(st)), "aligned": not note})
    rows += ["", f"Planted host delay vs the profiler (host-bound, overlap off; one profiled "
             f"run per d, {a} profiled steps; median bubble per decode step of each tool over "
             "the same steps, both under the profiler's host cost):", "",
             "| d µs | meter µs/step | profiler µs/step | meter - profiler µs | steps |",
             "|---|---|---|---|---|"]
    for ms in (0.0,) + DELAYS_MS:
        m, p, n = med[ms]
        rows.append(f"| {ms * 1e3:.0f} | {m:.1f} | {p:.1f} | {m - p:+.1f} | {n} |")
