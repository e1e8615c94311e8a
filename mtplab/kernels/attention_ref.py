"""Plain-torch paged attention: gather each lane's KV entries through the table, mask, SDPA.

Works on CPU and CUDA, has static shapes given (meta.max_q, meta.max_kv), performs no host
synchronisation, and so can be captured in a CUDA graph. Semantics: see attn_meta.py.
"""
from __future__ import annotations

import torch

from .attn_meta import AttnMeta


def visibility_mask(meta: AttnMeta, window: int) -> torch.Tensor:
    """[B, max_q, max_kv] bool: may query i of lane b see KV entry j (attn_meta.py rules)."""
    dev = meta.rows.device
    Q, M = meta.max_q, meta.max_kv
    i = torch.arange(Q, device=dev)
    j = torch.arange(M, device=dev)
    kv_lens = meta.kv_lens.long()
    q_lens = meta.q_lens.long()
    prefix = (kv_lens - (0 if meta.kv_shared else q_lens))[:, None, None]   # [B,1,1]
    jj = j[None, None, :]
    ii = i[None, :, None]
    in_kv = jj < kv_lens[:, None, None]
    tok = (meta.cu_q[:-1, None] + i[None, :]).clamp(max=meta.positions.shape[0] - 1)
    pos_q = meta.positions[tok][:, :, None]                          # [B,Q,1]
    if meta.kv_shared:
        vis = (jj < prefix).expand(meta.batch_size, Q, M)
        linear = torch.ones_like(vis)
    elif meta.tree_mask is None:
        vis = jj <= prefix + ii
        linear = torch.ones_like(vis)
    else:
        linear = jj < prefix
        tj = (jj - prefix).clamp(0, Q - 1).expand(meta.batch_size, Q, M)
        tree = torch.gather(meta.tree_mask, 2, tj) & ~linear
        vis = linear | tree
    if window > 0:
        vis = vis & (~linear | (pos_q - jj < window))
    return vis & in_kv & (ii < q_lens[:, None, None])


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        meta: AttnMeta, sm_scale: float, window: int = 0) -> torch.Tensor:
    """q [T,Hq,d], k_cache/v_cache [N,Hkv,d] -> out [T,Hq,d] (dtype of q)."""
    T, Hq, d = q.shape
    Hkv = k_cache.shape[1]
    g = Hq // Hkv
    B, Q, M = meta.batch_size, meta.max_q, meta.max_kv
    dev = q.device
    i = torch.arange(Q, device=dev)
    qvalid = i[None, :] < meta.q_lens.long()[:, None]                 # [B,Q]
    tok = meta.cu_q[:-1, None] + i[None, :]
    tok_c = torch.where(qvalid, tok, torch.zeros_like(tok))
    qp = q[tok_c].view(B, Q, Hkv, g, d).float()
    slots = meta.table[meta.rows][:, :M].long()                      # [B,M]
    k = k_cache[slots].float()                                       # [B,M,Hkv,d]
    v = v_cache[slots].float()
    scores = torch.einsum("bqhgd,bmhd->bhgqm", qp, k) * sm_scale
    vis = visibility_mask(meta, window)[:, None, None]               # [B,1,1,Q,M]
    scores = scores.masked_fill(~vis, float("-inf"))
    # Padded query rows see nothing; keep them finite (they are dropped below).
    scores = torch.where(vis.any(-1, keepdim=True), scores, torch.zeros_like(scores))
    probs = torch.softmax(scores, dim=-1)
    res = torch.einsum("bhgqm,bmhd->bqhgd", probs, v).reshape(B, Q, Hq, d).to(q.dtype)
    out = q.new_zeros(T + 1, Hq, d)
    idx = torch.where(qvalid, tok, torch.full_like(tok, T))
    out.index_put_((idx.reshape(-1),), res.reshape(B * Q, Hq, d))
    return out[:T]
