"""Frozen-KV MTP draft worker: S assistant forwards per iteration, no KV of its own.

    seed    (bonus [B], target hidden [B,H]) at position seq_len-1 over target KV [0, seq_len)
            -> logp [B,V] -> top-k: step-0 branches, hidden h0 [B,H]
    step s  B lanes of K queries (the branches) over the same committed prefix at the same
    (s=1..S-1) position: token = branch token, hidden = output hidden of the branch's parent;
            one kv_shared attention lane per request, so each KV page is read once per step
            for all K branches (kernels/attn_meta.py)
After verify there is no draft-extend forward: the next seed is (bonus, verify hidden at the
last accepted node), selected from the verify outputs by the spec worker.
"""
from __future__ import annotations

import copy

import torch

from ..kernels.attn_meta import AttnMeta
from ..mem.kv_cache import KVCache
from ..models.drafts import AssistantConfig, FrozenKVAssistant
from ..models.zoo import assistant_config, build_draft, trained_draft_dir
from ..models.llama import AttnFn
from .draft_select import (StepCandidates, branch_hidden, branch_topk, select_root,
                           select_step)
from ..instrument.spans import NO_SPANS, Spans
from ..core import DraftInputs
from ..draft_kinds import DRAFT_KINDS

_KIND = DRAFT_KINDS["frozen_kv_mtp"]


class FrozenDraftWorker:
    """A DraftWorker (draft_worker.py): seed forward, S-1 steps, extend by selection."""
    owns_kv, seed_forward, extend_forward = _KIND.owns_kv, _KIND.seed_forward, \
        _KIND.extend_forward

    def __init__(self, assistant: FrozenKVAssistant, kv, table: torch.Tensor, attn_fn: AttnFn,
                 num_steps: int, topk: int, spans: Spans = NO_SPANS):
        self.spans = spans
        self.model = assistant
        self.kv = kv                 # the target's KV cache, read only
        self.table = table
        self.attn_fn = attn_fn
        self.S, self.K = num_steps, topk

    @classmethod
    def create(cls, model: FrozenKVAssistant, target_kv: KVCache, table: torch.Tensor,
               attn_fn: AttnFn, *, num_slots: int, num_steps: int, topk: int, page_size: int,
               dtype, device, spans: Spans = NO_SPANS) -> "FrozenDraftWorker":
        """The assistant on the device, reading the target's KV."""
        return cls(model.to(device, dtype), target_kv, table, attn_fn, num_steps, topk, spans)

    def with_setting(self, num_steps: int, topk: int) -> "FrozenDraftWorker":
        """This worker (model, the target's KV) drafting num_steps x topk."""
        w = copy.copy(self)
        w.S, w.K = num_steps, topk
        return w

    def _meta(self, rows, seq_lens, max_kv, per_lane: int = 1) -> AttnMeta:
        """`per_lane` queries per request, all at position seq_len - 1 over the request's
        committed prefix [0, seq_len): one meta serves every step of a draft pass."""
        n = rows.shape[0]
        positions = (seq_lens - 1).clamp(min=0).long().repeat_interleave(per_lane)
        return AttnMeta(self.table, rows, seq_lens, torch.full_like(seq_lens, per_lane),
                        torch.arange(n + 1, device=rows.device) * per_lane, positions,
                        per_lane, max_kv, kv_shared=True, split_kv=self.table.shape[1],
                        full_lanes=True)

    def _forward(self, tokens, hidden, meta: AttnMeta):
        """tokens/hidden request-major [B*per_lane] over `meta` (`_meta`)."""
        return self.model(tokens, hidden, meta.positions, self.kv.k, self.kv.v, meta,
                          self.attn_fn)

    def seed(self, inp: DraftInputs, rows, seq_lens, max_kv) -> DraftInputs:
        """The seed forward on (bonus, target hidden) -> (h0 [B,H], logp [B,K], index [B,K]).
        Its caller spans it as `draft.seed`, top-k included (speculative/worker.py: the
        unfolded seed's segment, or the folded draft's nested stage)."""
        h0, logits = self._forward(inp.bonus, inp.hidden, self._meta(rows, seq_lens, max_kv))
        return DraftInputs(inp.bonus, h0, *branch_topk(logits, self.K, self.model.vocab_ids))

    def steps(self, inp: DraftInputs, rows, seq_lens, max_kv) -> list[StepCandidates]:
        """Step 0 from the seed's top-k, then the S-1 recurrent forwards."""
        B, K, h0 = rows.shape[0], self.K, inp.hidden
        branches, cand = select_root(inp.topk_logp, inp.topk_index)
        out = [cand]
        h = h0[:, None, :].expand(B, K, h0.shape[-1])
        meta = self._meta(rows, seq_lens, max_kv, per_lane=K) if self.S > 1 else None
        for s in range(1, self.S):
            with self.spans.stage("draft.step"):
                hs, logits = self._forward(branches.tokens.reshape(-1),
                                           branch_hidden(h, branches), meta)
            logp, toks = branch_topk(logits.view(B, K, -1), K, self.model.vocab_ids)
            branches, cand = select_step(branches, logp, toks, s)
            out.append(cand)
            h = hs.view(B, K, -1)
        return out

    def after_prefill(self, bonus, hidden_last, **_) -> DraftInputs:
        """The first seed: the sampled token and the last prompt position's hidden."""
        return DraftInputs(bonus, hidden_last)

    def extend(self, rows, seq_lens, tokens, bonus, hidden_path, hidden_last, accept_lens,
               max_kv) -> DraftInputs:
        """No forward: the next seed is (bonus, verify hidden at the last accepted node)."""
        return DraftInputs(bonus, hidden_last)


Worker = FrozenDraftWorker


def build(target, seed: int = 0) -> FrozenKVAssistant:
    """The assistant of `target`: one layer per attention type (zoo.assistant_config), or the
    trained preset's shipped assistant with the shapes of its config.json."""
    trained = trained_draft_dir(target, "frozen_kv_mtp")
    acfg = assistant_config(target.config) if trained is None else AssistantConfig.read(trained)
    return build_draft(target, lambda: FrozenKVAssistant(acfg, target), seed + 1, trained)


def param_count(tcfg) -> int:
    """pre_projection 2H x Ha, per layer q and o (Ha x heads*d each), SwiGLU, two norms;
    post_projection Ha x H and the final norm (the LM head is the target's)."""
    a = assistant_config(tcfg)
    H, Ha = tcfg.hidden_size, a.hidden_size
    layers = sum(2 * Ha * tcfg.num_attention_heads * tcfg.attn_shape(li)[1]
                 + 3 * Ha * a.intermediate_size + 2 * Ha for li in a.kv_layers)
    return 2 * H * Ha + layers + Ha * H + H
