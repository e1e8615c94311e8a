"""A draft's LM head over a reduced vocabulary (`RunConfig.draft_vocab`, parsed by
draft_kinds.parse_draft_vocab); W [V, Hd] is the head the draft reads (the target's LM head,
or a Gemma-4 assistant's own), s [T, Hd] the normed state it scores.

    full           logits = s W^T                                          [T, V]
    hot:N          logits = s W[hot]^T                                     [T, N]
                   the draft's top-k maps index i -> hot[i] (`vocab_ids`); W[hot] is a copy
                   of N rows, re-made when W changes (its version counter), so a step reads N
                   rows, not V
    centroids:C/k  c = s Cent^T [T, C]; per row the k best clusters; their k V/C tokens'
                   rows gathered and scored; the scores scattered into [T, V] filled with the
                   float32 minimum (never a top-k pick while k V / C >= topk); C + k V / C rows

Every shape is fixed by T and nothing is read on the host: the head captures in the draft's
CUDA graph. Logits over a reduced vocabulary are log-softmaxed over it: the draft's scores are
renormalised over what it can propose (they only order the tree).

Hot set: the N most frequent tokens of a corpus's counts, ties to the lower id (FR-Spec's
recipe); a trained preset ships the counts of its training split (<preset>/token_counts.json).
A random preset has no corpus: its counts rank the ids in order (timing only).
Clusters: recursive median splits of the head's rows along their principal direction (C a
power of two, V / C rows each), a cluster's centroid its rows' mean: derived from the head,
not trained (Gemma-4 E2B/E4B ship trained centroids).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..draft_kinds import DraftVocab
from .linear import GemmSites, linear


def hot_ids(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The n most frequent ids of `counts` [V] (ties: the lower id first), ascending."""
    order = torch.sort(counts.double(), descending=True, stable=True).indices
    return order[:n].sort().values


def _principal(x: torch.Tensor, iters: int = 12) -> torch.Tensor:
    """The top principal direction of the rows of x (power iteration on centred rows)."""
    xc = x - x.mean(0, keepdim=True)
    v = torch.ones(x.shape[1], dtype=x.dtype, device=x.device)
    for _ in range(iters):
        v = xc.T @ (xc @ v)
        v = v / v.norm().clamp(min=1e-12)
    return v


def cluster_tokens(weight: torch.Tensor, clusters: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (members [C, V/C] token ids, centroids [C, Hd] in weight's dtype): balanced
    clusters by recursive median splits along each part's principal direction."""
    V = weight.shape[0]
    x = F.normalize(weight.detach().float(), dim=-1)
    parts = [torch.arange(V, device=weight.device)]
    while len(parts) < clusters:
        nxt = []
        for ids in parts:
            proj = x[ids] @ _principal(x[ids])
            order = torch.sort(proj, stable=True).indices
            half = ids.numel() // 2
            nxt += [ids[order[:half]], ids[order[half:]]]
        parts = nxt
    members = torch.stack([p.sort().values for p in parts])
    centroids = torch.stack([x[p].mean(0) for p in parts])
    return members, centroids.to(weight.dtype)


class VocabHead(GemmSites, nn.Module):
    """The head of one DraftVocab over weight W (see the module doc)."""

    def __init__(self, vocab: DraftVocab, weight: torch.Tensor,
                 counts: Optional[torch.Tensor] = None):
        super().__init__()
        self.vocab = vocab
        V = weight.shape[0]
        self._copy_version = -1
        if vocab.kind == "hot":
            counts = torch.arange(V, 0, -1) if counts is None else counts
            self.register_buffer("vocab_ids", hot_ids(counts, vocab.size).to(weight.device),
                                 persistent=False)
            self.register_buffer("hot_weight", weight.detach()[self.vocab_ids].clone(),
                                 persistent=False)
            self._copy_version = weight._version
        elif vocab.kind == "centroids":
            members, cent = cluster_tokens(weight, vocab.clusters)
            self.register_buffer("members", members, persistent=False)
            self.register_buffer("centroids", cent, persistent=False)
            self.vocab_ids = None
        else:
            self.vocab_ids = None

    def gemm_sites(self) -> dict[str, torch.Tensor]:
        return {"hot": self.hot_weight} if self.vocab.kind == "hot" else {}

    def rows_read(self, vocab_size: int) -> int:
        """Head rows one scored state reads."""
        v = self.vocab
        if v.kind == "hot":
            return v.size
        if v.kind == "centroids":
            return v.clusters + v.top * (vocab_size // v.clusters)
        return vocab_size

    def forward(self, s: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        v = self.vocab
        if v.kind == "hot":
            if weight._version != self._copy_version and not (
                    weight.is_cuda and torch.cuda.is_current_stream_capturing()):
                self.hot_weight = weight.detach()[self.vocab_ids].to(self.hot_weight.dtype)
                self._copy_version = weight._version
            return linear(s, self.hot_weight, self.gemv.get("hot"))
        if v.kind == "centroids":
            T = s.shape[0]
            top = F.linear(s, self.centroids).topk(v.top, dim=-1).indices          # [T, k]
            ids = self.members[top].reshape(T, -1)                                  # [T, kM]
            sel = torch.bmm(weight[ids], s[:, :, None]).squeeze(-1)                 # [T, kM]
            out = torch.full((T, weight.shape[0]), torch.finfo(sel.dtype).min,
                             dtype=sel.dtype, device=s.device)
            return out.scatter_(1, ids, sel)
        return F.linear(s, weight)


def set_draft_vocab(model, vocab: DraftVocab, counts: Optional[torch.Tensor] = None):
    """Give a draft model (a DraftHead) its vocabulary head; `full` leaves it as built.
    Returns the model."""
    if vocab.kind != "full":
        model.vocab_head = VocabHead(vocab, model.head_weight, counts)
    return model


def escape_share(outputs: list[list[int]], vocab_ids: Optional[torch.Tensor]) -> float:
    """The share of emitted tokens outside a hot draft vocabulary: each one is a position the
    draft could not have proposed (a guaranteed rejection). 0.0 for a full head."""
    total = sum(len(o) for o in outputs)
    if vocab_ids is None or not total:
        return 0.0
    hot = set(vocab_ids.tolist())
    return sum(t not in hot for o in outputs for t in o) / total
