"""The `prepare` stage: a batch's host state -> the worker's device inputs (on the schedule
stream; pinned staging, non-blocking H2D).

    prefill  a chunk plan (admission.py `chunks`) -> packed chunk ids [T], rows/q_lens/cu_q,
             positions start + i, kv_lens start + n, the token after each non-final chunk,
             sampling (counters = kv_lens)
    decode   rows [B] + sampling [B]: reused while the batch is the same requests on the same
             rows (never written in place, so safe to reuse while a step still reads them);
             max_kv = the host's bound on seq_len + tokens this step (eager attention only)
seq_lens and input tokens are not prepared: the worker resolves them from the future map.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..core import DecodeInputs, PrefillInputs, Req, SamplingTensors
from ..device import Device


def sampling_tensors(dev: Device, reqs: list[Req], counters: Optional[list[int]]) -> SamplingTensors:
    h2d = dev.h2d
    return SamplingTensors(
        temperature=h2d([r.sampling.temperature for r in reqs], torch.float32),
        top_p=h2d([r.sampling.top_p for r in reqs], torch.float32),
        seeds=h2d([r.sampling.seed for r in reqs], torch.long),
        counters=None if counters is None else h2d(counters, torch.long))


def prepare_prefill(dev: Device, plan: list[tuple[Req, int, int]]) -> PrefillInputs:
    h2d = dev.h2d
    reqs = [r for r, _, _ in plan]
    fills = [r.fill_ids() for r in reqs]
    lens = [n for _, _, n in plan]
    ends = [start + n for _, start, n in plan]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    ids = [t for f, (_, start, n) in zip(fills, plan) for t in f[start:start + n]]
    nxt = [f[e] if e < len(f) else -1 for f, e in zip(fills, ends)]
    return PrefillInputs(h2d(ids, torch.long), h2d([r.kv.row for r in reqs], torch.long),
                         h2d(lens, torch.long), h2d(cu, torch.long),
                         h2d([start + i for _, start, n in plan for i in range(n)], torch.long),
                         max(lens), sampling_tensors(dev, reqs, ends),
                         kv_lens=h2d(ends, torch.long), max_kv=max(ends),
                         next_ids=h2d(nxt, torch.long))


class DecodePrepare:
    """prepare for decode batches, with the steady-batch cache of rows and sampling."""

    def __init__(self, dev: Device, width: int, tokens_per_decode: int):
        self.dev, self.width, self.tokens_per_decode = dev, width, tokens_per_decode
        self._key: Optional[tuple] = None
        self._tensors: Optional[tuple] = None

    def reset(self) -> None:
        self._key = self._tensors = None

    def __call__(self, reqs: list[Req], host_seq_bound: Callable[[torch.Tensor], int],
                 predrafted: bool) -> DecodeInputs:
        key = tuple((r.rid, r.kv.row) for r in reqs)
        if key != self._key:
            self._key = key
            self._tensors = (self.dev.h2d([r.kv.row for r in reqs], torch.long),
                             sampling_tensors(self.dev, reqs, None))
        rows, sampling = self._tensors
        return DecodeInputs(
            rows=rows, sampling=sampling,
            max_kv=min(self.width, host_seq_bound(rows) + self.tokens_per_decode),
            all_greedy=all(r.sampling.temperature == 0 for r in reqs), predrafted=predrafted)
