"""The speculative (spec v2) worker: a target worker plus a draft worker (draft_worker.py).

One decode iteration over B requests (seq_lens = kv_committed_len, the bonus has no KV yet;
the file of each stage: docs/design.md "Stage → file map"):

    stage         what
    resolve       seq_lens [B], bonus [B], hidden [B,H] (+ top-k) from the future map
    draft         seed (draft.seed) + S-1 forwards, each with its top-k and cumulative
                  scores (draft.step)
    tree          best D-1 candidates + root -> tokens/positions/mask
    verify        target forward over B*D nodes, KV at seq_len+node
    accept        greedy / target-only sampling / simulated
    commit        topk>1: accepted path's KV to the window front; new lengths, path hidden
                  rows
    publish       seq_lens[rows] <- seq_lens + accept_lens
    draft_extend  eagle: forward over the S+1 window -> next top-k
                  (frozen: the next seed is selected, no forward)
    stash         future map[rows] <- next inputs
    (draft)   zb_draft_preexec: the next round's draft runs now and its candidates are
              stashed; the next iteration starts at `tree`
The host then reads tokens[:, :accept_len] and advances kv_committed_len by accept_len.

The step reads top-down in `plan.decode_plan`; its segment functions are `segments.py`'s, and
`executor.py` runs it eagerly, as stage graphs or as one step graph. This worker owns what
changes from step to step: which plan runs (pre-drafted or not, greedy or sampled) and the
record of which rows hold pre-drafted candidates.
Sampled (temperature > 0) batches accept eagerly (target-only tree sampling); under
graph_granularity="step" such a step runs by stages, eagerly.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from ..core import DecodeInputs, DecodeOut, PrefillInputs
from ..graphs.runner import GraphRunner, default_buckets
from .draft_select import num_candidates
from .draft_worker import DraftWorker
from .executor import Executor, Plan
from .plan import SpecParams, decode_plan
from .segments import Segments
from .target_worker import TargetWorker, prefill_kv_lens


class SpecWorker:
    """decode() runs the plan of the step (plan.py) through the executor: a step graph, stage
    graphs, or eagerly."""

    def __init__(self, target: TargetWorker, draft: DraftWorker, future_map, params: SpecParams,
                 cuda_graphs: bool = False, graph_max_bs: int = 32,
                 granularity: str = "stage", graph_buckets: Optional[list[int]] = None):
        self.spans = target.spans
        self.target = target
        self.draft_worker = draft
        self.future_map = future_map
        self.params = params
        # zb_draft_preexec, owned here: rows whose next draft already ran (in their last
        # decode, with no prefill since), and the last decode's host rows
        C = num_candidates(params.num_steps, params.topk)
        if params.draft_preexec and future_map.pre_scores.shape[1] < C:
            future_map.hold_predrafts(C)
        self._drafted = np.zeros(future_map.seq_lens.shape[0], dtype=bool)
        self._last_rows: Optional[np.ndarray] = None
        segments = Segments(target, future_map, params, draft)
        stage_graphs = granularity == "stage"
        self.executor = Executor(
            lambda pre, greedy: decode_plan(segments, params, draft, pre, greedy, stage_graphs),
            segments.sizes, future_map=future_map, spans=self.spans, width=target.width,
            device=target.device, granularity=granularity)
        buckets = default_buckets(graph_max_bs) if graph_buckets is None else graph_buckets
        if cuda_graphs and buckets:
            pres = (False, True) if params.draft_preexec else (False,)
            self.executor.capture(buckets, [(pre, greedy) for pre in pres
                                            for greedy in (True, False)])

    @property
    def device(self):
        return self.target.device

    def plan(self, predrafted: bool, greedy: bool) -> Plan:
        """The Calls of one decode step (plan.py decode_plan)."""
        return self.executor.plan(predrafted, greedy)

    def close(self) -> None:
        """Release the captured graphs (each graph's function holds this worker's parts),
        the target worker's too."""
        self.executor.close()
        self.target.close()

    def runners(self) -> list[GraphRunner]:
        """Every captured graph runner (instrument/hostclock.py counts their replays)."""
        return self.executor.runners()

    # -- prefill / decode ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, x: PrefillInputs) -> torch.Tensor:
        self._drafted[x.host_rows if x.host_rows is not None else slice(None)] = False
        self._last_rows = None
        bonus, hidden, report = self.target.prefill_with_hidden(x)
        with self.spans.stage("publish"):
            self.future_map.publish(x.rows, prefill_kv_lens(x))
        nxt = self.draft_worker.after_prefill(
            bonus, hidden[x.cu_q[1:] - 1], fed_ids=x.input_ids, hidden_all=hidden, rows=x.rows,
            q_lens=x.q_lens, cu_q=x.cu_q, positions=x.positions, max_q=x.max_q,
            max_kv=x.max_kv or x.max_q, next_ids=x.next_ids)
        with self.spans.stage("stash"):
            self.future_map.stash(x.rows, nxt)
        return report

    def decode(self, x: DecodeInputs) -> DecodeOut:
        """One decode iteration (the executor: its outputs are views of graph buffers when
        graphed, valid until the next decode is launched)."""
        pre = self._predrafted(x.host_rows)
        tokens, accept_lens = self.executor.run(x, (pre, x.all_greedy or self.params.simulated))
        return DecodeOut(tokens, accept_lens, predrafted=pre,
                         draft_tokens=self.params.num_draft_tokens - 1)

    def forget_predrafts(self, rows=None) -> None:
        """Rows (all when None) hold no candidates this worker pre-drafted: prefilled, or
        decoded by another setting's worker since (speculative/arms.py)."""
        self._drafted[slice(None) if rows is None else rows] = False
        self._last_rows = None

    def _predrafted(self, rows: np.ndarray) -> bool:
        """This decode starts at `tree` on candidates the last round pre-drafted: every row
        was decoded with zb_draft_preexec and not prefilled since. Then the rows hold
        pre-drafted candidates once this decode has run (its plan ends with the next draft)."""
        if not self.params.draft_preexec:
            return False
        pre = rows is self._last_rows or bool(self._drafted[rows].all())
        if rows is not self._last_rows:
            self._drafted[rows] = True
            self._last_rows = rows
        return pre
