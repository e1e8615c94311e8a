"""EAGLE-style draft token selection: per-step top-k with cumulative scores, then the best
D-1 nodes over all steps (`organize`, in tree.py: the tree stage).

Shapes: B requests, K topk, S num_steps, D num_draft_tokens (tree nodes incl. the root), V vocab.
Scores are cumulative log-probabilities (sums of log-softmax values, so they never increase
along a path). Every draft-side candidate gets a *candidate index* c, step-major:

    step 0    root logp [B,V] --branch_topk--> [B,K]          candidates c in [0, K)
              score = logp, parent = -1 (the root)
              all K candidates are the K branches of step 0
    step s>0  branch logp [B,K,V] --branch_topk--> [B,K,K]   candidates c in [off_s, off_s + K*K)
              score[b, j*K + i] = branch_score[b,j] + logp[b,j,i]     off_s = K + (s-1)*K*K
              parent[b, j*K + i] = candidate index of branch j
              top K of the K*K (stable sort) --> the branches of step s
    organize  S steps -> scores [B, C], C = K + (S-1)*K*K
              stable sort by score (desc)  --> best D-1 candidates (ties: lower c first)
              sort them by c (asc)          --> tree nodes 1..D-1 (node 0 = root)
              tokens [B, D-1], parents [B, D-1] (tree indices, root = 0)

Invariant (why organize can map parents by search): a child's score is its parent's score plus
a log-prob <= 0, so score(child) <= score(parent), and c(parent) < c(child). With the stable
descending sort the parent therefore ranks before the child: whenever a node is among the best
D-1, so is its parent. Sorting the selection by c keeps the tree topological
(parent index < child index). topk == 1 is the chain: one candidate per step, D = S+1.

No host synchronisation and static shapes throughout (CUDA-graph capturable). On CUDA the
per-step top-k is one split-V kernel pair (kernels/topk.py: log_softmax and top-k fused, equal
logits ranked by the lower token id); elsewhere and in the unfused engine, torch's
log_softmax + topk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..kernels.topk import logp_topk


@dataclass
class DraftBranches:
    """The K live branches after a step: the inputs of the next draft step."""
    tokens: torch.Tensor   # [B, K] int64: token of each branch (next draft input)
    scores: torch.Tensor   # [B, K] float32: cumulative log-prob of each branch
    cand: torch.Tensor     # [B, K] int64: candidate index of each branch
    lane: torch.Tensor     # [B, K] int64: previous-step branch each descends from (hidden gather)


@dataclass
class StepCandidates:
    """Every candidate proposed in one step (C = K at step 0, K*K after)."""
    tokens: torch.Tensor   # [B, C] int64
    scores: torch.Tensor   # [B, C] float32, cumulative
    parents: torch.Tensor  # [B, C] int64: candidate index of the parent, -1 = root



def num_candidates(num_steps: int, topk: int) -> int:
    """C = K + (S-1)*K*K: candidates recorded over S steps."""
    return topk + (num_steps - 1) * topk * topk


def branch_topk(logits: torch.Tensor, topk: int,
                vocab_ids: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [..., V] -> (log-probs [..., K] float32, tokens [..., K] int64), best first:
    the top-k of log_softmax(logits.float()) (kernels/topk.logp_topk; reference logp_topk_ref).
    A draft head over a hot vocabulary scores N ids: `vocab_ids` [N] maps index -> token."""
    logp, idx = logp_topk(logits, topk)
    return (logp, idx) if vocab_ids is None else (logp, vocab_ids[idx])


def branch_hidden(h: torch.Tensor, branches: DraftBranches) -> torch.Tensor:
    """h [B, K, H] (the previous step's hidden per lane) -> [B*K, H]: each branch's parent
    lane's hidden. topk 1: the one branch descends from lane 0, so h itself (no gather)."""
    B, K, H = h.shape
    if K > 1:
        h = h.gather(1, branches.lane[:, :, None].expand(B, K, H))
    return h.reshape(B * K, H)


def select_root(logp: torch.Tensor, tokens: torch.Tensor) -> tuple[DraftBranches, StepCandidates]:
    """Step 0: the root's top-k (logp, tokens) [B, K] become the K branches."""
    B, K = tokens.shape
    cand = torch.arange(K, device=tokens.device).repeat(B, 1)
    scores = logp.float()
    branches = DraftBranches(tokens=tokens.long(), scores=scores, cand=cand,
                             lane=torch.zeros_like(cand))
    step = StepCandidates(tokens=tokens.long(), scores=scores,
                          parents=torch.full_like(cand, -1))
    return branches, step


def select_step(branches: DraftBranches, logp: torch.Tensor, tokens: torch.Tensor,
                step: int) -> tuple[DraftBranches, StepCandidates]:
    """Step s >= 1: each branch's top-k children (logp, tokens) [B, K, K] -> K*K candidates;
    the best K (stable: ties to the lower candidate index) are the next branches."""
    assert step >= 1, "step 0 is select_root"
    B, K = branches.tokens.shape
    offset = num_candidates(step, K)              # first candidate index of this step
    scores = (branches.scores[:, :, None] + logp.float()).reshape(B, K * K)
    toks = tokens.long().reshape(B, K * K)
    parents = branches.cand[:, :, None].expand(B, K, K).reshape(B, K * K)
    if K == 1:   # the chain: the one candidate is the next branch (no sort, no gathers)
        nxt = DraftBranches(tokens=toks, scores=scores, cand=torch.full_like(toks, offset),
                            lane=torch.zeros_like(toks))
        return nxt, StepCandidates(tokens=toks, scores=scores, parents=parents)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :K]
    nxt = DraftBranches(tokens=toks.gather(1, order), scores=scores.gather(1, order),
                        cand=order + offset, lane=torch.div(order, K, rounding_mode="floor"))
    return nxt, StepCandidates(tokens=toks, scores=scores, parents=parents)
