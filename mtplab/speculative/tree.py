"""The tree stage: organize the best D-1 draft candidates, then build the verify tree.

organize: see the sketch in draft_select.py (best D-1 by score, stable; then by candidate
index, which keeps the tree topological).
The verify tree: D nodes per request, node 0 = root (the previous bonus token).

    node        0      1 .. D-1   (organize order: topological, parents[b, i] < i)
    tokens    bonus    drafts                         [B, D]
    parents    -1      tree index of the parent       [B, D]
    depth       0      depth(parent) + 1              [B, D]
    positions  seq_len + depth                        [B, D]
    mask[b, i, j]  = j == i or j is an ancestor of i  [B, D, D]  (the verify tree mask)
    retrieve_next_token[b, i]   = first child of i (lowest index), -1 none
    retrieve_next_sibling[b, i] = next sibling of i (next higher index, same parent), -1 none
Children are ordered by node index, i.e. by selection order.

Static shapes, no host synchronisation (CUDA-graph capturable). On CUDA, organize and
build_tree are one Triton kernel each (kernels/fused_spec.py); the torch bodies below are
their reference and the fallback (kernels/fused_ops.dispatch). In a captured graph the two
kernels carry the stage's stamps, [organize{b tree}, build_tree{e tree}], with no stamp node
(the capture hands them over inside `dispatch`: speculative/worker.py's segment table).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..kernels.fused_ops import dispatch
from ..kernels.fused_spec import MAX_CANDIDATES, build_tree_triton, organize_triton
from .draft_select import StepCandidates


@dataclass
class DraftSelection:
    """The best D-1 draft nodes, in tree order (node i here is tree node i+1)."""
    tokens: torch.Tensor   # [B, D-1] int64
    parents: torch.Tensor  # [B, D-1] int64: tree index of the parent (root = 0), < own index
    num_steps: int         # S: the deepest node has depth <= S


def organize(steps: Sequence[StepCandidates], num_draft_tokens: int) -> DraftSelection:
    """The best D-1 candidates over all steps (see the module sketch), in tree order."""
    n = num_draft_tokens - 1
    if len(steps) == 1:
        scores, tokens, parents = steps[0].scores, steps[0].tokens, steps[0].parents
    else:
        scores = torch.cat([s.scores for s in steps], dim=1)       # [B, C]
        tokens = torch.cat([s.tokens for s in steps], dim=1)
        parents = torch.cat([s.parents for s in steps], dim=1)
    if not 0 <= n <= scores.shape[1]:
        raise ValueError(f"num_draft_tokens={num_draft_tokens} needs {n} draft nodes but "
                         f"{len(steps)} steps propose only {scores.shape[1]} candidates.")
    kernel = organize_triton if scores.shape[1] <= MAX_CANDIDATES else None
    tok, par = dispatch("organize", kernel, _organize_torch, scores, tokens, parents, n)
    return DraftSelection(tokens=tok, parents=par, num_steps=len(steps))


def _organize_torch(scores, tokens, parents, n):
    best = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :n]
    sel = torch.sort(best, dim=-1).values                      # [B, n] candidate indices, asc
    par_c = parents.gather(1, sel)
    # The parent is selected (module invariant), so its position in `sel` is its node - 1.
    pos = torch.searchsorted(sel.contiguous(), par_c.clamp(min=0).contiguous())
    tree_parents = torch.where(par_c < 0, torch.zeros_like(pos), pos + 1)
    return tokens.gather(1, sel).long(), tree_parents


@dataclass
class DraftTree:
    tokens: torch.Tensor                 # [B, D] int64, node 0 = bonus
    parents: torch.Tensor                # [B, D] int64, -1 for the root
    depth: torch.Tensor                  # [B, D] int64, root 0, <= num_steps
    positions: torch.Tensor              # [B, D] int64 = seq_lens + depth
    mask: torch.Tensor                   # [B, D, D] bool
    retrieve_next_token: torch.Tensor    # [B, D] int64
    retrieve_next_sibling: torch.Tensor  # [B, D] int64
    num_steps: int                       # S: accepted paths have at most S+1 nodes

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[1])


def _first_true(m: torch.Tensor) -> torch.Tensor:
    """m [B, D, D] bool -> [B, D] lowest j with m[b, i, j], -1 where none."""
    D = m.shape[-1]
    j = torch.arange(D, device=m.device)
    first = torch.where(m, j, D).amin(dim=-1)
    return torch.where(first == D, -1, first)


def build_tree(sel: DraftSelection, bonus: torch.Tensor, seq_lens: torch.Tensor) -> DraftTree:
    """The verify tree of a selection (module map)."""
    kernel = build_tree_triton if sel.tokens.shape[1] < MAX_CANDIDATES else None
    fields = dispatch("build_tree", kernel, _build_tree_torch, sel.tokens, sel.parents, bonus,
                      seq_lens)
    return DraftTree(*fields, num_steps=sel.num_steps)


def _build_tree_torch(sel_tokens, sel_parents, bonus, seq_lens):
    B = bonus.shape[0]
    dev = bonus.device
    tokens = torch.cat([bonus.long()[:, None], sel_tokens.long()], dim=1)
    parents = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=dev),
                         sel_parents.long()], dim=1)
    D = tokens.shape[1]
    idx = torch.arange(D, device=dev)
    # Ancestor-or-self closure by repeated squaring: after t rounds it covers chains of
    # length 2**t, and no chain is longer than D-1.
    reach = (parents[:, :, None] == idx) | torch.eye(D, dtype=torch.bool, device=dev)
    span = 1
    while span < D - 1:
        reach = reach | (torch.bmm(reach.float(), reach.float()) > 0)
        span *= 2
    depth = reach.sum(dim=-1) - 1
    is_child = parents[:, None, :] == idx[None, :, None]            # [b, i, j]: j child of i
    is_next_sib = (parents[:, None, :] == parents[:, :, None]) & (idx[None, None, :] > idx[:, None])
    return (tokens, parents, depth, seq_lens.long()[:, None] + depth, reach,
            _first_true(is_child), _first_true(is_next_sib))
