"""Bubble meter validation on the GPU (issue: Bubble meter). Every figure is printed with
PASS/MISS against its target where it has one.

1. Stamp resolution: back-to-back stamp kernels on a backlogged stream; min nonzero / median
   delta between consecutive %globaltimer reads (stated, no target).
2. Planted host delays, overlap off: a busy-wait of d in {0.2, 1, 5} ms in a per-step hook
   (Engine.add_step_hook); the meter's median bubble per decode step must rise by d within
   5% (or 10 µs). Arms interleaved with d = 0.
3. The same with overlap on + zero_bubble: the rise and how much of d is hidden (no target).
4. Meter vs profiler in one profiled run: GPU-backlogged (a GPU sleep queued after every
   step, bracketed by meter stamps so both tools count it busy) -> bubble fractions within
   2 points; host-bound (no sleep) -> both, and profiler - meter = idle inside stages the
   meter cannot see (no target).
5. Overhead: decode tok/s meter on vs off, interleaved repeats, tiny-code bs 1 and bs 32
   (target <= 1%).

    python -m benchmarks.bench_meter --out $OUT/bench_meter.md
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks.common import emit, sleep_cycles
from mtplab import Engine, RunConfig
from mtplab.models.corpus import heldout_snippets

BASE = dict(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True, context_len=1024)
OVERLAP = {"off": dict(overlap=False), "on+zb": dict(overlap=True, zero_bubble=True)}
DELAYS_MS = (0.2, 1.0, 5.0)


def prompts(eng, n, nbytes=256):
    return [eng.tokenizer.encode(t) for t in heldout_snippets(n, nbytes)]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def resolution(rows: list, n: int = 2000) -> None:
    import torch
    from mtplab.instrument.meter import BubbleMeter
    m = BubbleMeter(torch.device("cuda"), capacity=4096)
    code = m.stamp_code("verify", "forward", False)
    torch.cuda._sleep(1000)
    m.device_stamp(code)                 # compile + load outside the measurement
    torch.cuda.synchronize()
    start = int(m.count[0])
    torch.cuda._sleep(50_000_000)        # the stamps below queue behind it: back to back
    for _ in range(n):
        m.device_stamp(code)
    torch.cuda.synchronize()
    slots = (start + np.arange(n)) & (m.capacity - 1)
    ns = m.ring.cpu().numpy()[slots, 1]
    d = np.diff(ns)
    nz = d[d > 0]
    rows += ["", f"Stamp resolution ({n} back-to-back stamp kernels on a backlogged stream): "
             f"min nonzero delta {nz.min() if nz.size else float('nan'):.0f} ns, median delta "
             f"{np.median(d):.0f} ns, {100 * (d == 0).mean():.1f}% of deltas 0 (same timer "
             f"tick), distinct ticks {np.unique(ns).size}."]
    # host cost of one eager stamp: an idle stream (the GPU keeps up, so no launch waits for
    # a slot in a full launch queue), 200 stamps per timing, median of 5
    per = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            m.stamp(code)
        per.append((time.perf_counter() - t) / 200 * 1e6)
    torch.cuda.synchronize()
    rows += [f"Host cost of one eager stamp (idle stream): {statistics.median(per):.2f} µs per "
             f"launch (launch path: "
             f"{'direct compiled launcher' if m._launch.direct else 'Triton JIT'})."]


@contextmanager
def gc_off():
    """No garbage collection pause inside the timed runs (collected once before)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _decode_bubble(eng, first: int) -> float:
    df = eng.meter_frame()
    df = df[(df["step"] >= first) & df["name"].str.startswith("step[decode")]
    return float(df["bubble_us"].iloc[1:].median())      # the first decode step follows prefill


def planted(rows: list, mode: str, reps: int = 7) -> None:
    """Each delayed generate is paired with a d = 0 generate right before it (the machine's
    drift cancels in the pair); rise = median over the pairs of the difference of their
    median bubbles per decode step. GC is off while timing (both arms alike)."""
    eng = Engine(RunConfig(**BASE, **OVERLAP[mode], bubble_meter=True, max_running_requests=1))
    ps = prompts(eng, 1)
    delay = {"s": 0.0}

    def spin(_step):                     # busy-wait: the planted time is exact
        t = time.perf_counter()
        while time.perf_counter() - t < delay["s"]:
            pass
    eng.add_step_hook(spin)
    eng.generate(ps, max_new_tokens=32, ignore_eos=True)          # warm-up

    def bubble(d: float) -> float:
        delay["s"] = d / 1e3
        first = eng.meter.step + 1
        eng.generate(ps, max_new_tokens=192, ignore_eos=True)
        return _decode_bubble(eng, first)
    base, rise = [], {d: [] for d in DELAYS_MS}
    with gc_off():
        for _ in range(reps):
            for d in DELAYS_MS:
                b0 = bubble(0.0)
                base.append(b0)
                rise[d].append(bubble(d) - b0)
    rows += ["", f"Planted host delay per step, overlap {mode} (tiny-code frozen, fold_seed, "
             f"bs 1; rise = median over {reps} pairs (a d = 0 generate, then d) of the "
             f"difference of their median bubbles per decode step; baseline "
             f"{statistics.median(base):.1f} µs):", ""]
    if mode == "off":
        rows += ["| d µs | rise µs [IQR] | error | target | verdict |", "|---|---|---|---|---|"]
    else:
        rows += ["| d µs | rise µs [IQR] | hidden µs | hidden % |", "|---|---|---|---|"]
    for d in DELAYS_MS:
        r = float(np.median(rise[d]))
        q1, q3 = np.percentile(rise[d], [25, 75])
        want = d * 1e3
        if mode == "off":
            tol = max(0.05 * want, 10.0)
            rows.append(f"| {want:.0f} | {r:.1f} [{q1:.0f}, {q3:.0f}] | {r - want:+.1f} µs | "
                        f"±{tol:.0f} µs | {verdict(abs(r - want) <= tol)} |")
        else:
            rows.append(f"| {want:.0f} | {r:.1f} [{q1:.0f}, {q3:.0f}] | {want - r:.1f} | "
                        f"{100 * (want - r) / want:.1f}% |")


def vs_profiler(rows: list, d: Path) -> None:
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

            def hold(_step):     # planted GPU work, stamped so that both tools count it busy
                with torch.cuda.stream(eng.scheduler.forward_stream):
                    eng.meter.stamp(b)
                    torch.cuda._sleep(cycles)
                    eng.meter.stamp(e)
            eng.add_step_hook(hold)
        eng.generate(prompts(eng, 8), max_new_tokens=96, ignore_eos=True)
        files = eng.finish()
        res = analyze(files["trace0"], skip_steps=1)
        mf = eng.meter_frame()
        n = res.summary["n_steps"]
        sel = mf[(mf["step"] >= w + u + 1) & (mf["step"] < w + u + 1 + n)]
        names_agree = list(sel["name"]) == list(res.steps["name"])
        meter = float(sel["bubble_us"].sum() / sel["wall_us"].sum())
        prof = float(res.summary["bubble_frac"])
        diff = 100 * (prof - meter)
        tgt = "≤ 2 points" if regime == "backlogged" else "(idle inside stages)"
        ok = verdict(abs(diff) <= 2.0) if regime == "backlogged" else "-"
        rows.append(f"| {regime} | {100 * meter:.1f} | {100 * prof:.1f} | {diff:+.1f} | {tgt} | "
                    f"{ok}{'' if names_agree else ' (step names differ: windows misaligned)'} |")


def overhead(rows: list, reps: int = 21) -> None:
    """Decode tok/s meter on vs off, interleaved; the verdict reads the median of the
    per-repeat ratios (paired: neighbouring runs share the machine's state)."""
    rows += ["", f"Meter overhead (tiny-code frozen, fold_seed, overlap + zero_bubble, decode "
             f"tok/s of 384-token generates, {reps} interleaved repeats, GC off; overhead = 1 - median of the per-repeat "
             f"on/off ratios, IQR in brackets; eager stamp launches per decode step counted):",
             "", "| bs | meter off (median) | meter on (median) | eager stamps / step | "
             "overhead [IQR] | target | verdict |", "|---|---|---|---|---|---|---|"]
    for bs in (1, 32):
        engs = {k: Engine(RunConfig(**BASE, **OVERLAP["on+zb"], bubble_meter=k,
                                    max_running_requests=bs)) for k in (False, True)}
        ps = prompts(engs[False], bs)
        for e in engs.values():
            e.generate(ps, max_new_tokens=16, ignore_eos=True)
        m, eager = engs[True].meter, [0]
        stamp = m.stamp

        def counting(code):
            eager[0] += 1
            stamp(code)
        m.stamp = counting
        s0 = m.step
        engs[True].generate(ps, max_new_tokens=64, ignore_eos=True)
        per_step = eager[0] / max(1, m.step - s0)
        del m.stamp
        rates = {k: [] for k in engs}
        with gc_off():
            for i in range(reps):
                for k in ((False, True) if i % 2 == 0 else (True, False)):
                    engs[k].generate(ps, max_new_tokens=384, ignore_eos=True)
                    rates[k].append(engs[k].stats()["decode_tok_per_s"])
        ratio = np.array(rates[True]) / np.array(rates[False])
        q1, q3 = np.percentile(1 - ratio, [25, 75]) * 100
        ov = 100 * (1 - float(np.median(ratio)))
        rows.append(f"| {bs} | {statistics.median(rates[False]):.0f} | "
                    f"{statistics.median(rates[True]):.0f} | {per_step:.1f} | {ov:.2f}% "
                    f"[{q1:.1f}, {q3:.1f}] | ≤ 1% | {verdict(ov <= 1.0)} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the markdown here too")
    ap.add_argument("--only", nargs="+", default=None,
                    choices=["resolution", "planted", "profiler", "overhead"])
    ap.add_argument("--overhead-reps", type=int, default=21,
                    help="interleaved on/off pairs of the overhead figure")
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_meter needs a CUDA device (the CPU path is tested in tests/test_meter.py).",
              file=sys.stderr)
        return 2
    want = set(a.only or ["resolution", "planted", "profiler", "overhead"])
    rows = ["### Bubble meter (benchmarks/bench_meter.py)"]
    if "resolution" in want:
        resolution(rows)
    if "planted" in want:
        for mode in OVERLAP:
            planted(rows, mode)
    if "profiler" in want:
        with tempfile.TemporaryDirectory() as d:
            vs_profiler(rows, Path(d))
    if "overhead" in want:
        overhead(rows, a.overhead_reps)
    emit("\n".join(rows), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
