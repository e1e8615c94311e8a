"""Draft KV layout inside a row for a draft that owns KV (docs/design.md "KV memory"), pure
index math.

Per request, with last = seq_len % P, base = seq_len - last, N = ceil((last + S) / P),
R = N*P (one branch's page-aligned region):

    row entries  [0 .......... base) [base ...... base+R) [base+R .... base+2R) ... base+K*R
                  prefix (committed)   branch 0              branch 1
                                       |tail|d0 d1 .. |       |hole|d0 d1 .. |
                                        last                   last
    branch t, draft step s  ->  entry base + t*R + last + s
    branch 0's first `last` entries are the real prefix tail; branch t >= 1's are holes,
    filled by copying the prefix tail (duplicate_prefix_tail), so a paged kernel reading
    branch t's first page sees a coherent page: prefix tail, then branch t's drafts.

P == 1 (last = 0, R = S) or K == 1 (branch 0 only) is the linear layout: seq_len + t*S + s.
Bound: holey (P > 1, K > 1): base + K*R - seq_len = K*N*P - last <= K*ceil((P-1+S)/P)*P
<= alloc_len_per_decode (sizing.py); linear: the last draft is seq_len + K*S - 1. Either way
every entry used is below seq_len + alloc_len_per_decode <= row_width for seq_len <= context_len.

All functions have static shapes and no host synchronisation (CUDA-graph capturable).
"""
from __future__ import annotations

import math

import torch


def _geometry(seq_lens: torch.Tensor, num_steps: int, page_size: int):
    """-> (last, base, region) [B] int64."""
    seq = seq_lens.long()
    last = seq % page_size
    n_pages = torch.div(last + num_steps + page_size - 1, page_size, rounding_mode="floor")
    return last, seq - last, n_pages * page_size


def _row_gather(req_to_token: torch.Tensor, rows: torch.Tensor,
                entries: torch.Tensor) -> torch.Tensor:
    """req_to_token[rows[b], entries[b, ...]] for entries [B, ...], clamped to the row."""
    flat = entries.reshape(entries.shape[0], math.prod(entries.shape[1:]))
    flat = flat.clamp(0, req_to_token.shape[1] - 1)
    return req_to_token[rows.long()[:, None], flat].long().reshape(entries.shape)


def draft_entries(seq_lens: torch.Tensor, num_steps: int, topk: int,
                  page_size: int) -> torch.Tensor:
    """[B, K, S] int64 row entry of branch t's draft step s: base + t*R + last + s."""
    last, base, region = _geometry(seq_lens, num_steps, page_size)
    dev = seq_lens.device
    t = torch.arange(topk, device=dev)[None, :, None]
    s = torch.arange(num_steps, device=dev)[None, None, :]
    return (base + last)[:, None, None] + t * region[:, None, None] + s


def draft_slots(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                num_steps: int, topk: int, page_size: int) -> torch.Tensor:
    """[B, K, S] int64 KV slots of the draft tokens (step s's out_cache_loc: [:, :, s])."""
    return _row_gather(req_to_token, rows, draft_entries(seq_lens, num_steps, topk, page_size))


def prefix_tail_moves(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                      num_steps: int, topk: int, page_size: int):
    """Hole-filling copies, lanes [B, K-1, P-1] for branches t >= 1 and j < P-1:

        valid = j < last;  src = slot of entry base + j;  dst = slot of entry base + t*R + j
    Invalid lanes copy dst onto itself (entry base + t*R + j lies in branch t's own region and
    no valid lane touches it). Returns (src, dst, valid)."""
    last, base, region = _geometry(seq_lens, num_steps, page_size)
    dev = seq_lens.device
    t = torch.arange(1, topk, device=dev)[None, :, None]
    j = torch.arange(page_size - 1, device=dev)[None, None, :]
    B = seq_lens.shape[0]
    shape = (B, topk - 1, page_size - 1)
    valid = (j < last[:, None, None]).expand(shape)
    dst = _row_gather(req_to_token, rows, base[:, None, None] + t * region[:, None, None] + j)
    src = _row_gather(req_to_token, rows, (base[:, None, None] + j).expand(shape))
    return torch.where(valid, src, dst), dst, valid


def duplicate_prefix_tail(kv_k: torch.Tensor, kv_v: torch.Tensor, req_to_token: torch.Tensor,
                          rows: torch.Tensor, seq_lens: torch.Tensor, num_steps: int, topk: int,
                          page_size: int) -> None:
    """Fill branch t >= 1's holes with the prefix tail, in place, every layer at once.
    kv_k/kv_v [num_layers, num_slots, ...] (the draft pool). Writes exactly seq_len % P slots
    per branch t >= 1 (plus same-value self copies on invalid lanes)."""
    src, dst, _ = prefix_tail_moves(req_to_token, rows, seq_lens, num_steps, topk, page_size)
    src, dst = src.reshape(-1), dst.reshape(-1)
    for cache in (kv_k, kv_v):
        cache[:, dst] = cache[:, src]


def branch_table(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                 num_steps: int, topk: int, page_size: int, width: int) -> torch.Tensor:
    """[B*K, width] virtual rows (dtype of req_to_token), lane b*K + t:

        entries [0, base)          -> the request's row entries [0, base)
        entries [base, base + R)   -> branch t's region: row entries base + t*R + (e - base)
        entries >= base + R        -> slot 0 (never visible: kv_len <= base + last + S)
    With kv_lens = seq_len + s + 1, draft step s of branch t sees the prefix, then (holes =
    tail copy) its own drafts 0..s. Use table=branch_table, rows=arange(B*K)."""
    last, base, region = _geometry(seq_lens, num_steps, page_size)
    B = seq_lens.shape[0]
    dev = seq_lens.device
    e = torch.arange(width, device=dev)[None, None, :]
    t = torch.arange(topk, device=dev)[None, :, None]
    base3, region3 = base[:, None, None], region[:, None, None]
    src = torch.where(e < base3, e, e + t * region3).expand(B, topk, width)
    table = _row_gather(req_to_token, rows, src)
    table = torch.where(e < base3 + region3, table, torch.zeros_like(table))
    return table.reshape(B * topk, width).to(req_to_token.dtype)
