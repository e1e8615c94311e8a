"""The `prepare` stage: a batch's host state -> the worker's device inputs (on the schedule
stream; pinned staging, non-blocking H2D).

    prefill  a chunk plan (admission.py `chunks`) -> packed chunk ids [T], rows/q_lens/cu_q,
             positions start + i, kv_lens start + n, the token after each non-final chunk,
             sampling (counters = kv_lens)
    decode   rows [B] + sampling [B]: made once per Batch (sched/rows.py) and reused while it
             is the same; max_kv = the host's bound on seq_len + tokens this step (eager
             attention only)
seq_lens and input tokens are not prepared: the worker resolves them from the future map.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core import DecodeInputs, PrefillInputs, Req, SamplingTensors
from ..device import Device


def sampling_tensors(dev: Device, reqs: list[Req],
                     counters: Optional[list[int]]) -> SamplingTensors:
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
    rows = np.array([r.kv.row for r in reqs], dtype=np.int64)
    return PrefillInputs(h2d(ids, torch.long), h2d(rows, torch.long),
                         h2d(lens, torch.long), h2d(cu, torch.long),
                         h2d([start + i for _, start, n in plan for i in range(n)], torch.long),
                         max(lens), sampling_tensors(dev, reqs, ends),
                         kv_lens=h2d(ends, torch.long), max_kv=max(ends),
                         next_ids=h2d(nxt, torch.long), host_rows=rows)


class DecodePrepare:
    """prepare for decode batches: the rows and sampling tensors of a Batch (sched/rows.py)
    are made once and reused while the scheduler hands the same Batch (never written in
    place, so safe to reuse while a step still reads them; a graphed worker then stages
    nothing either). `fresh`: the last call made them (H2D copies on the current stream)."""

    def __init__(self, dev: Device, width: int, tokens_per_decode: int):
        self.dev, self.width, self.tokens_per_decode = dev, width, tokens_per_decode
        self._batch = None
        self._tensors: Optional[tuple] = None
        self.fresh = False

    def reset(self) -> None:
        self._batch = self._tensors = None

    def has(self, batch) -> bool:
        """The tensors of `batch` are made (a call makes no device work)."""
        return batch is self._batch

    def tensors(self, batch) -> tuple:
        """(rows, sampling) of `batch` on the device, made when it is a new Batch: two H2D
        copies (rows and seeds as one int64 [2, B], temperature and top_p as one float32
        [2, B]), the tensors views of them."""
        if batch is not self._batch:
            self.fresh = True
            self._batch = batch
            reqs = batch.reqs
            ints = self.dev.h2d(np.stack([batch.rows, [r.sampling.seed for r in reqs]]),
                                torch.long)
            floats = self.dev.h2d([[r.sampling.temperature for r in reqs],
                                   [r.sampling.top_p for r in reqs]], torch.float32)
            self._tensors = (ints[0], SamplingTensors(floats[0], floats[1], ints[1]))
        return self._tensors

    def __call__(self, batch, host_seq_bound: int) -> DecodeInputs:
        self.fresh = False
        rows, sampling = self.tensors(batch)
        return DecodeInputs(rows=rows, sampling=sampling,
                            max_kv=min(self.width, host_seq_bound + self.tokens_per_decode),
                            all_greedy=batch.all_greedy, host_rows=batch.rows)
