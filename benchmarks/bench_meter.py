"""Bubble meter validation on the GPU (docs/benchmarks.md "Bubble meter"). Every figure is
printed with PASS/MISS against its target where it has one.

1. Stamp resolution: back-to-back stamp kernels on a backlogged stream; min nonzero / median
   delta between consecutive %globaltimer reads (stated, no target). Wake-up latency: how
   much later than the host's launch a kernel or a graph replay starts after the host was
   idle for d (real idle the meter counts as bubble; stated, no target). Host wake: how much
   longer pure Python, six launches, and six launches + sync take right after a sleep or a
   busy-wait of d (stated, no target; it explains the planted rows' excess over d).
2. Stamp device cost: every segment graph of a decode step replayed back to back, captured
   with and without the meter's stamps -> device µs per step the stamps add (stated).
3. Planted host delays: a sleep of d in {0.2, 1, 5} ms (its last 100 µs spun, so exact) in
   a per-step hook (Engine.on_step), arms interleaved with d = 0; the host's own step
   period (host clock) is read beside it, so a host that slows after being away shows apart.
   host-bound (tiny-code frozen, bs 1), overlap off: the meter's median bubble per decode
   step must rise by d within 5% (or 10 µs); overlap on + zero_bubble: the rise and how much
   of d is hidden (no target). gpu-bound (llama3-8b-like@16 target-only, bs 8, the GPU's step
   longer than the host's): the same two modes, where overlap has queued work to hide d behind.
4. Meter vs profiler in one profiled run: GPU-backlogged (a GPU sleep queued after every
   step, bracketed by meter stamps so both tools count it busy) -> bubble fractions within
   2 points; host-bound (no sleep) -> both, and profiler - meter = idle inside stages the
   meter cannot see (no target).
5. Overhead: decode tok/s meter on vs off, 128-token generates in interleaved repeats for
   420 s per batch size, three engines per arm built interleaved, tiny-code bs 1 and bs 32
   (target <= 1%): the median of the per-repeat ratios with its bootstrap 95% interval, the
   pooled ratio (all tokens / all decode time of each arm), each arm's engine spread, and
   with --split a third arm with unstamped graphs that splits the cost.
6. Split: the meter's cost outside its graphs, by part (unstamped graphs, then the d2h
   kernel unstamped too) against two meter-off engines (stated, no target).

    python -m benchmarks.bench_meter --out $OUT/bench_meter.md
    python -m benchmarks.bench_meter --pool run1.npz run2.npz    # saved --raw runs, pooled
"""
from __future__ import annotations

import argparse
import gc
from collections import Counter
import statistics
from statistics import harmonic_mean as hmean
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks.common import emit, sleep_cycles
from mtplab import Engine, RunConfig
from mtplab.atomic import atomic_path
from mtplab.nogc import gc_paused
from mtplab.models.corpus import heldout_snippets

BASE = dict(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True, context_len=1024)
OVERLAP = {"off": dict(overlap=False), "on+zb": dict(overlap=True, zero_bubble=True)}
DELAYS_MS = (0.2, 1.0, 5.0)
# planted-delay regimes: (config, batch size, decode tokens per generate)
REGIMES = {
    "host-bound": (BASE, 1, 192),
    "gpu-bound": (dict(model="llama3-8b-like@16", draft="none", context_len=1024), 8, 64),
}


def prompts(eng, n, nbytes=256):
    return [eng.tokenizer.encode(t) for t in heldout_snippets(n, nbytes)]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def spin_us(us: float, since_ns: int | None = None) -> None:
    """Busy-wait until `us` after `since_ns` (perf_counter_ns; None: now): the planted host
    time is exact (a sleep overshoots by the timer slack)."""
    t = time.perf_counter_ns() if since_ns is None else since_ns
    while time.perf_counter_ns() - t < us * 1e3:
        pass


SLACK_US = 100.0     # a sleep's overshoot this machine's timer slack allows (spun instead)


def sleep_us(us: float) -> None:
    """The planted delay: sleep (the CPU is given up, as a real per-step hook's wait does),
    the last SLACK_US spun so that the planted time is d, not d plus the timer's overshoot."""
    t = time.perf_counter_ns()
    if us > SLACK_US:
        time.sleep((us - SLACK_US) * 1e-6)
    spin_us(us, t)


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
    wake_latency(rows, m, code)


def wake_latency(rows: list, m, code: int, reps: int = 40) -> None:
    """Stamp A, host busy-waits d, then stamp B (a kernel, or a replay of a graph holding one
    stamp): the device gap B - A minus the host gap = how much later than its launch B
    starts after d of idle. Its rise with d is real GPU idle a planted delay adds beyond d."""
    import torch
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        m.device_stamp(code)
    torch.cuda.synchronize()
    ds = (0.0, 0.2, 1.0, 5.0)
    rows += ["", f"Wake-up latency: device gap minus host gap between two stamps launched "
             f"d apart, GPU idle in between (median [p10, p90] over {reps}, interleaved):", "",
             "| second stamp | " + " | ".join(f"d = {d:g} ms" for d in ds) + " |",
             "|---" * (len(ds) + 1) + "|"]
    for kind in ("kernel", "graph replay"):
        extra = {d: [] for d in ds}
        for _ in range(reps):
            for d in ds:
                torch.cuda.synchronize()
                n0 = int(m.count[0])
                m.device_stamp(code)
                ta = time.perf_counter_ns()
                spin_us(d * 1e3)
                tb = time.perf_counter_ns()
                if kind == "kernel":
                    m.device_stamp(code)
                else:
                    g.replay()
                torch.cuda.synchronize()
                r = m.ring.cpu().numpy()
                gap = r[(n0 + 1) & (m.capacity - 1), 1] - r[n0 & (m.capacity - 1), 1]
                extra[d].append((gap - (tb - ta)) / 1e3)
        rows.append(f"| {kind} | " + " | ".join(
            f"{np.median(v):.1f} [{np.percentile(v, 10):.0f}, {np.percentile(v, 90):.0f}] µs"
            for v in extra.values()) + " |")


def host_wake(rows: list, reps: int = 150, device: str = "cuda") -> None:
    """How much slower is the host's next piece of work after it was away for d (the planted
    hook's sleep, or a busy-wait)? Works, each timed on the host right after the wait, the
    d arms interleaved: `python` walks 15k of 150k small dicts (no CUDA call, about the
    engine's host step in length), `launch x6` issues six small tensor ops on `device`
    without waiting, `launch x6 + sync` then synchronizes. The rise over d = 0 is host time
    a planted delay adds to the next step beyond d (no target; explains the planted rows)."""
    import torch
    objs = [{"a": i, "b": str(i)} for i in range(150_000)]
    x = torch.ones(256, device=device)

    def python():
        s = 0
        for o in objs[::10]:
            s += o["a"]

    def launch():
        y = x
        for _ in range(6):
            y = y + 1

    def launch_sync():
        launch()
        if x.is_cuda:
            torch.cuda.synchronize()
    ds = (0.0, *DELAYS_MS)
    rows += ["", f"Host work right after a wait of d (median µs over {reps}, the d arms "
             "interleaved, GC off; + the rise over d = 0):", "",
             "| work | wait | " + " | ".join(f"d = {d:g} ms" for d in ds) + " |",
             "|---|---" + "|---" * len(ds) + "|"]
    with gc_off():
        for name, work in (("python", python), ("launch x6", launch),
                           ("launch x6 + sync", launch_sync)):
            for _ in range(20):
                work()
            launch_sync()
            for wait_name, wait in (("sleep", sleep_us), ("spin", spin_us)):
                took = {d: [] for d in ds}
                for _ in range(reps):
                    for d in ds:
                        wait(d * 1e3)
                        t = time.perf_counter_ns()
                        work()
                        took[d].append((time.perf_counter_ns() - t) / 1e3)
                    launch_sync()                   # a launch arm's queue drained per repeat
                base = float(np.median(took[0.0]))
                rows.append(f"| {name} | {wait_name} | {base:.1f} | " + " | ".join(
                    f"{np.median(took[d]):.1f} ({np.median(took[d]) - base:+.1f})"
                    for d in ds[1:]) + " |")


def stamp_cost(rows: list, reps: int = 300) -> None:
    """Device time of each segment graph of a frozen decode step, captured with and without
    the meter's stamps, replayed back to back behind a GPU sleep (device time only)."""
    import torch
    rows += ["", f"Stamp device cost (tiny-code frozen, fold_seed, overlap + zero_bubble; each "
             f"segment graph replayed {reps}x back to back, µs per replay; stamps in the "
             f"graph):", "",
             "| bs | graph | stamps (nodes) | meter off µs | meter on µs | added µs |",
             "|---|---|---|---|---|---|"]
    from mtplab.instrument.meter import BubbleMeter
    for bs in (1, 32):
        per: dict = {}
        for on in (False, True):
            nodes: Counter = Counter()          # stamp nodes captured, by code
            real = BubbleMeter.device_stamp
            BubbleMeter.device_stamp = lambda self, code: (nodes.update([code]),
                                                           real(self, code))[1]
            try:
                eng = Engine(RunConfig(**BASE, **OVERLAP["on+zb"], bubble_meter=on,
                                       max_running_requests=bs))
            finally:
                BubbleMeter.device_stamp = real
            eng.generate(prompts(eng, bs), max_new_tokens=16, ignore_eos=True)
            for name, r in eng.worker.graphs.items():
                g = r.graphs[r.bucket(bs)][0]
                for _ in range(3):
                    g.replay()
                a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                torch.cuda._sleep(20_000_000)
                a.record()
                for _ in range(reps):
                    g.replay()
                b.record()
                b.synchronize()
                per.setdefault(name, {})[on] = (a.elapsed_time(b) / reps * 1e3, len(r.stamps),
                                                sum(nodes[c] for c in set(r.stamps))
                                                // len(r.graphs))
            del eng           # (replays by hand are outside the meter's log: never collected)
        for name, v in per.items():
            rows.append(f"| {bs} | {name} | {v[True][1]} ({v[True][2]}) | {v[False][0]:.1f} | "
                        f"{v[True][0]:.1f} | {v[True][0] - v[False][0]:+.1f} |")
        off, on = (sum(v[k][0] for v in per.values()) for k in (False, True))
        n, k = (sum(v[True][i] for v in per.values()) for i in (1, 2))
        rows.append(f"| {bs} | **all ({len(per)})** | {n} ({k}) | {off:.1f} | {on:.1f} | "
                    f"**{on - off:+.1f}** |")


@contextmanager
def gc_off():
    """No garbage collection pause inside the timed runs (collected once before)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _decode_bubble(eng, first: int) -> tuple[float, float]:
    """(median bubble, median wall) µs per decode step since meter step `first`."""
    df = eng.meter_frame()
    df = df[(df["step"] >= first) & df["name"].str.startswith("step[decode")].iloc[1:]
    return float(df["bubble_us"].median()), float(df["wall_us"].median())  # (after prefill)


def planted(rows: list, regime: str, mode: str, reps: int = 15) -> None:
    """Each delayed generate is paired with a d = 0 generate right before it (the machine's
    drift cancels in the pair); rise = median over the pairs of the difference of their
    median bubbles per decode step. GC is off while timing (both arms alike). The hook also
    reads the host clock at every step: the host's step period (hook to hook, the delay
    included) rises by d plus whatever the host itself slows by after being away for d; the
    meter's rise is compared with both."""
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
    with gc_off():
        for _ in range(reps):
            for d in DELAYS_MS:
                b0, w0, p0 = bubble(0.0)
                base.append(b0)
                walls.append(w0)
                b, _, p = bubble(d)
                rise[d].append(b - b0)
                host[d].append(p - p0)
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
            tol = max(0.05 * want, 10.0)
            h1, h3 = np.percentile(host[d], [25, 75])
            diff = float(np.median(np.subtract(rise[d], host[d])))
            rows.append(f"| {want:.0f} | {r:.1f} [{q1:.0f}, {q3:.0f}] | {r - want:+.1f} µs | "
                        f"±{tol:.0f} µs | {verdict(abs(r - want) <= tol)} | {h:.1f} [{h1:.0f}, "
                        f"{h3:.0f}] | {h - want:+.1f} µs | {diff:+.1f} µs |")
        else:
            rows.append(f"| {want:.0f} | {r:.1f} [{q1:.0f}, {q3:.0f}] | {want - r:.1f} | "
                        f"{100 * (want - r) / want:.1f}% | {h:.1f} |")


def _same_steps(eng, steps, w: int, u: int):
    """The meter's rows of the analyser's profiled `steps` (whose count starts at the
    profiler's window, w + u engine steps in), and a note when their names disagree."""
    mf = eng.meter_frame()
    mf = mf[mf["step"].isin(steps["step"] + w + u)]
    same = list(mf["name"]) == list(steps["name"])
    return mf, "" if same else " (step names differ: windows misaligned)"


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
            eng.on_step(hold)
        eng.generate(prompts(eng, 8), max_new_tokens=96, ignore_eos=True)
        files = eng.finish()
        res = analyze(files["trace0"], skip_steps=1)
        sel, note = _same_steps(eng, res.steps, w, u)
        meter = float(sel["bubble_us"].sum() / sel["wall_us"].sum())
        prof = float(res.summary["bubble_frac"])
        diff = 100 * (prof - meter)
        tgt = "≤ 2 points" if regime == "backlogged" else "(idle inside stages)"
        ok = verdict(abs(diff) <= 2.0) if regime == "backlogged" else "-"
        rows.append(f"| {regime} | {100 * meter:.1f} | {100 * prof:.1f} | {diff:+.1f} | {tgt} | "
                    f"{ok}{note} |")


def planted_vs_profiler(rows: list, d: Path) -> None:
    """The host-bound planted delays once more, each d in its own profiled run: the meter's
    and the profiler's median bubble per decode step over the same profiled steps, so what
    the meter reads beyond d (wake-up after idle, or the meter) is checked by an independent
    clock."""
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
    rows += ["", f"Planted host delay vs the profiler (host-bound, overlap off; one profiled "
             f"run per d, {a} profiled steps; median bubble per decode step of each tool over "
             "the same steps, both under the profiler's host cost):", "",
             "| d µs | meter µs/step | profiler µs/step | meter - profiler µs | steps |",
             "|---|---|---|---|---|"]
    for ms in (0.0,) + DELAYS_MS:
        m, p, n = med[ms]
        rows.append(f"| {ms * 1e3:.0f} | {m:.1f} | {p:.1f} | {m - p:+.1f} | {n} |")


@contextmanager
def unstamped_graphs():
    """Engines built inside capture their segment graphs without the meter's stamps; the rest
    of the meter (step spans, the d2h kernel's stamps, prefill's eager stamps) stays on. The
    overhead arm built so isolates what the graphs' stamps cost (their device time plus the
    replay's log entry)."""
    from mtplab.graphs import runner
    init = runner.GraphRunner.__init__

    def plain(self, *a, **k):
        init(self, *a, **{**k, "meter": None})
    runner.GraphRunner.__init__ = plain
    try:
        yield
    finally:
        runner.GraphRunner.__init__ = init


def _engine(bs: int, meter: bool, graph_stamps: bool = True):
    """An overhead arm's engine (tiny-code frozen, overlap + zero_bubble, bs requests); with
    the meter on, `graph_stamps=False` captures its graphs without the meter's stamps."""
    cfg = RunConfig(**BASE, **OVERLAP["on+zb"], bubble_meter=meter, max_running_requests=bs)
    if graph_stamps:
        return Engine(cfg)
    with unstamped_graphs():
        return Engine(cfg)


def _rotate(engs: dict, ps, reps: int, tokens: int,
            seconds: float | None = None) -> tuple[dict, dict]:
    """Every engine generates `tokens` per prompt once per repeat, the order rotating each
    repeat, GC off -> (decode tok/s, median decode step ms) per engine, arrays over repeats.
    `seconds`: no repeat after the first starts after this long (the repeats done are
    returned)."""
    names = list(engs)
    rates = {n: [] for n in names}
    p50 = {n: [] for n in names}
    t0 = time.perf_counter()
    with gc_off():
        for i in range(reps):
            if i and seconds is not None and time.perf_counter() - t0 > seconds:
                break
            k = i % len(names)
            for n in names[k:] + names[:k]:
                engs[n].generate(ps, max_new_tokens=tokens, ignore_eos=True)
                st = engs[n].stats()
                rates[n].append(st["decode_tok_per_s"])
                p50[n].append(st["decode_step_p50_ms"])
    return ({n: np.array(v) for n, v in rates.items()},
            {n: np.array(v) for n, v in p50.items()})


def _overhead_ci(ratio: np.ndarray, rng) -> tuple[float, float, float]:
    """1 - median of per-repeat on/off ratios, % -> (overhead, bootstrap 95% interval)."""
    n = ratio.size
    boots = np.median(ratio[rng.integers(0, n, (4000, n))], axis=1)
    lo, hi = (1 - np.percentile(boots, [97.5, 2.5])) * 100
    return 100 * (1 - float(np.median(ratio))), float(lo), float(hi)


def _arm_rate(r: dict, arm: str, k: int) -> np.ndarray:
    """An arm's figure per repeat: the geometric mean over its k engines."""
    return np.exp(np.mean([np.log(r[f"{arm} {i}"]) for i in range(k)], axis=0))


def _spread(r: dict, arm: str, k: int) -> float:
    """The arm's engine spread, %: (largest - smallest) / median of its engines' medians."""
    med = [float(np.median(r[f"{arm} {i}"])) for i in range(k)]
    return 100 * (max(med) - min(med)) / float(np.median(med))


# Student's t, 97.5th percentile, by degrees of freedom (1..30); beyond 30, 2.0
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def _over_engines(runs: list, k: int) -> str:
    """The overhead with the engines as the sample: in each run (a dict of its engines'
    rates per repeat; a run's engines are its own), each engine's mean log rate relative to
    its repeat's mean over the on and off engines (the machine's drift cancels), then
    1 - exp(mean on - mean off) over the engines of all runs, with a t interval. Unlike the
    per-repeat interval, this counts how far one engine's own speed sits from another's."""
    n = k * len(runs)                                       # engines per arm
    if n < 2:
        return "- (1 engine per arm)"
    on, off = [], []
    for r in runs:
        logs = np.log(np.array([r[f"{a} {i}"] for a in ("on", "off") for i in range(k)]))
        rel = (logs - logs.mean(axis=0)).mean(axis=1)       # per engine, drift removed
        on += list(rel[:k])
        off += list(rel[k:])
    on, off = np.array(on), np.array(off)
    d = float(on.mean() - off.mean())
    se = float(np.sqrt(on.var(ddof=1) / n + off.var(ddof=1) / n))
    t = _T975[2 * n - 3] if 2 * n - 2 <= len(_T975) else 2.0
    ov = [100 * (1 - np.exp(x)) for x in (d, d + t * se, d - t * se)]
    return f"{ov[0]:.2f}% [{ov[1]:.2f}, {ov[2]:.2f}]"


OVERHEAD_HEADER = ["| bs | meter off (median tok/s) | meter on (median tok/s) | eager stamps / "
                   "step | overhead [95% CI] | pooled | from median step time [95% CI] | "
                   "engine spread off, on | over engines [95% CI] | of which graph stamps / "
                   "rest | target | verdict |",
                   "|---|---|---|---|---|---|---|---|---|---|---|---|"]
OVERHEAD_ARMS = ("off", "on", "unstamped")      # "unstamped" only with --split


def overhead_row(bs: int, r: dict, p50: dict, per_arm: int, per_step: float | None,
                 runs: list | None = None) -> str:
    """The overhead table's row from every engine's decode tok/s (`r`) and median decode
    step ms (`p50`) per repeat, keyed "<arm> <i>" (the arms of OVERHEAD_ARMS; without the
    "unstamped" ones the split cell reads "-"); `per_step` eager stamps per step (None: not
    counted); `runs`: for a pool, each saved run's own `r` (its engines are other engines
    than another run's; the over-engines cell keeps them apart)."""
    k, rng = per_arm, np.random.default_rng(0)
    arms = [a for a in OVERHEAD_ARMS if f"{a} 0" in r]
    rate = {a: _arm_rate(r, a, k) for a in arms}
    step = {a: _arm_rate(p50, a, k) for a in arms}

    def ov(x, y):
        return 100 * (1 - float(np.median(rate[x] / rate[y])))
    total, lo, hi = _overhead_ci(rate["on"] / rate["off"], rng)
    # the same ratio from each generate's median step time (every arm decodes the same
    # tokens in the same steps): a host stall in a few steps moves the mean, not this
    step_ov, slo, shi = _overhead_ci(step["off"] / step["on"], rng)
    # every generate decodes the same tokens: the pooled rate is the harmonic mean
    pooled = 100 * (1 - hmean(np.concatenate([r[f"on {i}"] for i in range(k)]))
                    / hmean(np.concatenate([r[f"off {i}"] for i in range(k)])))
    split_cell = (f"{ov('on', 'unstamped'):.2f}% / {ov('unstamped', 'off'):.2f}%"
                  if "unstamped" in arms else "-")
    return (f"| {bs} | {np.median(rate['off']):.0f} | {np.median(rate['on']):.0f} | "
            f"{'-' if per_step is None else f'{per_step:.1f}'} | "
            f"{total:.2f}% [{lo:.2f}, {hi:.2f}] | {pooled:.2f}% | "
            f"{step_ov:.2f}% [{slo:.2f}, {shi:.2f}] | "
            f"{_spread(r, 'off', k):.2f}%, {_spread(r, 'on', k):.2f}% | "
            f"{_over_engines(runs or [r], k)} | {split_cell} | "
            f"≤ 1% | {verdict(total <= 1.0)} |")


def overhead(rows: list, reps: int = 5000, tokens: int = 128, raw: str | None = None,
             sizes: tuple = (1, 32), per_arm: int = 3, split_arm: bool = False,
             seconds: float | None = 420.0) -> None:
    """Decode tok/s meter on vs off, interleaved (the order rotates every repeat). An engine's
    own state (its graphs, their memory, its place in the build order) can move its tok/s by
    as much as the meter, so each arm has `per_arm` engines, built interleaved (off 0, on 0,
    unstamped 0, off 1, ...), and an arm's rate per repeat is the geometric mean of its
    engines; the engine spread per arm is reported beside it. The verdict reads the median
    of the per-repeat on/off ratios (paired: neighbouring runs share the machine's state,
    and the machine's speed drifts by several % within a second, so short generates and
    two arms keep a pair close in time), with a bootstrap 95% interval; the pooled ratio is
    all decode tokens over all decode time of each arm. `split_arm` adds a third arm, the
    meter on with unstamped graphs, which splits the overhead into the graphs' stamps (on
    vs unstamped) and the rest of the meter (unstamped vs off). `seconds`: per batch size,
    no repeat after the first starts after this long (None: `reps` of them). `raw`: an .npz
    path for every engine's decode tok/s and median step time per repeat, the eager stamps
    per step and the tokens per generate (repeat i starts the rotation at engine i mod the
    engine count, in build order); `--pool` reads such files back."""
    k = per_arm
    arms = OVERHEAD_ARMS if split_arm else OVERHEAD_ARMS[:2]
    count = (f"{reps} interleaved repeats" if seconds is None else
             f"interleaved repeats for {seconds:.0f} s (at most {reps})")
    rows += ["", f"Meter overhead (tiny-code frozen, fold_seed, overlap + zero_bubble, decode "
             f"tok/s of {tokens}-token generates, {count} per batch size, GC off, "
             f"{k} engines per arm built interleaved, an arm's rate = the geometric mean of "
             "its engines; overhead = 1 - median of the per-repeat on/off ratios [bootstrap "
             "95% interval]; pooled = 1 - ratio of the arms' total decode tok/s; from median "
             "step time = the same from each generate's median decode step time; engine "
             "spread = (largest - smallest) / median of one arm's engine medians; over "
             "engines = the engines as the sample (each engine's mean log tok/s relative to "
             "its repeat's mean, a t interval over the engines of both arms); split: "
             + ("against the arm with the meter on but its graphs unstamped" if split_arm
                else "not run (add --split)")
             + "; eager stamp launches per step counted over a generate, prefill included):",
             "", *OVERHEAD_HEADER]
    names = [f"{arm} {i}" for i in range(k) for arm in arms]      # the build order
    saved, done = {}, []
    for bs in sizes:
        engs = {n: _engine(bs, meter=not n.startswith("off"),
                           graph_stamps=not n.startswith("unstamped")) for n in names}
        ps = prompts(engs["off 0"], bs)
        for e in engs.values():
            e.generate(ps, max_new_tokens=16, ignore_eos=True)
        m, eager = engs["on 0"].meter, [0]
        stamp = m.stamp

        def counting(code):
            eager[0] += 1
            stamp(code)
        m.stamp = counting
        s0 = m.step
        engs["on 0"].generate(ps, max_new_tokens=64, ignore_eos=True)
        per_step = eager[0] / max(1, m.step - s0)
        del m.stamp
        r, p50 = _rotate(engs, ps, reps, tokens, seconds)
        saved.update({f"bs{bs} {n}": v for n, v in r.items()})
        saved.update({f"bs{bs} {n} step_p50_ms": v for n, v in p50.items()})
        saved[f"bs{bs} eager_per_step"] = np.array(per_step)
        saved[f"bs{bs} tokens"] = np.array(tokens)
        if raw:                                  # after each bs: a later failure keeps it
            with atomic_path(raw) as tmp, open(tmp, "wb") as f:
                np.savez(f, **saved)
        rows.append(overhead_row(bs, r, p50, k, per_step))
        done.append(f"bs {bs}: {len(r['off 0'])}")
        del engs
    rows += ["", f"Repeats run: {', '.join(done)}."]


def pool(rows: list, paths: list) -> None:
    """The overhead rows of several saved runs (`--raw` files of this layout) pooled: each
    engine's repeats concatenated across the files, per batch size found in all of them.
    The files must agree in arms, engines per arm and tokens per generate."""
    runs = []
    for path in paths:
        try:
            runs.append(dict(np.load(path)))
        except (OSError, ValueError) as e:
            raise SystemExit(f"--pool {path}: cannot read it as a --raw .npz ({e}).") from None
    sizes = sorted({int(key.split()[0][2:]) for key in runs[0] if key.endswith(" off 0")})
    if not sizes or not all(f"bs{bs} off 0" in z and f"bs{bs} on 0" in z
                            for z in runs for bs in sizes):
        raise SystemExit("--pool: every file must be a --raw of the overhead part (keys "
                         "'bs<N> off 0', 'bs<N> on 0', ...), with the same batch sizes.")
    rows += ["", f"Meter overhead pooled over {len(paths)} saved runs ({', '.join(paths)}; each "
             "engine's repeats concatenated; columns as in the overhead part):", "",
             *OVERHEAD_HEADER]
    for bs in sizes:
        def layout(z):          # (arms, engines per arm, tokens per generate)
            arms = tuple(a for a in OVERHEAD_ARMS if f"bs{bs} {a} 0" in z)
            k = sum(1 for key in z if key.startswith(f"bs{bs} off ")
                    and not key.endswith("step_p50_ms"))
            return arms, k, int(z.get(f"bs{bs} tokens", 256))     # no key: saved at 256
        first = layout(runs[0])
        for path, z in zip(paths, runs):
            if layout(z) != first:
                raise SystemExit(
                    f"--pool: bs {bs}: {path} differs from {paths[0]} in its layout (arms, "
                    f"engines per arm, tokens per generate: {layout(z)} vs {first}); pool runs "
                    "of one --overhead-engines, --overhead-tokens and --split setting.")
        arms, k, _ = first
        keys = [f"{a} {i}" for a in arms for i in range(k)]
        own = [{key: z[f"bs{bs} {key}"] for key in keys} for z in runs]     # per run
        r = {key: np.concatenate([o[key] for o in own]) for key in keys}
        p50 = {key: np.concatenate([z[f"bs{bs} {key} step_p50_ms"] for z in runs])
               for key in keys}
        eager = [float(z[f"bs{bs} eager_per_step"]) for z in runs
                 if f"bs{bs} eager_per_step" in z]          # (runs saved before 2026-11-23)
        rows.append(overhead_row(bs, r, p50, k, float(np.mean(eager)) if eager else None, own))


def quiet_d2h(eng) -> None:
    """This engine's d2h copy kernel runs unstamped (its codes are not logged either): with
    `unstamped_graphs`, what is left of the meter is the step span, span lookups and
    prefill's eager stamps."""
    import mtplab.sched.d2h as d2h
    m, copy = eng.meter, d2h.stamped_copy_triton
    if not hasattr(d2h, "_quiet_rings"):
        d2h._quiet_rings = set()

        def stamped_copy(host, results, stamp=None):
            if stamp is not None and id(stamp[0]) in d2h._quiet_rings:
                stamp = None
            copy(host, results, stamp)
        d2h.stamped_copy_triton = stamped_copy
    d2h._quiet_rings.add(id(m.ring))
    codes, log = m.kernel_stamp("d2h", "copy").codes, m.log
    m.log = lambda c: None if c == codes else log(c)


def split(rows: list, reps: int = 101, tokens: int = 256) -> None:
    """The meter's cost outside its graphs, by parts: engines off a / off b (A/A), the meter
    on with unstamped graphs (U), and U with an unstamped d2h kernel too (UD); interleaved,
    the order rotating."""
    rows += ["", f"Meter cost outside the graphs (as the overhead part, {reps} repeats; U = meter "
             "on, graphs unstamped; UD = U with the d2h kernel unstamped; each 1 - median "
             "ratio):", "",
             "| bs | off tok/s | A/A off b vs a | U vs off | UD vs off | d2h stamps (U vs UD) |",
             "|---|---|---|---|---|---|"]
    names = ("off a", "off b", "U", "UD")
    for bs in (1, 32):
        engs = {n: _engine(bs, meter=n in ("U", "UD"), graph_stamps=False) for n in names}
        quiet_d2h(engs["UD"])
        ps = prompts(engs["off a"], bs)
        for e in engs.values():
            e.generate(ps, max_new_tokens=16, ignore_eos=True)
        r, _ = _rotate(engs, ps, reps, tokens)
        off = np.sqrt(r["off a"] * r["off b"])

        def ov(x, y):
            return f"{100 * (1 - float(np.median(x / y))):.2f}%"
        rows.append(f"| {bs} | {np.median(off):.0f} | {ov(r['off b'], r['off a'])} | "
                    f"{ov(r['U'], off)} | {ov(r['UD'], off)} | {ov(r['U'], r['UD'])} |")
        del engs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the markdown here too")
    parts = ["resolution", "host-wake", "cost", "planted", "planted-profiler", "profiler",
             "overhead", "split"]
    ap.add_argument("--only", nargs="+", default=None, choices=parts)
    ap.add_argument("--overhead-reps", type=int, default=5000,
                    help="overhead: at most this many interleaved repeats per batch size")
    ap.add_argument("--split-reps", type=int, default=101,
                    help="interleaved repeats of the split part")
    ap.add_argument("--planted-reps", type=int, default=15,
                    help="(d = 0, d) pairs per planted delay")
    ap.add_argument("--overhead-bs", type=int, nargs="+", default=[1, 32],
                    help="batch sizes of the overhead part")
    ap.add_argument("--overhead-engines", type=int, default=3,
                    help="engines per arm of the overhead part (built interleaved)")
    ap.add_argument("--overhead-tokens", type=int, default=128,
                    help="decode tokens per generate of the overhead part")
    ap.add_argument("--overhead-seconds", type=float, default=420.0,
                    help="overhead: per batch size, start no repeat after this many seconds")
    ap.add_argument("--split", action="store_true",
                    help="overhead: add a third arm, the meter on with unstamped graphs, "
                         "to split the cost into the graphs' stamps and the rest")
    ap.add_argument("--raw", default=None,
                    help="overhead: save every engine's tok/s per repeat to this .npz")
    ap.add_argument("--pin-cpus", type=int, default=0,
                    help="run on this many CPUs (the allowed set's second on), 0: as started")
    ap.add_argument("--pool", nargs="+", default=None, metavar="RAW",
                    help="print the overhead rows of these saved --raw runs pooled (no GPU)")
    a = ap.parse_args(argv)
    if a.pool:
        rows = ["### Bubble meter (benchmarks/bench_meter.py --pool)"]
        pool(rows, a.pool)
        emit("\n".join(rows), a.out)
        return 0
    if a.overhead_engines < 1:
        ap.error(f"--overhead-engines {a.overhead_engines}: an arm needs at least 1 engine.")
    if a.overhead_tokens < 16:
        ap.error(f"--overhead-tokens {a.overhead_tokens}: a generate needs at least 16 decode "
                 "tokens for a median step time.")
    if a.overhead_seconds is not None and a.overhead_seconds <= 0:
        ap.error(f"--overhead-seconds {a.overhead_seconds}: give a positive number of seconds.")
    if a.pin_cpus:
        import os
        cpus = sorted(os.sched_getaffinity(0))[1:1 + a.pin_cpus]
        os.sched_setaffinity(0, cpus)          # before CUDA starts its threads
        print(f"pinned to CPUs {cpus}", file=sys.stderr)
    import torch
    if not torch.cuda.is_available():
        print("bench_meter needs a CUDA device (the CPU path is tested in tests/test_meter.py).",
              file=sys.stderr)
        return 2
    want = set(a.only or parts)
    rows = ["### Bubble meter (benchmarks/bench_meter.py)"]
    if "resolution" in want:
        resolution(rows)
    if "host-wake" in want:
        host_wake(rows)
    if "cost" in want:
        stamp_cost(rows)
    if "planted" in want:
        for regime in REGIMES:
            for mode in OVERLAP:
                planted(rows, regime, mode, a.planted_reps)
    if "planted-profiler" in want:
        with tempfile.TemporaryDirectory() as d:
            planted_vs_profiler(rows, Path(d))
    if "profiler" in want:
        with tempfile.TemporaryDirectory() as d:
            vs_profiler(rows, Path(d))
    if "overhead" in want:
        overhead(rows, a.overhead_reps, a.overhead_tokens, raw=a.raw,
                 sizes=tuple(a.overhead_bs), per_arm=a.overhead_engines,
                 split_arm=a.split, seconds=a.overhead_seconds)
    if "split" in want:
        split(rows, a.split_reps)
    emit("\n".join(rows), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
