"""CUDA graph capture/replay, bucketed by batch size, with padded lanes.

    static inputs (max bucket rows)   capture fn(**static[:bs]) for every bucket bs
    run(inputs, bs): copy inputs -> static[:bs], fill static[bs:bucket] with pad values
                     (padding lanes point at req_to_token row 0 -> the padding page),
                     replay the smallest bucket >= bs, return a copy of out[:bs]
                     (out: a tensor or a tuple of tensors, batch-major)
`fn` must be free of host syncs and data-dependent shapes; tensors it closes over (weights,
KV cache, req_to_token) must never be reallocated after capture.
"""
from __future__ import annotations

from typing import Callable

import torch


def default_buckets(max_bs: int) -> list[int]:
    b = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return sorted({x for x in b if x <= max_bs} | {max_bs})


class GraphRunner:
    def __init__(self, fn: Callable[..., torch.Tensor], static_inputs: dict[str, torch.Tensor],
                 pad_values: dict[str, int], buckets: list[int]):
        self.fn = fn
        self.static = static_inputs
        self.pad = pad_values
        self.buckets = sorted(buckets)
        self.graphs: dict[int, tuple] = {}
        for k, v in self.static.items():
            v.fill_(pad_values[k])

    @property
    def max_bs(self) -> int:
        return self.buckets[-1]

    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for bs in reversed(self.buckets):
            args = {k: v[:bs] for k, v in self.static.items()}
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):          # warm-up: Triton JIT, cuBLAS workspaces
                    self.fn(**args)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = self.fn(**args)
            self.graphs[bs] = (g, out)
        torch.cuda.synchronize()

    def bucket(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        raise ValueError(f"batch size {bs} exceeds the largest captured bucket {self.max_bs}.")

    def run(self, inputs: dict[str, torch.Tensor]):
        bs = next(iter(inputs.values())).shape[0]
        b = self.bucket(bs)
        for k, v in inputs.items():
            self.static[k][:bs].copy_(v, non_blocking=True)
            if b > bs:
                self.static[k][bs:b].fill_(self.pad[k])
        g, out = self.graphs[b]
        g.replay()
        if isinstance(out, torch.Tensor):
            return out[:bs].clone()
        return tuple(o[:bs].clone() for o in out)
