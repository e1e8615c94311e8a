"""mtplab's own engine on the workload of `scripts/sglang_h100.sh pair` (the real SGLang 0.5.17
run on the H100): random-medium target, EAGLE draft, topk 1, 3 steps, 4 draft tokens,
simulated acceptance 2.5, 32 prompts of 256 random tokens at batch 8, 128 new tokens,
overlap on and off, bubble from the meter. The figures sit beside SGLang's in
docs/sglang.md section 3 (drives the engine in-process: SGLang's side is an HTTP server).

    python -m benchmarks.bench_sglang_side
"""
from __future__ import annotations

import sys

import torch

from mtplab import Engine, RunConfig

WORKLOAD = dict(model="random-medium", draft="eagle", num_steps=3, topk=1, num_draft_tokens=4,
                simulate_accept_len=2.5, max_running_requests=8, context_len=512,
                bubble_meter=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("bench_sglang_side compares with a GPU run of SGLang: it needs CUDA.",
              file=sys.stderr)
        return 2
    rate = {}
    for overlap in (True, False):
        eng = Engine(RunConfig(**WORKLOAD, overlap=overlap))
        g = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, eng.model.config.vocab_size, (32, 256), generator=g).tolist()
        eng.generate(prompts[:8], max_new_tokens=16, ignore_eos=True)          # warm-up
        eng.generate(prompts, max_new_tokens=128, ignore_eos=True)
        st = eng.stats()
        rate[overlap] = st["tok_per_s"]
        print(f"mtplab overlap={overlap}: tok/s {st['tok_per_s']:.1f} decode tok/s "
              f"{st['decode_tok_per_s']:.1f} accept_len {st['accept_len']:.2f} "
              f"bubble_frac(meter) {st['bubble_frac']:.3f}")
    print(f"on/off tok/s {rate[True] / rate[False]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
