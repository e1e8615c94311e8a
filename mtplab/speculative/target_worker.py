"""Target worker: the target model's forwards over paged KV (prefill eager, decode eager or
graph replay) and token sampling. A prefill forward feeds one chunk per request (the whole
prompt unless chunked prefill cuts it) over the KV of its earlier chunks; the token it samples
is a result only after the final chunk (the scheduler drops the others). The speculative
worker adds a draft worker beside it.

A target-only decode step is a one-node verify (plan.py `target_plan`), run by the executor
every worker shares (executor.py):
    seq_lens, input token  <- the future map (resolve; published/stashed by the last forward)
    positions = kv_lens - 1 ; out_loc = req_to_token[rows, positions]
so the captured decode graph needs no host-side lengths (only the static bound W).
Graphed decode, per batch bucket and sampling mode (greedy: an argmax; else the sampler):
    granularity "stage"   resolve graph (lengths and tokens into the decode graph's inputs),
                          then the decode graph [verify | publish | stash]: two replays
    granularity "step"    one graph [resolve | verify | publish | stash]: one replay
The host stages rows and the sampling parameters only when the batch changes (they are new
tensors then, sched/prepare.py); the outputs (tokens [B, 1], accept lengths of ones) are
views of graph buffers, valid until the next decode is launched.
"""
from __future__ import annotations

import torch

from ..core import DecodeInputs, DecodeOut, DraftInputs, PrefillInputs
from ..graphs.runner import GraphRunner, default_buckets
from ..instrument.spans import NO_SPANS, Spans
from ..kernels.attn_meta import AttnMeta
from ..kernels.sampling import finite_rows, flag_nonfinite, nonfinite_token, sample
from ..mem.kv_cache import KVCache
from ..models.llama import AttnFn, LlamaForCausalLM
from .executor import Executor, Plan
from .plan import SpecParams, target_plan
from .segments import Segments


def prefill_kv_lens(x: PrefillInputs) -> torch.Tensor:
    """KV entries of each request once this prefill forward is done: the chunk's end."""
    return x.q_lens if x.kv_lens is None else x.kv_lens


class TargetWorker:
    def __init__(self, model: LlamaForCausalLM, kv: KVCache, table: torch.Tensor,
                 attn_fn: AttnFn, cuda_graphs: bool, graph_max_bs: int, future_map,
                 spans: Spans = NO_SPANS, granularity: str = "stage"):
        self.spans = spans
        self.future_map = future_map  # publish / resolve / stash / gather
        self.model = model
        self.kv = kv
        self.table = table
        self.attn_fn = attn_fn
        self.width = table.shape[1]
        self.device = table.device
        self._nonfinite = nonfinite_token(self.device)       # flag_nonfinite's `bad`
        segments = Segments(self, future_map, SpecParams(num_steps=0, topk=1,
                                                         num_draft_tokens=1))
        self.executor = Executor(lambda pre, greedy: target_plan(segments, greedy),
                                 segments.sizes, future_map=future_map, spans=spans,
                                 width=self.width, device=self.device, granularity=granularity)
        if cuda_graphs:
            # two plans, picked per step by the host's all_greedy flag: the greedy one ends
            # in an argmax, the other samples (top-p sort, softmax, uniforms)
            self.executor.capture(default_buckets(graph_max_bs), [(False, True), (False, False)])

    def plan(self, predrafted: bool, greedy: bool) -> Plan:
        """The Calls of one decode step (plan.py target_plan; nothing is pre-drafted)."""
        return self.executor.plan(predrafted, greedy)

    def close(self) -> None:
        """Release the captured graphs."""
        self.executor.close()

    def runners(self) -> list[GraphRunner]:
        """Every captured graph runner (instrument/hostclock.py counts their replays)."""
        return self.executor.runners()

    @torch.no_grad()
    def prefill(self, x: PrefillInputs) -> torch.Tensor:
        """Forward every fed token, sample the next token of each request; publish the new
        lengths and stash the token as the next input. -> the tokens [B] int64 as the host
        reads them (NONFINITE_TOKEN where the logits were not finite)."""
        tok, _, report = self.prefill_with_hidden(x)
        with self.spans.stage("publish"):
            self.future_map.publish(x.rows, prefill_kv_lens(x))
        with self.spans.stage("stash"):
            self.future_map.stash(x.rows, DraftInputs(tok))
        return report

    def decode(self, x: DecodeInputs) -> DecodeOut:
        """One token per lane: the fed token's KV is written at entry seq_len (module doc)."""
        tokens, ones = self.executor.run(x, (False, x.all_greedy))
        return DecodeOut(tokens, ones)

    @torch.no_grad()
    def prefill_with_hidden(self, x: PrefillInputs) -> tuple[torch.Tensor, ...]:
        """-> (next tokens [B], hidden [T, H] of every fed token, pre final norm, the tokens
        for the host: NONFINITE_TOKEN where the logits were not finite)."""
        with self.spans.stage("prefill"):
            return self._prefill(x)

    def _prefill(self, x: PrefillInputs) -> tuple[torch.Tensor, ...]:
        B = x.rows.shape[0]
        row_of_tok = torch.repeat_interleave(x.rows, x.q_lens, output_size=x.input_ids.shape[0])
        out_loc = self.table[row_of_tok, x.positions].long()
        meta = AttnMeta(self.table, x.rows, prefill_kv_lens(x), x.q_lens, x.cu_q, x.positions,
                        max_q=x.max_q, max_kv=x.max_kv or x.max_q)
        hidden, logits = self.model(x.input_ids, x.positions, self.kv.k, self.kv.v, out_loc,
                                    meta, self.attn_fn, logits_idx=x.cu_q[1:] - 1)
        s = x.sampling
        assert logits.shape[0] == B
        tok = sample(logits, s.temperature, s.top_p, s.seeds, s.counters)
        last = hidden[x.cu_q[1:] - 1]                      # the rows the logits are of
        return tok, hidden, flag_nonfinite(tok, finite_rows(logits, last, B), self._nonfinite)
