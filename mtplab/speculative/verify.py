"""The verify stage: the target's forward over the B*D tree nodes.

    node j of request b   token tokens[b, j], position positions[b, j] (= seq_len + depth)
                          KV written at row entry seq_len + j (the verify window)
                          attends to the prefix [0, seq_len) and to its ancestors (tree_mask)
Static shapes, no host synchronisation (CUDA-graph capturable).
"""
from __future__ import annotations

import torch

from ..kernels.attn_meta import AttnMeta


def verify(target, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor,
           seq_lens: torch.Tensor, tree_mask: torch.Tensor, max_kv: int):
    """tokens/positions [B, D], tree_mask [B, D, D] -> (logits [B, D, V], hidden [B, D, H]).
    `target` is the TargetWorker (model, KV cache, req_to_token, attention function)."""
    B, D = tokens.shape
    table = target.table
    entries = seq_lens.long()[:, None] + torch.arange(D, device=rows.device)
    out_loc = table[rows.long()[:, None], entries].long().reshape(-1)
    q_lens = torch.full_like(seq_lens, D)
    cu_q = torch.arange(B + 1, device=rows.device) * D
    meta = AttnMeta(table, rows, seq_lens + D, q_lens, cu_q, positions.reshape(-1),
                    max_q=D, max_kv=max_kv, tree_mask=tree_mask, split_kv=table.shape[1],
                    full_lanes=True)
    rec = target.model.expert_recorder
    if rec is not None:                   # the real lanes' tokens (row 0: a padded lane)
        rec.begin((rows != 0).repeat_interleave(D))
    hidden, logits = target.model(tokens.reshape(-1), positions.reshape(-1), target.kv.k,
                                  target.kv.v, out_loc, meta, target.attn_fn)
    if rec is not None:
        rec.end()
    return logits.view(B, D, -1), hidden.view(B, D, -1)
