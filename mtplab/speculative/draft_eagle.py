"""EAGLE-style draft worker: a one-layer draft with its own KV pool (same slot ids as the target).

    step 0    the K candidates stashed by the last draft extend (no forward)
    step s    B*K lanes at position seq_len+s-1; lane (b,t) writes draft KV at its branch's
    (1..S-1)  entry s-1 (draft_kv.py layout) and attends to a virtual row: prefix + its
              branch's drafts (holes filled by the prefix-tail copy when P > 1 and K > 1)
    extend    after verify, a fixed-width forward over the S+1 window rows
              (token = committed token at pos+1, hidden = target hidden at pos), rewriting the
              draft KV of the window; the row at accept_len-1 gives the next step-0 top-k.
The stashed top-k is `Ks` wide (the run's topk); a worker of fewer branches (`with_setting`,
a batch bucket's setting of a speculation schedule) reads its first K columns, the top-K of
the sorted top-Ks, so any setting can follow any other on the same draft KV.
Lanes attend to the drafts of their own lane index, as SGLang does; a branch's ancestors may
sit in another lane. That affects draft quality only, never the verified output.
"""
from __future__ import annotations

import copy

import torch

from ..kernels.attn_meta import AttnMeta
from .draft_kv import branch_table, draft_slots, duplicate_prefix_tail
from ..mem.kv_cache import KVCache
from ..models.drafts import EagleDraft
from ..models.zoo import build_draft, trained_draft_dir
from ..models.llama import AttnFn
from .draft_select import (StepCandidates, branch_hidden, branch_topk, select_root,
                           select_step)
from ..instrument.spans import NO_SPANS, Spans
from ..core import DraftInputs
from ..draft_kinds import DRAFT_KINDS

_KIND = DRAFT_KINDS["eagle"]


class EagleDraftWorker:
    """A DraftWorker (draft_worker.py): no seed forward, S-1 steps, a draft_extend forward."""
    owns_kv, seed_forward, extend_forward = _KIND.owns_kv, _KIND.seed_forward, \
        _KIND.extend_forward

    def __init__(self, draft: EagleDraft, kv: KVCache, table: torch.Tensor, attn_fn: AttnFn,
                 num_steps: int, topk: int, page_size: int, spans: Spans = NO_SPANS):
        self.spans = spans
        self.model = draft
        self.kv = kv                 # the draft's own pool [1, N, Hkv, d]
        self.table = table
        self.attn_fn = attn_fn
        self.S, self.K, self.P = num_steps, topk, page_size
        self.Ks = topk               # width of the top-k extend stashes (module doc)

    @classmethod
    def create(cls, model: EagleDraft, target_kv: KVCache, table: torch.Tensor,
               attn_fn: AttnFn, *, num_slots: int, num_steps: int, topk: int, page_size: int,
               dtype, device, spans: Spans = NO_SPANS) -> "EagleDraftWorker":
        """The eagle draft on the device and its own one-layer KV pool over the same slot ids
        as the target's."""
        kv = KVCache.allocate(1, num_slots, *target_kv.layer_shape(-1), dtype,
                              device)
        return cls(model.to(device, dtype), kv, table, attn_fn, num_steps, topk, page_size,
                   spans)

    def with_setting(self, num_steps: int, topk: int) -> "EagleDraftWorker":
        """This worker (model, draft KV, stash width) drafting num_steps x topk."""
        w = copy.copy(self)
        w.S, w.K = num_steps, topk
        return w

    def _run_extend(self, tokens, hidden, positions, rows, q_lens, cu_q, max_q, max_kv,
                    select_idx) -> DraftInputs:
        row_of_tok = torch.repeat_interleave(rows, q_lens, output_size=tokens.shape[0])
        out_loc = self.table[row_of_tok, positions].long()
        kv_lens = positions[cu_q[1:] - 1] + 1
        meta = AttnMeta(self.table, rows, kv_lens, q_lens, cu_q, positions, max_q, max_kv,
                        split_kv=self.table.shape[1])
        h, logits = self.model(tokens, hidden, positions, self.kv.k, self.kv.v, out_loc, meta,
                               self.attn_fn, logits_idx=select_idx)
        logp, idx = branch_topk(logits, self.Ks, self.model.vocab_ids)
        return DraftInputs(None, h[select_idx], logp, idx)

    def after_prefill(self, bonus, hidden_last, *, fed_ids, hidden_all, rows, q_lens, cu_q,
                      positions, max_q, max_kv=None, next_ids=None, **_) -> DraftInputs:
        """Draft extend over the fed tokens shifted left by one: the tail is the bonus after
        a prompt's final chunk, the next chunk's first token after an earlier one
        (`next_ids` >= 0); the draft KV of the chunk's positions is written either way."""
        with self.spans.stage("draft_extend"):
            return self._prefill_extend(bonus, fed_ids, hidden_all, rows, q_lens, cu_q,
                                        positions, max_q, max_kv or max_q, next_ids)

    def _prefill_extend(self, bonus, fed_ids, hidden_all, rows, q_lens, cu_q, positions, max_q,
                        max_kv, next_ids):
        ends = cu_q[1:] - 1
        shifted = torch.roll(fed_ids, -1)
        shifted[ends] = bonus if next_ids is None else torch.where(next_ids >= 0, next_ids,
                                                                    bonus)
        out = self._run_extend(shifted, hidden_all, positions, rows, q_lens, cu_q, max_q,
                               max_kv, ends)
        out.bonus = bonus
        return out

    def seed(self, inp: DraftInputs, rows, seq_lens, max_kv) -> DraftInputs:
        """Step 0's inputs are the top-k stashed by the last draft extend: no forward."""
        return inp

    def steps(self, inp: DraftInputs, rows, seq_lens, max_kv) -> list[StepCandidates]:
        """Step 0 from the stashed top-k, then S-1 draft forwards writing draft KV."""
        B, K, S, P = rows.shape[0], self.K, self.S, self.P
        hidden = inp.hidden
        branches, cand = select_root(inp.topk_logp[:, :K], inp.topk_index[:, :K])
        out = [cand]
        if S == 1:
            return out
        if P > 1 and K > 1:
            duplicate_prefix_tail(self.kv.k, self.kv.v, self.table, rows, seq_lens, S, K, P)
        vtable = branch_table(self.table, rows, seq_lens, S, K, P, max_kv)
        slots = draft_slots(self.table, rows, seq_lens, S, K, P)           # [B, K, S]
        lanes = torch.arange(B * K, device=rows.device)
        ones = torch.ones(B * K, dtype=torch.long, device=rows.device)
        cu = torch.arange(B * K + 1, device=rows.device)
        seq_k = seq_lens.long().repeat_interleave(K)
        h = hidden[:, None, :].expand(B, K, hidden.shape[-1])
        for s in range(1, S):
            with self.spans.stage("draft.step"):
                pos = seq_k + s - 1
                meta = AttnMeta(vtable, lanes, seq_k + s, ones, cu, pos, 1, max_kv,
                                split_kv=self.table.shape[1], full_lanes=True)
                hs, logits = self.model(branches.tokens.reshape(-1), branch_hidden(h, branches),
                                        pos, self.kv.k, self.kv.v,
                                        slots[:, :, s - 1].reshape(-1), meta, self.attn_fn)
            logp, toks = branch_topk(logits.view(B, K, -1), K, self.model.vocab_ids)
            branches, cand = select_step(branches, logp, toks, s)
            out.append(cand)
            h = hs.view(B, K, -1)
        return out

    def extend(self, rows, seq_lens, tokens, bonus, hidden_path, hidden_last, accept_lens,
               max_kv) -> DraftInputs:
        """Draft extend over the window: S+1 rows per request, fixed width (graph friendly).
        tokens [B,E] (committed tokens, -1 padded), hidden_path [B,E,H], accept_lens [B]
        -> DraftInputs(bonus, hidden [B,H], logp [B,K], index [B,K]) at row accept_len-1."""
        B, E = tokens.shape
        dev = rows.device
        positions = (seq_lens.long()[:, None] + torch.arange(E, device=dev)).reshape(-1)
        q_lens = torch.full_like(seq_lens, E)
        cu = torch.arange(B + 1, device=dev) * E
        select = torch.arange(B, device=dev) * E + accept_lens - 1
        toks = tokens.clamp(min=0).reshape(-1)          # rows >= accept_len: never read
        out = self._run_extend(toks, hidden_path.reshape(B * E, -1),
                               positions, rows, q_lens, cu, E, max_kv, select)
        out.bonus = bonus
        return out


Worker = EagleDraftWorker


def build(target, seed: int = 0) -> EagleDraft:
    """The EAGLE draft of `target` (a trained preset's shipped one, else seeded random)."""
    return build_draft(target, lambda: EagleDraft(target), seed + 2,
                       trained_draft_dir(target, "eagle"))


def param_count(tcfg) -> int:
    """fc 2H x H, one dense decoder layer of the target's shapes, the final norm (the
    embedding and LM head are the target's)."""
    H, inter = tcfg.hidden_size, tcfg.intermediate_size
    nkv, d = tcfg.attn_shape(tcfg.num_hidden_layers - 1)     # the last layer's shapes
    q, kv = tcfg.num_attention_heads * d, nkv * d
    return 2 * H * H + 2 * H * q + 2 * H * kv + 3 * H * inter + 3 * H
