"""The segment functions of a decode step: for each Call of a plan (plan.py), `make(call,
max_kv)` gives a pure tensor function of the values it reads, run eagerly (a host max_kv) or
captured (the row width W). A function of several stages takes `mark` (an eager span chain or
a graph's marks) and hands the future map's tail its stamps.

    resolve         the Call's values from the future map (captured: one kernel)
    seed            the unfolded Frozen-KV seed: (bonus, hidden) -> the step-0 top-k
    draft           (the seed, folded) + S steps -> candidates (+ their stash, preexec)
    tree            organize + build_tree (root_tree: an off step's root alone)
    verify          the target's forward over the tree's nodes (speculative/verify.py)
    accept          greedy or simulated walk (accept_sample: target-only tree sampling)
    commit          commit -> publish (-> the Frozen-KV draft's selection -> stash)
    draft_extend    EAGLE's extend forward -> stash
    token           target-only: one-node verify, argmax (token_sample: the sampler),
                    publish, stash
"""
from __future__ import annotations

from dataclasses import astuple, replace
from typing import NamedTuple, Optional

import torch

from ..core import DraftInputs
from ..kernels.sampling import (SIMULATE, finite_rows, flag_nonfinite, nonfinite_token,
                                position_uniform,
                                sample)
from ..kernels.topk import argmax as vocab_argmax
from ..kernels.attn_meta import AttnMeta
from .accept import accept_greedy, accept_sample, accept_simulated
from .commit import commit
from .draft_select import StepCandidates, num_candidates
from .draft_worker import DraftWorker
from .plan import VALUES, Call, SpecParams
from .tree import DraftTree, build_tree, organize
from .verify import verify


class Target(NamedTuple):
    """The target's parts a segment reads (its worker holds the executor, which holds these
    functions: they keep the parts, not the worker)."""
    model: torch.nn.Module
    kv: object                    # mem/kv_cache.py KVCache
    table: torch.Tensor           # req_to_token
    attn_fn: object


class Segments:
    """The segment functions of one worker: its target's parts (model, KV, req_to_token,
    attention; from the target worker), future map, parameters and draft worker (None:
    target-only)."""

    def __init__(self, target, future_map, params: SpecParams,
                 draft: Optional[DraftWorker] = None):
        self.target = Target(target.model, target.kv, target.table, target.attn_fn)
        self.future_map, self.params, self.draft_worker = future_map, params, draft
        self.spans = target.spans
        p, topk_logp = params, future_map.topk_logp
        # the sizes VALUES' shapes name: H hidden, Ks the stashed top-k's width (EAGLE: the
        # run's topk, this worker reads its first topk), C draft candidates, D tree nodes,
        # E = S+1 path lanes, V vocabulary
        self.sizes = {"H": future_map.hidden.shape[1],
                      "Ks": p.topk if topk_logp is None else topk_logp.shape[1],
                      "C": num_candidates(p.num_steps, p.topk) if p.num_steps else 0,
                      "D": p.num_draft_tokens, "E": p.num_steps + 1,
                      "V": target.model.config.vocab_size}
        # target-only accept lengths: one token per lane (sliced, never written)
        self._ones = (torch.ones(target.table.shape[0], dtype=torch.long,
                                 device=target.table.device) if draft is None else None)
        self._nonfinite = nonfinite_token(target.table.device)   # flag_nonfinite's `bad`

    def resolve(self, c: Call, max_kv: int):
        """-> the Call's values from the future map. Captured: one kernel, carrying resolve's
        stamps, writing into `dst` (the stage graphs' buffers) or fresh tensors (a step
        graph); padding lanes (row 0) get the values' pads. Eager: the future map's gathers
        (with the consume-once checks of debug_future_map)."""
        future_map, size = self.future_map, self.sizes
        names = tuple(vals[0] for vals in c.writes)

        def fn(rows, mark, dst=None):
            if not mark.captured:
                seq, inp = future_map.resolve_seq_lens(rows), future_map.gather(rows)
                pre = (future_map.gather_predraft(rows, size["C"]) if "scores" in names
                       else (None,) * 3)
                got = dict(seq_lens=seq, draft_seq_lens=seq, bonus=inp.bonus,
                           draft_hidden=inp.hidden, draft_topk_logp=inp.topk_logp,
                           draft_topk_index=inp.topk_index,
                           scores=pre[0], cand_tokens=pre[1], cand_parents=pre[2])
                return tuple(seq + 1 if k == "kv_lens" else got[k] for k in names)
            bs = rows.shape[0]
            out = []
            for k in names:      # this worker's widths (a schedule arm may read fewer columns)
                f = getattr(future_map, VALUES[k].field)
                out.append(dst[k][:bs] if dst is not None else
                           f.new_empty((bs,) + tuple(size[d] for d in VALUES[k].shape)))
            future_map.resolve_into(
                rows, [(o, VALUES[k].field, VALUES[k].pad, VALUES[k].add)
                       for o, k in zip(out, names)], mark.carry("resolve"))
            return tuple(out)
        return fn

    def seed(self, c: Call, max_kv: int):
        """The unfolded Frozen-KV seed: (bonus, hidden) -> (h0, topk_logp, topk_index)."""
        draft = self.draft_worker

        def fn(rows, seq_lens, bonus, hidden):
            out = draft.seed(DraftInputs(bonus, hidden), rows, seq_lens, max_kv)
            return out.hidden, out.topk_logp, out.topk_index
        return fn

    def draft(self, c: Call, max_kv: int):
        """-> the S steps' candidates concatenated: (scores, tokens, parents) [B, C]
        (+ stash of them as the pre-drafted candidates with zb_draft_preexec)."""
        draft, fold, spans = self.draft_worker, self.params.fold_seed, self.spans
        future_map = self.future_map

        def fn(rows, seq_lens, mark=None, **fields):
            inp = DraftInputs(fields.pop("bonus", None), **fields)
            if fold:
                with spans.stage("draft.seed"):
                    inp = draft.seed(inp, rows, seq_lens, max_kv)
            steps = draft.steps(inp, rows, seq_lens, max_kv)
            cands = (torch.cat([s.scores for s in steps], 1),
                     torch.cat([s.tokens for s in steps], 1),
                     torch.cat([s.parents for s in steps], 1))
            if mark is not None:
                future_map.write(rows, mark, predraft=cands)
            return cands
        return fn

    def tree(self, c: Call, max_kv: int):
        """organize + build_tree (captured, the two kernels carry the stage's stamps)."""
        p = self.params

        def fn(rows, seq_lens, bonus, scores, tokens, parents):
            steps = [StepCandidates(tokens, scores, parents)]
            sel = replace(organize(steps, p.num_draft_tokens), num_steps=p.num_steps)
            return astuple(build_tree(sel, bonus, seq_lens))[:-1]
        return fn

    def root_tree(self, c: Call, max_kv: int):
        """The tree of an off step: the root alone (the bonus at seq_len)."""
        def fn(rows, seq_lens, bonus):
            B, dev = bonus.shape[0], bonus.device
            none = torch.full((B, 1), -1, dtype=torch.long, device=dev)
            return (bonus.long()[:, None], none, torch.zeros_like(none),
                    seq_lens.long()[:, None], torch.ones(B, 1, 1, dtype=torch.bool, device=dev),
                    none, none.clone())
        return fn

    def verify(self, c: Call, max_kv: int):
        """-> (logits [B, D, V], hidden [B, D, H], finite [B]: kernels/sampling.py
        finite_rows over request b's D nodes)."""
        target = self.target

        def fn(rows, seq_lens, tokens, positions, mask):
            logits, hidden = verify(target, tokens, positions, rows, seq_lens, mask, max_kv)
            return logits, hidden, finite_rows(logits, hidden, rows.shape[0])
        return fn

    def accept(self, c: Call, max_kv: int):
        """Greedy or simulated accept (the engine's static mode): graph friendly."""
        p = self.params

        def fn(rows, seq_lens, tokens, parents, next_token, logits, seeds, finite):
            tree = DraftTree(tokens, parents, None, None, None, next_token, None, p.num_steps)
            # = logits.argmax(-1); split-V kernel on CUDA
            argmax = vocab_argmax(logits)
            if not p.simulated:
                acc = accept_greedy(tree, argmax)
            else:
                # level k decides position seq_len + 1 + k (not keyed by the step)
                u = position_uniform(seeds, seq_lens + 1, p.num_steps + 1, SIMULATE)
                acc = accept_simulated(tree, argmax, u, mean_accept_len=p.simulate_accept_len,
                                       accept_rates=p.simulate_accept_rates)
            # the committed tokens for the host (a copy: the device keeps acc.tokens), each
            # request's row NONFINITE_TOKEN where its verify logits were not finite
            return astuple(acc) + (flag_nonfinite(acc.tokens, finite, self._nonfinite),)
        return fn

    def accept_sample(self, c: Call, max_kv: int):
        """Target-only tree sampling (eager: temperature / top-p per lane)."""
        S = self.params.num_steps

        def fn(seq_lens, logits, seeds, temperature, top_p, finite, **tree):
            t = DraftTree(tree["tokens"], tree["parents"], tree["depth"], tree["positions"],
                          tree["mask"], tree["next_token"], tree["next_sibling"], S)
            # level k decides position seq + 1 + k: the uniform target-only sampling uses there
            u = position_uniform(seeds, seq_lens + 1, S + 1)
            acc = accept_sample(t, logits, temperature, top_p, u)
            return astuple(acc) + (flag_nonfinite(acc.tokens, finite, self._nonfinite),)
        return fn

    def commit(self, c: Call, max_kv: int):
        """commit -> publish (-> the draft's selection -> stash, frozen)."""
        p, future_map, draft, target = self.params, self.future_map, self.draft_worker, self.target

        def fn(rows, seq_lens, accept_index, accept_lens, hidden, mark, tokens=None,
               bonus=None):
            new_seq, hidden_path, hidden_last = commit(
                target.kv, target.table, rows, seq_lens, accept_index, accept_lens, hidden,
                p.num_draft_tokens, move_kv=p.topk > 1)
            # no draft_extend forward: extend is a selection (no device work)
            nxt = None if draft.extend_forward else draft.extend(
                rows, seq_lens, tokens, bonus, hidden_path, hidden_last, accept_lens, max_kv)
            future_map.write(rows, mark, seq_lens=new_seq, inputs=nxt)
            return new_seq, hidden_path, hidden_last
        return fn

    def draft_extend(self, c: Call, max_kv: int):
        """EAGLE's draft extend -> stash of the next draft inputs."""
        future_map, draft = self.future_map, self.draft_worker

        def fn(rows, seq_lens, tokens, hidden_path, accept_lens, bonus, mark):
            out = draft.extend(rows, seq_lens, tokens, None, hidden_path, None, accept_lens,
                               max_kv)
            future_map.write(rows, mark, inputs=DraftInputs(bonus, out.hidden, out.topk_logp,
                                                    out.topk_index))
            return out.hidden, out.topk_logp, out.topk_index
        return fn

    # -- target-only ----------------------------------------------------------------------------
    def token(self, c: Call, max_kv: int, greedy: bool = True):
        """Target-only: the forward of the one-node tree (the fed token's KV at entry
        seq_len), its token (greedy: the argmax, what `sample` gives a greedy lane, with the
        sampling kernels left out), publish (kv_lens) and stash (the token) ->
        (the token for the host [B, 1]: NONFINITE_TOKEN where the logits were not finite,
        accept lengths of ones)."""
        target, future_map, ones = self.target, self.future_map, self._ones
        table = target.table
        width = table.shape[1]

        def fn(rows, kv_lens, input_ids, mark, seeds=None, temperature=None, top_p=None):
            B = rows.shape[0]
            positions = (kv_lens - 1).long()
            out_loc = table[rows, positions].long()
            q_lens = ones[:B]                 # one query per lane: no fill
            cu_q = torch.arange(B + 1, device=rows.device)
            meta = AttnMeta(table, rows, kv_lens, q_lens, cu_q, positions, 1, max_kv,
                            split_kv=width, full_lanes=True)
            rec = target.model.expert_recorder
            if rec is not None:               # the real lanes (row 0: a padded lane)
                rec.begin(rows != 0)
            hidden, logits = target.model(input_ids, positions, target.kv.k, target.kv.v,
                                          out_loc, meta, target.attn_fn)
            if rec is not None:
                rec.end()
            # the sampling counter: the new length
            tok = vocab_argmax(logits) if greedy else sample(logits, temperature, top_p, seeds,
                                                             kv_lens)
            report = flag_nonfinite(tok, finite_rows(logits, hidden, B), self._nonfinite)
            future_map.write(rows, mark, seq_lens=kv_lens, inputs=DraftInputs(tok))
            return report[:, None], ones[:B]
        return fn

    def token_sample(self, c: Call, max_kv: int):
        """`token` with the sampler (temperature / top-p / seed per lane)."""
        return self.token(c, max_kv, greedy=False)
