"""Instrumentation checks on the GPU (issues: Instrumentation, Overlap scheduler).

1. A profiled frozen_kv_mtp run (tiny-code, overlap + zero_bubble, CUDA graphs): every stage
   on its stream in the Kineto trace (gpu_user_annotation) and in the event timeline; per-stage
   GPU time from the timeline vs the profiler over the same steps (ratio; target within 5%).
2. The event timeline's overhead: decode tok/s with it off vs on, interleaved repeats.
3. Host syncs left per steady decode step, per loop mode (CUDA sync debug mode).
4. Bubble timelines (PNG) of overlap off vs on for the same workload, and a small real trace
   for tests/data.

    python -m benchmarks.bench_profile --out-dir $OUT
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from mtplab import Engine, RunConfig
from mtplab.models.corpus import code_snippets, is_heldout, list_files, stdlib_root
from mtplab.profiling.bubbles import analyze
from mtplab.profiling.plots import plot_timeline
from mtplab.profiling.trace_io import load_trace

BASE = dict(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True, context_len=1024)
MODES = {"off": dict(overlap=False), "on": dict(overlap=True),
         "on+zb": dict(overlap=True, zero_bubble=True)}


def prompts(eng, n, nbytes=256):
    root = stdlib_root()
    held = [f for f in list_files(root) if is_heldout(f)]
    texts = code_snippets(root, held, len(held), nbytes)
    return [eng.tokenizer.encode(texts[i % len(texts)]) for i in range(n)]


def stage_check(d: Path, rows: list) -> Path:
    w, u, a = 6, 2, 8
    eng = Engine(RunConfig(**BASE, **MODES["on+zb"], profile=True, event_timeline=True,
                           profile_wait=w, profile_warmup=u, profile_active=a,
                           trace_dir=str(d), run_name="stages", max_running_requests=8))
    ps = prompts(eng, 8)
    eng.generate(ps, max_new_tokens=96, ignore_eos=True)
    files = eng.finish()
    tl = eng.timeline_frame()
    tr = load_trace(files["trace0"])
    lo, hi = w + u, w + u + a
    dev = tl[(tl["stream"] != "host") & (tl["step"] >= lo) & (tl["step"] < hi)]
    gpu_ann = tr.cat_mask("gpu_user_annotation")
    rows += ["| stage | timeline µs (sum) | profiler µs (sum) | profiler/timeline | in trace | "
             "in timeline |", "|---|---|---|---|---|---|"]
    for stage in ("resolve", "draft", "tree", "verify", "accept", "commit", "publish", "stash",
                  "d2h"):
        t = dev[dev["stage"] == stage]
        t_us = float((t["gpu_end_us"] - t["gpu_start_us"]).sum())
        m = gpu_ann & tr.name_mask(lambda n, s=stage: n == s)
        p_us = float(tr.dur[m].sum())
        ratio = p_us / t_us if t_us else float("nan")
        rows.append(f"| {stage} | {t_us:.1f} | {p_us:.1f} | {ratio:.3f} | {bool(m.any())} | "
                    f"{len(t) > 0} |")
    return files["trace0"]


def overhead(rows: list, reps: int = 5, every: int = 32) -> None:
    """Decode tok/s with the event timeline off, on every step, and on every `every`-th step
    (three engines, interleaved repeats)."""
    arms = {"off": dict(event_timeline=False), "every step": dict(event_timeline=True),
            f"every {every}th step": dict(event_timeline=True, event_timeline_every=every)}
    rates = {k: [] for k in arms}
    engs = {k: Engine(RunConfig(**BASE, **MODES["on+zb"], **kw, max_running_requests=8))
            for k, kw in arms.items()}
    ps = prompts(engs["off"], 8)
    for e in engs.values():
        e.generate(ps, max_new_tokens=16, ignore_eos=True)
    for _ in range(reps):
        for k, e in engs.items():
            e.generate(ps, max_new_tokens=256, ignore_eos=True)
            rates[k].append(e.stats()["decode_tok_per_s"])
    off = statistics.median(rates["off"])
    rows += ["", f"Event timeline overhead (bs 8, frozen, overlap + zero_bubble, decode tok/s, "
             f"median of {reps} interleaved repeats):", "",
             "| timeline | tok/s (median) | overhead vs off |", "|---|---|---|"]
    for k, r in rates.items():
        m = statistics.median(r)
        rows.append(f"| {k} | {m:.0f} | {100 * (off - m) / off:.2f}% |")


def syncs(rows: list) -> None:
    rows += ["", "| draft | loop | host syncs per decode step (call site: count/step) |",
             "|---|---|---|"]
    for draft in ("none", "frozen_kv_mtp"):
        for mode, kw in MODES.items():
            cfg = dict(BASE, draft=draft) | ({} if draft != "none" else dict(fold_seed=False))
            eng = Engine(RunConfig(**cfg, **kw, debug_syncs=True, max_running_requests=4))
            ps = prompts(eng, 4)
            eng.generate(ps, max_new_tokens=64, ignore_eos=True)
            st = eng.stats()
            n = max(1, st["decode_steps"])
            per = {k: v / n for k, v in st["host_syncs"].items() if k.startswith("decode")}
            txt = ", ".join(f"`{k.split(' ', 1)[1]}`: {v:.2f}" for k, v in sorted(per.items())) \
                or "none flagged"
            rows.append(f"| {draft} | {mode} | {txt} |")


def timelines(d: Path, out: Path, rows: list) -> None:
    rows += ["", "| loop | bubble % (steady decode steps) | steps |", "|---|---|---|"]
    for mode in ("off", "on+zb"):
        eng = Engine(RunConfig(**BASE, **MODES[mode], profile=True, profile_wait=4,
                               profile_warmup=2, profile_active=6, trace_dir=str(d),
                               run_name=f"tl-{mode}", max_running_requests=1))
        ps = prompts(eng, 1)
        eng.generate(ps, max_new_tokens=64, ignore_eos=True)
        files = eng.finish()
        res = analyze(files["trace0"], skip_steps=1)
        png = out / f"timeline_overlap_{mode.replace('+', '_')}.png"
        plot_timeline(files["trace0"], res, path=png)
        rows.append(f"| {mode} | {100 * res.summary['bubble_frac']:.1f} | {res.summary['n_steps']} |")


def small_trace(d: Path, out: Path) -> None:
    eng = Engine(RunConfig(**BASE, **MODES["on+zb"], profile=True, profile_wait=3,
                           profile_warmup=1, profile_active=3, trace_dir=str(d),
                           run_name="small", max_running_requests=2))
    eng.generate(prompts(eng, 2), max_new_tokens=48, ignore_eos=True)
    shutil.copy(eng.finish()["trace0"], out / "gpu_frozen_overlap.pt.trace.json.gz")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--only", nargs="+", default=None,
                    choices=["stages", "overhead", "syncs", "timelines", "trace"])
    a = ap.parse_args(argv)
    want = set(a.only or ["stages", "overhead", "syncs", "timelines", "trace"])
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list = []
    with tempfile.TemporaryDirectory() as d:
        if "stages" in want:
            trace = stage_check(Path(d), rows)
            plot_timeline(trace, analyze(trace), path=out / "timeline_frozen_zb.png")
        if "overhead" in want:
            overhead(rows)
        if "syncs" in want:
            syncs(rows)
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
