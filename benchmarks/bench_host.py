"""Where does one decode step's host time go? (at tiny-code sizes the engine is host-bound)

For each arm (tiny-code, overlap + zero_bubble, CUDA graphs) and batch size, one sweep cell
(mtplab.sweep: the one measurement procedure) with the event timeline and the profiler on:
  - per stage, from the cell's timeline generate (steady state: its first quarter of decode
    steps left out), the host µs per decode step spent inside the stage's span (launching it)
    and the GPU µs between its event pair;
  - from the cell's Kineto trace (profiled steps only), the CUDA runtime/driver calls per
    decode step by name (launches, copies, graph launches, event records);
then, in this process, the top Python functions by own time (cProfile over one generate of
an engine warmed up by one generate: a function profile, not a timing).

    python -m benchmarks.bench_host [--out FILE] [--bs 1 8] [--dir DIR]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from mtplab import Engine, RunConfig
from mtplab.analysis.trace_io import load_trace
from mtplab.sweep.measure import code_prompts

from .common import emit, sweep

ARMS = [{"draft": "none"}, {"draft": "frozen_kv_mtp", "fold_seed": True}]
BASE = dict(model="tiny-code", context_len=1024, overlap=True, zero_bubble=True)


def grid(bss: list[int]) -> dict:
    return {"base": {**BASE, "prompts": "code", "prompt_len_tokens": 256,
                     "output_len_tokens": 128, "warmup_output_len_tokens": 16,
                     "profile": True, "profile_wait": 1, "profile_warmup": 2,
                     "profile_active": 8},
            "grid": {"batch_size": bss}, "arms": ARMS}


def stage_table(row, rows: list) -> None:
    tl = pd.read_parquet(row.timeline_path)
    tl = tl[(tl["step"] >= row.timeline_first_step) & (tl["step"] < row.timeline_end_step)]
    steps = tl[tl["stage"].str.startswith("step[decode")]["step"]
    tl = tl[tl["step"].isin(set(steps.iloc[len(steps) // 4:]))]         # steady state
    n = tl["step"].nunique()
    host = tl["host_end_us"] - tl["host_start_us"]
    gpu = tl["gpu_end_us"] - tl["gpu_start_us"]
    g = tl.assign(host=host, gpu=gpu).groupby(["stream", "stage"], sort=False)
    rows += [f"#### {row.draft}, bs {row.batch_size}: {n} steady decode steps; decode step "
             f"p50 {row.decode_step_time_p50_ms:.3f} ms (timed generate, spans off)", "",
             "| stream | stage | spans/step | host µs/step | GPU µs/step |", "|---|---|---|---|---|"]
    for (stream, stage), d in g:
        rows.append(f"| {stream} | {stage} | {len(d) / n:.2f} | {d['host'].sum() / n:.1f} | "
                    f"{np.nansum(d['gpu']) / n:.1f} |")
    rows.append("")


def runtime_calls(trace_path: str, rows: list) -> None:
    tr = load_trace(trace_path)
    rt = tr.cat_mask("cuda_runtime", "cuda_driver")
    names, counts = np.unique(tr.name[rt], return_counts=True)
    steps = tr.name_mask(lambda s: s.startswith("step[decode")) & tr.cat_mask("user_annotation")
    n = max(1, int(steps.sum()))
    order = np.argsort(-counts)
    rows += [f"CUDA runtime calls per profiled decode step ({n} steps): " + ", ".join(
        f"{tr.names[names[i]]} {counts[i] / n:.1f}" for i in order[:10]), ""]


def python_top(cfg: dict, bs: int, rows: list, k: int = 25) -> None:
    eng = Engine(RunConfig(**cfg, max_running_requests=bs))
    ps = code_prompts(eng.tokenizer, bs, 256)
    eng.generate(ps, max_new_tokens=16, ignore_eos=True)
    prof = cProfile.Profile()
    prof.enable()
    eng.generate(ps, max_new_tokens=64, ignore_eos=True)
    prof.disable()
    eng.check_invariants()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(k)
    n = max(1, eng.stats()["decode_steps"])
    rows += [f"cProfile of one generate ({n} decode steps), top {k} by own time:", "```",
             *[ln for ln in s.getvalue().splitlines() if ln.strip()][:k + 8], "```", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--dir", default=None, help="sweep folder (default: a temporary one)")
    a = ap.parse_args(argv)
    rows: list = []
    with tempfile.TemporaryDirectory() as d:
        df = sweep(grid(a.bs), Path(a.dir or d))
        for row in df.rename(columns={"s.draft": "draft"}).itertuples():
            stage_table(row, rows)
            runtime_calls(row.trace_path, rows)
    for arm in ARMS:
        python_top({**BASE, **arm}, a.bs[0], rows)
    emit("\n".join(rows), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
