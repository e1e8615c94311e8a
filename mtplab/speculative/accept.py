"""Verify a draft tree against the target: greedy, target-only sampling, simulated acceptance.

All three walk the tree from the root, one level per iteration (S+1 levels at most):

    level k:  cur [B] = accepted node at depth k (root at k = 0)
              x [B]   = the target's token after cur (argmax / sample / simulated)
              if a child of cur carries x (greedy/sample) -> accept it, go on; else x = bonus, stop

AcceptResult (S+1 = the longest possible path, root included):
    accept_index [B, S+1]  node indices of the accepted path, root first, -1 padded
    accept_lens  [B]       correct drafts + 1, in [1, S+1]
    tokens       [B, S+1]  committed output tokens: tokens[k] = the target's token after path
                           node k (a draft token for k < accept_lens-1, then the bonus), -1 padded
    bonus        [B]       tokens[accept_lens-1]; its KV is written by the next verify (as root)

Static shapes, no host synchronisation (CUDA-graph capturable). On CUDA the greedy walk is
one Triton kernel and so is the simulated chain (kernels/fused_spec.py); `_walk` and
`_accept_chain_torch` are their references and the fallbacks. In a captured graph the
target's argmax carries the stage's begin stamp and the walk its end, with no stamp node
(the capture hands them over inside `dispatch`: speculative/worker.py's segment table).
"""
from __future__ import annotations

import math
from dataclasses import astuple, dataclass
from typing import Callable, Optional, Sequence

import torch

from ..kernels.fused_ops import dispatch
from ..kernels.fused_spec import accept_chain_triton, accept_greedy_triton
from ..kernels.sampling import inverse_cdf, last_in_support, target_probs
from .tree import DraftTree


@dataclass
class AcceptResult:
    accept_index: torch.Tensor  # [B, S+1] int64
    accept_lens: torch.Tensor   # [B] int64
    tokens: torch.Tensor        # [B, S+1] int64
    bonus: torch.Tensor         # [B] int64


def _walk(tree: DraftTree, choose: Callable[[int, torch.Tensor], torch.Tensor]) -> AcceptResult:
    """choose(k, cur [B]) -> x [B]: the target's token after node cur at level k."""
    B, D = tree.tokens.shape
    dev = tree.tokens.device
    j = torch.arange(D, device=dev)
    cur = torch.zeros(B, dtype=torch.long, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    bonus = torch.zeros(B, dtype=torch.long, device=dev)
    index, tokens = [cur], []
    for k in range(tree.num_steps + 1):
        x = choose(k, cur)
        tokens.append(torch.where(alive, x, -1))
        bonus = torch.where(alive, x, bonus)
        if k == tree.num_steps:       # depth S: leaves only
            break
        hit = (tree.parents == cur[:, None]) & (tree.tokens == x[:, None]) & alive[:, None]
        nxt = torch.where(hit, j, D).amin(dim=-1)   # first matching child in order
        alive = nxt < D                              # once stopped, `hit` stays empty
        cur = torch.where(alive, nxt, cur)
        index.append(torch.where(alive, nxt, -1))
    accept_index = torch.stack(index, dim=1)
    return AcceptResult(accept_index=accept_index, accept_lens=(accept_index >= 0).sum(dim=1),
                        tokens=torch.stack(tokens, dim=1), bonus=bonus)


def accept_greedy(tree: DraftTree, target_argmax: torch.Tensor) -> AcceptResult:
    """target_argmax [B, D]: the target's greedy token after each node."""
    return AcceptResult(*dispatch("accept_greedy", accept_greedy_triton, _accept_greedy_torch,
                                  tree.tokens, tree.parents, target_argmax, tree.num_steps))


def _accept_greedy_torch(tokens, parents, target_argmax, num_steps):
    am = target_argmax.long()
    tree = DraftTree(tokens, parents, None, None, None, None, None, num_steps)
    return astuple(_walk(tree, lambda k, cur: am.gather(1, cur[:, None])[:, 0]))


def sampling_probs(logits: torch.Tensor, temperature: torch.Tensor,
                   top_p: torch.Tensor) -> torch.Tensor:
    """logits [B, D, V], temperature [B], top_p [B] -> probs [B, D, V] float32: every node's
    target distribution (kernels/sampling.target_probs: temperature <= 0 is greedy)."""
    B, D = logits.shape[:2]
    return target_probs(logits, temperature[:, None].expand(B, D), top_p[:, None].expand(B, D))


def accept_sample(tree: DraftTree, target_logits: torch.Tensor, temperature: torch.Tensor,
                  top_p: torch.Tensor, uniforms: torch.Tensor) -> AcceptResult:
    """Target-only tree sampling. target_logits [B, D, V]; uniforms [B, S+1] in [0, 1).

    At level k, x ~ p_target(. | cur) by inverse CDF with uniforms[:, k] (the engine passes
    the position uniforms of the positions the levels decide, kernels/sampling.py, so the
    draw is the one target-only sampling makes at that position). Each committed token
    is thus drawn from the target given everything committed before it, whichever branch
    the draft proposed: the output distribution is exactly the target's."""
    probs = sampling_probs(target_logits, temperature, top_p)
    cdf = torch.cumsum(probs, dim=-1)                                        # [B, D, V]
    V = probs.shape[-1]
    last_pos = last_in_support(probs)                                        # [B, D]

    def choose(k: int, cur: torch.Tensor) -> torch.Tensor:
        row = cdf.gather(1, cur[:, None, None].expand(-1, 1, V))[:, 0]       # [B, V]
        return inverse_cdf(row, last_pos.gather(1, cur[:, None])[:, 0], uniforms[:, k])

    return _walk(tree, choose)


def accept_simulated(tree: DraftTree, target_argmax: torch.Tensor, uniforms: torch.Tensor, *,
                    mean_accept_len: Optional[float] = None,
                    accept_rates: Optional[Sequence[float]] = None) -> AcceptResult:
    """Simulated acceptance along the tree's first chain (root, first child, first child, ...).

    uniforms [B, S+1] in [0, 1). Exactly one of:
      mean_accept_len m in [1, S+1]: accept_lens = floor(m) + (u0 < m - floor(m)), mean m;
      accept_rates r [S]: position k (1..S) is accepted with probability r[k-1] given k-1 was,
                          mean 1 + sum_k prod_{i<=k} r[i-1].
    accept_lens is clipped to the first chain's length (S+1 for topk 1 or D = S*K+1 trees).
    Tokens are the chain's draft tokens then target_argmax at the last accepted node (bonus).
    For topk > 1 the first chain is only one of the tree's paths: a performance proxy."""
    S = tree.num_steps
    u = uniforms.float()
    if (mean_accept_len is None) == (accept_rates is None):
        raise ValueError("accept_simulated needs exactly one of mean_accept_len, accept_rates.")
    if mean_accept_len is not None:
        if not 1.0 <= mean_accept_len <= S + 1:
            raise ValueError(f"mean_accept_len={mean_accept_len} is outside [1, {S + 1}] "
                             f"for num_steps={S}.")
        lo = math.floor(mean_accept_len)
        n = lo + (u[:, 0] < mean_accept_len - lo).long()
    else:
        rates = [float(r) for r in accept_rates]
        if len(rates) != S or not all(0.0 <= r <= 1.0 for r in rates):
            raise ValueError(f"accept_rates needs {S} probabilities in [0, 1], got {rates}.")
        # Python-float comparisons: no host-to-device copy inside a captured graph.
        ok = torch.stack([u[:, i] < rates[i] for i in range(S)], dim=1).long()   # [B, S]
        n = 1 + torch.cumprod(ok, dim=1).sum(dim=1)
    return AcceptResult(*dispatch("accept_chain", accept_chain_triton, _accept_chain_torch,
                                  tree.tokens, tree.retrieve_next_token, target_argmax, n, S))


def _accept_chain_torch(tree_tokens, next_token, target_argmax, n, S):
    """Accept the first n nodes of the first chain (n clipped to the chain's length)."""
    B, dev = tree_tokens.shape[0], tree_tokens.device
    # The first chain: chain[k] = node at depth k along first children, -1 past its end.
    chain = [torch.zeros(B, dtype=torch.long, device=dev)]
    for _ in range(S):
        prev = chain[-1]
        nxt = next_token.gather(1, prev.clamp(min=0)[:, None])[:, 0]
        chain.append(torch.where(prev >= 0, nxt, -1))
    chain = torch.stack(chain, dim=1)                                       # [B, S+1]
    n = torch.minimum(n, (chain >= 0).sum(dim=1))
    k = torch.arange(S + 1, device=dev)
    accept_index = torch.where(k < n[:, None], chain, -1)
    last = chain.gather(1, (n - 1)[:, None])[:, 0]
    bonus = target_argmax.long().gather(1, last[:, None])[:, 0]
    after = torch.cat([chain[:, 1:], torch.full_like(chain[:, :1], -1)], dim=1)
    draft_tok = tree_tokens.gather(1, after.clamp(min=0))
    tokens = torch.where(k < (n - 1)[:, None], draft_tok,
                         torch.where(k == (n - 1)[:, None], bonus[:, None], -1))
    return accept_index, n, tokens, bonus
