"""The draft-worker interface: what the spec worker asks of a draft, whichever it is.

    create(model, target_kv, ...)  -> the worker, its model (and own KV) on the device
    after_prefill(...)            -> DraftInputs   first inputs, stashed by prefill (by each
                                                   chunk of a chunked prefill; the last wins)
    seed(inp, rows, seq, max_kv)  -> DraftInputs   step-0 inputs: (hidden, topk_logp, topk_index)
    steps(inp, rows, seq, max_kv) -> [StepCandidates] * S   step 0 from inp's top-k, S-1 forwards
    extend(...)                   -> DraftInputs   next iteration's inputs, after commit
    with_setting(S, K)            -> the same worker (model, KV) drafting S steps x K branches
                                     (a speculation schedule's bucket, speculative/arms.py)
    owns_kv        the draft writes KV of its own (pool sharing the target's slot ids)
    seed_forward   seed() runs a forward (frozen); otherwise it passes the stashed inputs on
    extend_forward extend() runs a forward (its own `draft_extend` stage and graph); otherwise
                   it only selects from the verify outputs inside the commit stage
    (the three flags are the kind's row of the draft table, draft_kinds.py; a worker copies
    them from its row)

                      seed                  steps              extend (after verify)
    Frozen-KV MTP     assistant forward     S-1 forwards over   select (bonus, verify hidden
                      (draft.seed)          the target's KV     at the last accepted node)
    EAGLE             identity: the top-k   S-1 forwards,       draft_extend forward over the
                      stashed by extend     own KV              S+1 window rows
`fold_seed` runs seed inside the captured draft graph (one replay); otherwise seed runs
eagerly before it. Every method is free of host syncs and data-dependent shapes (graph
capturable) except after_prefill.
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch

from ..core import DraftInputs
from .draft_select import StepCandidates


class DraftWorker(Protocol):
    owns_kv: bool
    extend_forward: bool
    seed_forward: bool
    model: torch.nn.Module

    @classmethod
    def create(cls, model: torch.nn.Module, target_kv, table: torch.Tensor, attn_fn, *,
               num_slots: int, num_steps: int, topk: int, page_size: int, dtype: torch.dtype,
               device: torch.device, spans) -> "DraftWorker":
        """From the kind's built draft model (DraftSpec.build), on the device (own KV if
        owns_kv)."""

    def after_prefill(self, bonus: torch.Tensor, hidden_last: torch.Tensor, *,
                      fed_ids: torch.Tensor, hidden_all: torch.Tensor, rows: torch.Tensor,
                      q_lens: torch.Tensor, cu_q: torch.Tensor, positions: torch.Tensor,
                      max_q: int, max_kv: int, next_ids: Optional[torch.Tensor]) -> DraftInputs:
        """After a prefill forward (one chunk per request over its earlier chunks' KV):
        next_ids [B] is the fill token after each non-final chunk, -1 after a final one."""

    def with_setting(self, num_steps: int, topk: int) -> "DraftWorker": ...

    def seed(self, inp: DraftInputs, rows: torch.Tensor, seq_lens: torch.Tensor,
             max_kv: int) -> DraftInputs: ...

    def steps(self, inp: DraftInputs, rows: torch.Tensor, seq_lens: torch.Tensor,
              max_kv: int) -> list[StepCandidates]: ...

    def extend(self, rows: torch.Tensor, seq_lens: torch.Tensor, tokens: torch.Tensor,
               bonus: torch.Tensor, hidden_path: torch.Tensor, hidden_last: torch.Tensor,
               accept_lens: torch.Tensor, max_kv: int) -> DraftInputs: ...
