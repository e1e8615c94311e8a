"""Where one decode step's host time goes (the engine is host-bound at tiny-code sizes).

For each arm (tiny-code, overlap + zero_bubble, CUDA graphs), from one timed generate with the
event timeline on: per stage, the host µs per decode step spent inside its span (launching it)
and the GPU µs between its event pair; then, from a short profiled run, the CUDA runtime calls
per decode step by name (launches, copies, graph launches, event records); then the top Python
functions by own time (cProfile over one generate).

    python -m benchmarks.bench_host [--out FILE] [--bs 1 8]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile

import numpy as np

from mtplab import Engine, RunConfig
from mtplab.analysis.trace_io import load_trace

from .bench_profile import prompts
from .common import emit

ARMS = {"target-only": dict(draft="none"),
        "frozen_kv_mtp": dict(draft="frozen_kv_mtp", fold_seed=True)}


def stage_table(eng, name: str, bs: int, rows: list) -> None:
    tl = eng.timeline_frame()
    steps = tl[tl["stage"].str.startswith("step[decode")]["step"]
    tl = tl[tl["step"].isin(set(steps.iloc[len(steps) // 4:]))]         # steady state
    n = tl["step"].nunique()
    host = (tl["host_end_us"] - tl["host_start_us"])
    gpu = (tl["gpu_end_us"] - tl["gpu_start_us"])
    g = tl.assign(host=host, gpu=gpu).groupby(["stream", "stage"], sort=False)
    rows += [f"#### {name}, bs {bs}: {n} steady decode steps; decode step p50 "
             f"{eng.stats()['decode_step_p50_ms']:.3f} ms", "",
             "| stream | stage | spans/step | host µs/step | GPU µs/step |", "|---|---|---|---|---|"]
    for (stream, stage), d in g:
        rows.append(f"| {stream} | {stage} | {len(d) / n:.2f} | {d['host'].sum() / n:.1f} | "
                    f"{np.nansum(d['gpu']) / n:.1f} |")
    rows.append("")


def runtime_calls(cfg: dict, bs: int, rows: list) -> None:
    with tempfile.TemporaryDirectory() as d:
        eng = Engine(RunConfig(**cfg, profile=True, profile_wait=20, profile_warmup=2,
                               profile_active=8, trace_dir=d, run_name="host",
                               max_running_requests=bs))
        eng.generate(prompts(eng, bs), max_new_tokens=96, ignore_eos=True)
        tr = load_trace(eng.finish()["trace0"])
    rt = tr.cat_mask("cuda_runtime", "cuda_driver")
    names, counts = np.unique(tr.name[rt], return_counts=True)
    steps = tr.name_mask(lambda s: s.startswith("step[decode")) & tr.cat_mask("user_annotation")
    n = max(1, int(steps.sum()))
    order = np.argsort(-counts)
    rows += [f"CUDA runtime calls per profiled decode step ({n} steps): " + ", ".join(
        f"{tr.names[names[i]]} {counts[i] / n:.1f}" for i in order[:10]), ""]


def python_top(eng, ps: list, rows: list, k: int = 25) -> None:
    prof = cProfile.Profile()
    prof.enable()
    eng.generate(ps, max_new_tokens=64, ignore_eos=True)
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(k)
    n = max(1, eng.stats()["decode_steps"])
    rows += [f"cProfile of one generate ({n} decode steps), top {k} by own time:", "```",
             *[ln for ln in s.getvalue().splitlines() if ln.strip()][:k + 8], "```", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8])
    a = ap.parse_args(argv)
    rows: list = []
    for name, arm in ARMS.items():
        for bs in a.bs:
            cfg = dict(model="tiny-code", context_len=1024, overlap=True, zero_bubble=True, **arm)
            eng = Engine(RunConfig(**cfg, event_timeline=True, max_running_requests=bs))
            ps = prompts(eng, bs)
            eng.generate(ps, max_new_tokens=16, ignore_eos=True)
            eng.generate(ps, max_new_tokens=128, ignore_eos=True)
            stage_table(eng, name, bs, rows)
            runtime_calls(cfg, bs, rows)
            if bs == a.bs[0]:
                plain = Engine(RunConfig(**cfg, max_running_requests=bs))
                plain.generate(ps, max_new_tokens=16, ignore_eos=True)
                python_top(plain, ps, rows)
    emit("\n".join(rows), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
