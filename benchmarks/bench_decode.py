"""Decode throughput, eager vs CUDA graphs, side by side in one run (issue: Foundation).

For each model and batch size, the two arms alternate (A B A B ...) over `--repeats` rounds;
each round generates `--new-tokens` tokens for bs prompts. Reported: median decode tok/s
(decode steps only, prefill excluded) and the graph/eager ratio.

    python -m benchmarks.bench_decode --models random-tiny random-medium --bs 1 8 32
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.common import emit
from mtplab import Engine, RunConfig


def decode_rate(eng: Engine, bs: int, new_tokens: int, prompt_len: int) -> float:
    V = eng.model.config.vocab_size
    g = torch.Generator().manual_seed(bs)
    prompts = torch.randint(3, V, (bs, prompt_len), generator=g).tolist()
    eng.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True)
    eng.check_invariants()
    return eng.stats()["decode_tok_per_s"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["random-tiny", "random-medium"])
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    a = ap.parse_args(argv)
    rows = ["| model | bs | eager tok/s | graphs tok/s | graphs/eager |",
            "|---|---|---|---|---|"]
    for model in a.models:
        engines = {g: Engine(RunConfig(model=model, cuda_graphs=g, page_size=16,
                                       context_len=1024, max_running_requests=max(a.bs)))
                   for g in (False, True)}
        for bs in a.bs:
            rates = {False: [], True: []}
            for g in (False, True):                       # warm-up both arms
                decode_rate(engines[g], bs, 8, a.prompt_len)
            for _ in range(a.repeats):
                for g in (False, True):
                    rates[g].append(decode_rate(engines[g], bs, a.new_tokens, a.prompt_len))
            e, c = statistics.median(rates[False]), statistics.median(rates[True])
            rows.append(f"| {model} | {bs} | {e:.0f} | {c:.0f} | {c / e:.2f}x |")
            print(rows[-1], flush=True)
        del engines
        torch.cuda.empty_cache()
    table = "\n".join(rows)
    emit(table, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
