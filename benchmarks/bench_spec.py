"""Spec v2 throughput and draft-stage cost, side by side in one run (issue: Spec v2 worker).

Table 1: decode tok/s of target-only vs frozen_kv_mtp vs eagle at bs 1, 8, 32 with simulated
acceptance (so random weights do not hide the effect), CUDA graphs on, arms interleaved.
Table 2: the draft stage per decode step with fold_seed off vs on: GPU time (event timeline,
draft.seed + draft) and CUDA launch calls issued inside those spans (torch.profiler trace).

    python -m benchmarks.bench_spec [--accept-len 2.5] [--bs 1 8 32] [--out table.md]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import torch

from benchmarks.common import emit
from mtplab import Engine, RunConfig
from mtplab.analysis.trace_io import load_trace

ARMS = {"target-only": dict(draft="none"),
        "frozen_kv_mtp": dict(draft="frozen_kv_mtp", fold_seed=True),
        "eagle": dict(draft="eagle")}


def prompts(bs: int, n: int, V: int):
    g = torch.Generator().manual_seed(bs)
    return torch.randint(3, V, (bs, n), generator=g).tolist()


def throughput(a) -> list[str]:
    rows = ["| bs | " + " | ".join(f"{k} tok/s" for k in ARMS) + " | frozen/target | eagle/target |",
            "|---" * (len(ARMS) + 3) + "|"]
    for bs in a.bs:
        engs = {}
        for name, kw in ARMS.items():
            sim = {} if kw["draft"] == "none" else dict(simulate_accept_len=a.accept_len)
            engs[name] = Engine(RunConfig(model=a.model, page_size=16, context_len=1024,
                                          max_running_requests=bs, **kw, **sim))
            engs[name].generate(prompts(bs, 32, 320), max_new_tokens=8, ignore_eos=True)
        rates = {k: [] for k in ARMS}
        for _ in range(a.repeats):
            for name, eng in engs.items():
                eng.generate(prompts(bs, 64, 320), max_new_tokens=a.new_tokens, ignore_eos=True)
                eng.check_invariants()
                rates[name].append(eng.stats()["decode_tok_per_s"])
        med = {k: statistics.median(v) for k, v in rates.items()}
        rows.append(f"| {bs} | " + " | ".join(f"{med[k]:.0f}" for k in ARMS) +
                    f" | {med['frozen_kv_mtp'] / med['target-only']:.2f}x"
                    f" | {med['eagle'] / med['target-only']:.2f}x |")
        print(rows[-1], flush=True)
        del engs
    return rows


def draft_cost(a, fold: bool, bs: int) -> tuple[float, float]:
    """(median draft GPU µs per step, CUDA launch calls per step) in steady state."""
    with tempfile.TemporaryDirectory() as d:
        eng = Engine(RunConfig(model=a.model, draft="frozen_kv_mtp", fold_seed=fold,
                               simulate_accept_len=a.accept_len, page_size=16, context_len=1024,
                               max_running_requests=bs, event_timeline=True, profile=True,
                               profile_wait=4, profile_warmup=2, profile_active=10,
                               trace_dir=d, run_name="r"))
        eng.generate(prompts(bs, 64, 320), max_new_tokens=64, ignore_eos=True)
        files = eng.finish()
        tl = eng.timeline_frame()
        dev = tl[tl["stage"].isin(["draft.seed", "draft"]) & (tl["stream"] != "host")]
        per_step = (dev["gpu_end_us"] - dev["gpu_start_us"]).groupby(dev["step"]).sum()
        gpu_us = float(per_step.iloc[5:].median())
        tr = load_trace(files["trace0"])
        host = tr.cat_mask("user_annotation")
        spans = host & tr.name_mask(lambda n: n in ("draft.seed", "draft"))
        steps = host & tr.name_mask(lambda n: n.startswith("step[decode"))
        launch = tr.cat_mask("cuda_runtime") & tr.name_mask(lambda n: "Launch" in n)
        lt = tr.ts[launch]
        n = sum(int(((lt >= s) & (lt <= s + d)).sum()) for s, d in zip(tr.ts[spans], tr.dur[spans]))
        return gpu_us, n / max(1, int(steps.sum()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="random-tiny")
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--accept-len", type=float, default=2.5)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = throughput(a)
    rows += ["", "| bs | fold_seed | draft GPU µs/step | launch calls/step |", "|---|---|---|---|"]
    for bs in (1, max(a.bs)):
        for fold in (False, True):
            us, n = draft_cost(a, fold, bs)
            rows.append(f"| {bs} | {fold} | {us:.1f} | {n:.1f} |")
            print(rows[-1], flush=True)
    table = "\n".join(rows)
    emit(table, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
