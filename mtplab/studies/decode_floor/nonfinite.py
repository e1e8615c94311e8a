"""What does the non-finite check cost? The check every prefill, decode and verify runs on the
device (kernels/sampling.py: finite_rows over the step's logits [B*D, V] and hidden states
[B*D, H], then flag_nonfinite on its tokens) against the decode step it sits in, side by side
in one run: per configuration, the decode step p50 of a generate (the engine's own figure;
the check runs inside it) and the check's own time on tensors of that step's shapes (median
of --reps runs); the ratio is the check's share of a step. It adds no host sync: its flag
travels in the tokens the host reads anyway. A runner of study `decode_floor`; its entry
point is benchmarks/bench_nonfinite.py:

    python -m benchmarks.bench_nonfinite [--device cpu] [--reps 200]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from mtplab import Engine, RunConfig
from mtplab.kernels.sampling import finite_rows, flag_nonfinite, nonfinite_token

CONFIGS = [
    ("random-tiny target-only bs 1", dict(model="random-tiny"), 1),
    ("tiny-code target-only bs 1", dict(model="tiny-code"), 1),
    ("tiny-code frozen_kv_mtp topk 4 D 8 bs 8",
     dict(model="tiny-code", draft="frozen_kv_mtp", topk=4, num_draft_tokens=8), 8),
    ("random-medium target-only bs 1", dict(model="random-medium"), 1),
]


def check_ms(rows: int, nodes: int, vocab: int, hidden: int, dev, reps: int) -> float:
    logits = torch.randn(rows * nodes, vocab, device=dev)
    h = torch.randn(rows * nodes, hidden, device=dev)
    tokens = torch.zeros(rows, nodes, dtype=torch.long, device=dev)
    bad = nonfinite_token(dev)
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        flag_nonfinite(tokens, finite_rows(logits, h, rows), bad)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=32, help="max_new_tokens per request")
    args = ap.parse_args(argv)
    print(f"{'configuration':42s} {'step p50 ms':>12s} {'check ms':>10s} {'check/step':>11s}")
    for name, kw, bs in CONFIGS:
        eng = Engine(RunConfig(device=args.device, **kw))
        prompts = [[1 + i, 2, 3, 4] for i in range(bs)]
        eng.generate(prompts, max_new_tokens=8, ignore_eos=True)              # warm-up
        eng.generate(prompts, max_new_tokens=args.tokens, ignore_eos=True)
        eng.check_invariants()
        step = eng.stats()["decode_step_p50_ms"]
        mc = eng.model.config
        nodes = eng.cfg.num_draft_tokens if eng.cfg.speculative else 1
        chk = check_ms(bs, nodes, mc.vocab_size, mc.hidden_size, eng.device.torch_device,
                       args.reps)
        print(f"{name:42s} {step:12.3f} {chk:10.4f} {chk / step:10.2%}")
        eng.close()
    return 0

