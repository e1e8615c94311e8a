"""Can the instruments be trusted, and what do they cost? (GPU)

1. stages: does the event timeline agree with the profiler per stage? A profiled
   frozen_kv_mtp run (overlap + zero_bubble, CUDA graphs) per regime (REGIMES: host-bound
   tiny-code, the same with the stream backlogged, llama3-8b-like@4): every stage on its
   stream in the Kineto trace (gpu_user_annotation) and in the event timeline; per-stage GPU
   time from the timeline vs the profiler over the same steps (agreement: within 5% once the
   fixed cost of an event pair, measured apart by `pair_costs`, is taken off the timeline, or
   within the event timer's resolution). These runs compare two instruments on one engine run
   and are not timings, so they drive the engine here.
2. overhead: decode tok/s with the event timeline on (every step, every 32nd step) vs off,
   from sweep cells (mtplab.sweep: each cell times the workload with spans paused, then the
   same workload with spans on; repeats interleaved).
3. syncs: host syncs left per decode step, per loop mode (sweep cells with debug_syncs on).
4. timelines: bubble timelines (PNG) of overlap off vs on + zero_bubble for the same workload
   (sweep cells with the profiler on), and a small real trace for tests/data.

    python -m benchmarks.bench_profile --out-dir $OUT
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from mtplab import Engine, RunConfig
from mtplab.models.corpus import heldout_snippets
from mtplab.analysis.bubbles import analyze
from mtplab.analysis.plots import plot_timeline
from mtplab.analysis.trace_io import load_trace

from mtplab.studies.run_cells import sleep_cycles, sweep

BASE = dict(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True, context_len=1024)
MODES = {"off": dict(overlap=False), "on": dict(overlap=True),
         "on+zb": dict(overlap=True, zero_bubble=True)}


def prompts(eng, n, nbytes=256):
    return [eng.tokenizer.encode(t) for t in heldout_snippets(n, nbytes)]


STAGE_ORDER = ("resolve", "draft", "tree", "verify", "accept", "commit", "publish", "stash", "d2h")
RESOLUTION_US = 1.0
"""Two ends of cudaEventElapsedTime's resolution (CUDA runtime API docs)."""

# Regimes of the stage check. The two tools bracket different things:
#
#   host  ev0.record ─ launch k1 ──────── launch k2 ─ ev1.record
#   GPU   [ev0]··wait··dispatch[ k1 ]··wait··[ k2 ][ev1]
#         |<────────── event pair (timeline) ─────────>|
#                          |<─ gpu_user_annotation ─>|      (Kineto: kernels only)
#
# The pair also holds the stream's dispatch of the stage's first command (a fixed cost per
# pair, measured by `pair_costs`) and, when the host is behind, the waits for its launches.
# With the stream backlogged (host ahead of the GPU) only the fixed cost is left.
REGIMES = {                                                    # the backlogged one runs first
    "tiny-backlogged": dict(cfg=dict(BASE), backlog=True),     # the instrument alone
    "tiny": dict(cfg=dict(BASE), backlog=False),               # host-bound: launch waits show
    "8b-like": dict(cfg=dict(model="llama3-8b-like", layers=4, draft="frozen_kv_mtp",
                             fold_seed=True, simulate_accept_len=3.0, context_len=1024),
                    backlog=False),                            # GPU-heavier, as it comes
}


def stage_agreement(tl, tr, lo: int, hi: int, stages=STAGE_ORDER,
                    offsets: Optional[dict] = None) -> list[dict]:
    """Per-stage GPU time per occurrence over engine steps [lo, hi): event timeline (gpu_end -
    gpu_start of the stage's device-stream rows) vs profiler (the stage's gpu_user_annotation
    durations; the trace holds exactly those steps). `delta_us` = timeline - profiler;
    `agrees`: after taking the pair's fixed cost `offsets[stage]` (µs, default 0) off the
    timeline, within 5% of the profiler or within RESOLUTION_US."""
    dev = tl[(tl["stream"] != "host") & (tl["step"] >= lo) & (tl["step"] < hi)]
    ann = tr.cat_mask("gpu_user_annotation")
    out = []
    for stage in stages:
        t = dev[dev["stage"] == stage]
        m = ann & tr.name_mask(lambda n, s=stage: n == s)
        n, n_tr = len(t), int(m.sum())
        t_us = float((t["gpu_end_us"] - t["gpu_start_us"]).sum()) / max(1, n)
        p_us = float(tr.dur[m].sum()) / max(1, n_tr)
        ratio = p_us / t_us if t_us else float("nan")
        err = abs(t_us - (offsets or {}).get(stage, 0.0) - p_us)
        out.append(dict(stage=stage, n=n, n_trace=n_tr, timeline_us=t_us, profiler_us=p_us,
                        delta_us=t_us - p_us, ratio=ratio,
                        agrees=bool(n and n == n_tr and err <= max(0.05 * p_us, RESOLUTION_US))))
    return out


def fit_stages(res: list[dict]) -> tuple[float, float, float]:
    """Least-squares line timeline_us = slope * profiler_us + intercept over the stages seen
    by both tools, and the largest residual (µs). With the stream backlogged the slope is 1
    and the intercept the event pair's fixed cost."""
    seen = [x for x in res if x["n"] and x["n_trace"]]
    if len(seen) < 2:
        raise ValueError("fewer than two stages in both the timeline and the trace: no fit.")
    p = np.array([x["profiler_us"] for x in seen])
    t = np.array([x["timeline_us"] for x in seen])
    slope, icpt = np.polyfit(p, t, 1)
    return float(slope), float(icpt), float(np.abs(t - slope * p - icpt).max())


def pair_costs(rows: list, n: int = 100) -> dict:
    """The fixed cost of an event pair, per kind of first command: on a backlogged stream (a
    GPU sleep ahead of the work), profiled pairs around one small kernel ("kernel") or one
    small D2H copy into pinned memory ("copy"), minus that command's CUPTI duration (medians);
    empty and unprofiled pairs for scale."""
    import torch
    x = torch.zeros(4096, device="cuda")
    host = torch.empty(16, pin_memory=True)
    ops = {"kernel": lambda: x.add_(1.0),
           "copy": lambda: host.copy_(x[:16], non_blocking=True)}
    for op in ops.values():                # kernels loaded before any timing
        op()
    cycles = sleep_cycles(100.0)
    side = torch.cuda.Stream()             # a side stream, as the engine's (not the legacy default)

    def pairs(op) -> list:
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
               for _ in range(n)]
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
            t0 = time.perf_counter()
            for a, b in evs:
                a.record()
                if op is not None:
                    op()
                b.record()
            host_s = time.perf_counter() - t0
        if host_s > 0.08:
            raise RuntimeError(f"the host took {host_s * 1e3:.0f} ms to queue {n} pairs, longer "
                               "than the GPU sleep: the stream was not backlogged; lower n.")
        torch.cuda.synchronize()
        return [a.elapsed_time(b) * 1e3 for a, b in evs]

    med = statistics.median
    costs, text = {}, [f"empty pair {med(pairs(None)):.2f} µs"]
    for kind, cat in (("kernel", "kernel"), ("copy", "gpu_memcpy")):
        plain = med(pairs(ops[kind]))
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "pairs.json"
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                profiled = med(pairs(ops[kind]))
            prof.export_chrome_trace(str(path))
            tr = load_trace(path)
            m = tr.cat_mask(cat) & tr.name_mask(lambda s: "spin" not in s and "sleep" not in s)
            cmd = float(np.median(tr.dur[m]))
        costs[kind] = profiled - cmd
        text.append(f"around one {kind} {plain:.2f} µs unprofiled, {profiled:.2f} µs profiled, "
                    f"the {kind}'s CUPTI duration {cmd:.2f} µs: "
                    f"fixed cost **{costs[kind]:.2f} µs**")
    rows += ["", f"Event pair on a backlogged stream ({n} pairs each, medians): "
             + "; ".join(text) + "."]
    return costs


def stage_check(d: Path, rows: list, regime: str, costs: dict) -> tuple[Path, float]:
    """Profile a frozen_kv_mtp run with the event timeline on; compare per-stage GPU times.
    `backlog`: a GPU sleep queued after every step holds the stream while the host queues
    the next step, so every stage's kernels wait in the stream (host latency hidden); its fit
    gives the engine's pair cost, costs["engine"], which the other regimes' columns use.
    Returns the trace and the fitted intercept."""
    import torch
    w, u, a = 6, 2, 8
    r = REGIMES[regime]
    eng = Engine(RunConfig(**r["cfg"], **MODES["on+zb"], profile=True, event_timeline=True,
                           profile_wait=w, profile_warmup=u, profile_active=a,
                           trace_dir=str(d), run_name=f"stages-{regime}", max_running_requests=8))
    if r["backlog"]:
        cycles = sleep_cycles(10.0)

        def hold(_step):         # on the stream the step's work runs on (a new one per generate)
            with torch.cuda.stream(eng.scheduler.forward_stream):
                torch.cuda._sleep(cycles)
        eng.profiler.hooks.append(hold)
    eng.generate(prompts(eng, 8, nbytes=256 if regime != "8b-like" else 128),
                 max_new_tokens=96, ignore_eos=True)
    files = eng.finish()
    tr = load_trace(files["trace0"])
    tl = eng.timeline_frame()
    slope, icpt, resid = fit_stages(stage_agreement(tl, tr, w + u, w + u + a))
    pair = icpt if r["backlog"] else costs.get("engine", icpt)
    res = stage_agreement(tl, tr, w + u, w + u + a, offsets=dict.fromkeys(STAGE_ORDER, pair))
    ok = abs(slope - 1) <= 0.05 and all(x["agrees"] for x in res)
    rows += ["", f"Stage GPU time, {regime} ({r['cfg']['model']}, bs 8, overlap + zero_bubble, "
             f"{a} profiled steps), µs per occurrence. Fit over the stages: timeline = "
             f"{slope:.4f} × profiler + {icpt:.2f} µs (largest residual {resid:.2f} µs; the "
             f"pair's cost in isolation: {costs['kernel']:.2f} µs before a kernel, "
             f"{costs['copy']:.2f} µs before a copy). agrees: |Δ - {pair:.2f}| within 5% of the "
             f"profiler or {RESOLUTION_US} µs. **{'Agree' if ok else 'Do not agree'}** "
             "(slope within 5% of 1 and every stage agrees).", "",
             "| stage | n (timeline / trace) | timeline µs | profiler µs | Δ µs | "
             "profiler/timeline | agrees |", "|---|---|---|---|---|---|---|"]
    rows += [f"| {x['stage']} | {x['n']} / {x['n_trace']} | {x['timeline_us']:.1f} | "
             f"{x['profiler_us']:.1f} | {x['delta_us']:+.1f} | {x['ratio']:.3f} | "
             f"{'yes' if x['agrees'] else 'no'} |" for x in res]
    return files["trace0"], icpt


def workload(bs: int, new_tokens: int) -> dict:
    return dict(batch_size=bs, prompts="code", prompt_len_tokens=256,
                output_len_tokens=new_tokens, warmup_output_len_tokens=16)


def overhead(d: Path, rows: list, reps: int = 5, every: int = 32) -> None:
    """Decode tok/s with the event timeline on every step and on every `every`-th step, each
    against the same cell's timed generate (spans paused: the timeline off)."""
    df = sweep({"base": {**BASE, **MODES["on+zb"], **workload(8, 256)},
                "grid": {"repeat": list(range(reps))},
                "arms": [{"event_timeline_every": 1}, {"event_timeline_every": every}]},
               d / "overhead")
    rows += ["", f"Event timeline overhead (bs 8, frozen, overlap + zero_bubble, decode tok/s, "
             f"median of {reps} interleaved cells, each timing the workload with spans paused "
             "then on):", "", "| timeline | tok/s off | tok/s on | overhead |", "|---|---|---|---|"]
    for k, g in df.groupby("s.event_timeline_every", sort=False):
        off = statistics.median(g["decode_tok_per_s"])
        on = statistics.median(g["timeline_decode_tok_per_s"])
        name = "every step" if k == 1 else f"every {k} steps"
        rows.append(f"| {name} | {off:.0f} | {on:.0f} | {100 * (off - on) / off:.2f}% |")


def syncs(d: Path, rows: list) -> None:
    rows += ["", "| draft | loop | host syncs per decode step (call site: count/step) |",
             "|---|---|---|"]
    arms = [dict(draft="none", **kw) for kw in MODES.values()] + \
        [dict(draft="frozen_kv_mtp", fold_seed=True, **kw) for kw in MODES.values()]
    df = sweep({"base": {**BASE, "fold_seed": False, "debug_syncs": True,
                         "event_timeline": False, **workload(4, 64)}, "arms": arms},
               d / "syncs")
    for mode, arm, row in zip(list(MODES) * 2, arms, df.to_dict("records")):
        per = json.loads(row["listed_syncs_json"])
        n = max(1, row["decode_steps"])
        txt = ", ".join(f"`{k.split(' ', 1)[1]}`: {v / n:.2f}" for k, v in sorted(per.items())) \
            or "none flagged"
        rows.append(f"| {arm['draft']} | {mode} | {txt} |")


def timelines(d: Path, out: Path, rows: list) -> None:
    rows += ["", "| loop | bubble % (profiled decode steps) | steps |", "|---|---|---|"]
    df = sweep({"base": {**BASE, "profile": True, "profile_wait": 1, "profile_warmup": 2,
                         "profile_active": 6, **workload(1, 64)},
                "arms": [MODES["off"], MODES["on+zb"]]}, d / "timelines")
    for mode, row in zip(("off", "on+zb"), df.itertuples()):
        png = out / f"timeline_overlap_{mode.replace('+', '_')}.png"
        plot_timeline(row.trace_path, analyze(row.trace_path), path=png)
        rows.append(f"| {mode} | {100 * row.bubble_frac:.1f} | {row.bubble_steps} |")


def small_trace(d: Path, out: Path) -> None:
    df = sweep({"base": {**BASE, **MODES["on+zb"], "profile": True, "profile_wait": 1,
                         "profile_warmup": 1, "profile_active": 3, **workload(2, 48)}},
               d / "trace")
    shutil.copy(df.iloc[0]["trace_path"], out / "gpu_frozen_overlap.pt.trace.json.gz")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--only", nargs="+", default=None,
                    choices=["stages", "overhead", "syncs", "timelines", "trace"])
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    a = ap.parse_args(argv)
    want = set(a.only or ["stages", "overhead", "syncs", "timelines", "trace"])
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list = []
    with tempfile.TemporaryDirectory() as d:
        if "stages" in want:
            costs = pair_costs(rows)
            for regime in sorted(a.regimes, key=lambda g: not REGIMES[g]["backlog"]):
                trace, icpt = stage_check(Path(d), rows, regime, costs)
                if REGIMES[regime]["backlog"]:
                    costs["engine"] = icpt
                if regime == "tiny":
                    plot_timeline(trace, analyze(trace), path=out / "timeline_frozen_zb.png")
        if "overhead" in want:
            overhead(Path(d), rows)
        if "syncs" in want:
            syncs(Path(d), rows)
        if "timelines" in want:
            timelines(Path(d), out, rows)
        if "trace" in want:
            small_trace(Path(d), out)
    text = "\n".join(rows)
    print(text)
    (out / "bench_profile.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
