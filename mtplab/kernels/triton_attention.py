"""Triton paged attention: a decode kernel (one query per lane) and an extend kernel (any q_len).

Same contract as `attention_ref.paged_attention_ref` (semantics in attn_meta.py). KV entry j of
lane b lives in cache slot `table[rows[b], j]`, so pages of any size (and shuffled pages) are
just a table; the kernels gather BLOCK_N slots at a time and never see a page size.

Decode (max_q == 1, no tree mask), grid (B, Hkv): one program per (lane, kv-head) serves the
whole GQA group, so each K/V row is loaded once for all GROUP query heads.

    q rows (GROUP heads, padded    KV entries of lane b, walked in BLOCK_N chunks
    to BLOCK_G >= 16 for tl.dot)   [lo ........................................ kv_len)
    +---------+                     +---------+---------+---------+----
    | h0      |   s = q @ K^T       | slots   | slots   | slots   |  ...   online softmax:
    | h1      |  [BLOCK_G,BLOCK_N]  | table[] | table[] | table[] |        m, l, acc in fp32
    | ...     |                     +---------+---------+---------+----
    +---------+

Extend/prefill, grid (cdiv(max_q, TILE_Q), Hkv, B): one program per (query tile, kv-head,
lane). A tile's BLOCK_M rows are TILE_Q queries x GROUP heads (row r -> query r // GROUP,
head r % GROUP of the group), so K/V are again loaded once per GQA group.

                 prefix = kv_len - q_len          q_len new entries
    KV j:   [0 ...................... prefix)[prefix ......... kv_len)
    tile m:  all visible (minus window)       causal: j <= prefix + i
             queries i in [m*TILE_Q, (m+1)*TILE_Q)   tree: tree_mask[b, i, j - prefix]
    The key loop runs over [lo, hi) in BLOCK_N steps: hi stops at the tile's causal diagonal
    (kv_len under a tree mask), lo skips entries outside every row's sliding window.

Deterministic mode (RunConfig.deterministic), grid (B, max_q, Hkv): one program per (lane,
query, kv-head), decode, prefill and tree verify alike. The decode and extend kernels above do
not reduce a query's keys the same way: their tiles hold a different number of rows (BLOCK_G vs
BLOCK_M, so different MMA shapes), the extend loop starts its blocks at the tile's lo, and a
tree node's ancestors sit at scattered entries (seq_len + node index), while target-only
decoding holds the same tokens at consecutive entries. The per-query kernel instead walks the
query's *logical* key sequence, its visible entries in position order:

    linear (decode, prefill)  L -> entry L,                     L in [lo, prefix + i]
    tree node i               L -> entry L          for L < prefix
                              L -> prefix + node    of the visible node of rank L - prefix
                                                    (rank = order by position, ties by index)
    chunks [lo + c*BLOCK_N, lo + (c+1)*BLOCK_N), lo = max(pos - window + 1, 0) (min prefix)

A tree node at depth k (position p) and a target-only decode at position p then see the same
tokens in the same order, chunked at the same offsets, through one compiled kernel (BLOCK_G,
BLOCK_N, HEAD_D fixed by the model): the same bits, given the same K/V bits. No split-KV.

Invariants
  * kv_lens / q_lens / cu_q / positions / rows / table are read on the device only; grids use
    only static ints (B, heads, meta.max_q), so the call is CUDA-graph capturable.
  * A query row i >= q_len (padding of a tile, or a whole padded tile) loads nothing and stores
    nothing: each output token is written only by the (lane, row) that owns it. Tokens covered by
    no lane stay zero, as in the reference.
  * Masked scores are -inf while the running max starts at a finite -1e30, so exp2 never sees
    (-inf) - (-inf); a row with no visible entry ends with l == 0 and writes zeros (the reference
    is degenerate there).
  * Accumulation is fp32; for fp32 inputs the dots run in IEEE fp32 (no TF32).
  * No window is passed to the kernels as _NO_WINDOW (2**30, above any position), so the
    window test `pos - j < window` needs no branch. Decode has one query per lane, so starting
    its loop at lo = pos - window + 1 is the whole window check (j >= lo <=> pos - j < window).
"""
from __future__ import annotations

import math

import torch

from ..lazy_triton import tl, triton
from .attn_meta import AttnMeta

_LOG2E = 1.4426950408889634
_NEG_INIT = tl.constexpr(-1.0e30)   # finite start of the running max (see invariants)
_NO_WINDOW = tl.constexpr(1 << 30)  # the kernels' `window` when there is none (> any position)


@triton.jit
def _load_keys(Table, K, row, j, j_ok, kvh, d, stride_tr, stride_kn, stride_kh):
    """Slots of row entries j (masked by j_ok) and their keys, transposed: [HEAD_D, BLOCK_N]."""
    slot = tl.load(Table + row * stride_tr + j, mask=j_ok, other=0).to(tl.int64)
    kt = tl.load(K + slot[None, :] * stride_kn + kvh * stride_kh + d[:, None],
                 mask=j_ok[None, :], other=0.0)
    return slot, kt


@triton.jit
def _online_softmax_step(s, m_i, l_i, acc, V, slot, j_ok, kvh, d, stride_vn, stride_vh,
                         DOT_PREC: tl.constexpr):
    """One key block of the online softmax (scores `s` in the log2 domain, invisible = -inf):
    rescale the running max/sum/accumulator and add this block's p @ V."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(V + slot[:, None] * stride_vn + kvh * stride_vh + d[None, :],
                mask=j_ok[:, None], other=0.0)                              # [BLOCK_N, HEAD_D]
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def _decode_kernel(Q, K, V, O, Table, Rows, KvLens, QLens, CuQ, Pos,
                   stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                   stride_ot, stride_oh, stride_tr,
                   qk_scale, window,
                   GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_D: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_PREC: tl.constexpr):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    row = tl.load(Rows + b).to(tl.int64)
    kv_len = tl.load(KvLens + b).to(tl.int32)
    q_len = tl.load(QLens + b).to(tl.int32)  # 0 or 1; a lane with q_len == 0 owns no token
    t = tl.load(CuQ + b).to(tl.int64)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_D)
    n = tl.arange(0, BLOCK_N)
    g_ok = g < GROUP * q_len
    hq = kvh * GROUP + g
    q = tl.load(Q + t * stride_qt + hq[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None], other=0.0)
    pos = tl.load(Pos + t, mask=q_len > 0, other=0).to(tl.int32)

    # Visible: lo <= j < kv_len; j >= lo is exactly pos - j < window, so no per-entry check.
    hi = kv_len * q_len
    lo = tl.maximum(pos - window + 1, 0)

    m_i = tl.full([BLOCK_G], _NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + n
        j_ok = j < hi
        slot, kt = _load_keys(Table, K, row, j, j_ok, kvh, d, stride_tr, stride_kn, stride_kh)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale              # log2 domain
        s = tl.where(j_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, V, slot, j_ok, kvh, d,
                                             stride_vn, stride_vh, DOT_PREC)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + t * stride_ot + hq[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=g_ok[:, None])


@triton.jit
def _extend_kernel(Q, K, V, O, Table, Rows, KvLens, QLens, CuQ, Pos, Tree,
                   stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                   stride_ot, stride_oh, stride_tr, stride_mb, stride_mi,
                   qk_scale, window,
                   GROUP: tl.constexpr, TILE_Q: tl.constexpr, HEAD_D: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TREE: tl.constexpr,
                   DOT_PREC: tl.constexpr):
    mb = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    row = tl.load(Rows + b).to(tl.int64)
    kv_len = tl.load(KvLens + b).to(tl.int32)
    q_len = tl.load(QLens + b).to(tl.int32)
    t0 = tl.load(CuQ + b).to(tl.int64)
    prefix = kv_len - q_len

    # Tile row r is (query i, head h) = (mb*TILE_Q + r // GROUP, kvh*GROUP + r % GROUP); rows
    # r >= TILE_Q*GROUP (BLOCK_M padding) and queries i >= q_len: no load, no store.
    r = tl.arange(0, BLOCK_M)
    i = mb * TILE_Q + r // GROUP
    h = kvh * GROUP + r % GROUP
    i_ok = (r < TILE_Q * GROUP) & (i < q_len)
    d = tl.arange(0, HEAD_D)
    n = tl.arange(0, BLOCK_N)
    tok = t0 + i
    q = tl.load(Q + tok[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :],
                mask=i_ok[:, None], other=0.0)
    pos = tl.load(Pos + tok, mask=i_ok, other=0).to(tl.int32)

    # Key range [lo, hi): entries past it are invisible to every row of the tile.
    if HAS_TREE:
        hi = kv_len
    else:
        hi = tl.minimum(kv_len, prefix + (mb + 1) * TILE_Q)   # causal diagonal of the last row
    hi = tl.where(mb * TILE_Q < q_len, hi, 0)                 # whole tile is padding
    pos_min = tl.min(tl.where(i_ok, pos, _NO_WINDOW), 0)
    lo = tl.maximum(pos_min - window + 1, 0)
    if HAS_TREE:
        lo = tl.minimum(lo, prefix)   # the window never hides tree entries

    m_i = tl.full([BLOCK_M], _NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        j = start + n
        j_ok = j < kv_len
        slot, kt = _load_keys(Table, K, row, j, j_ok, kvh, d, stride_tr, stride_kn, stride_kh)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale              # log2 domain

        in_win = pos[:, None] - j[None, :] < window
        if HAS_TREE:
            linear = (j < prefix)[None, :]
            t_ok = i_ok[:, None] & ((j >= prefix) & j_ok)[None, :]
            tm = tl.load(Tree + b * stride_mb + i[:, None] * stride_mi + (j - prefix)[None, :],
                         mask=t_ok, other=0)
            vis = (linear & in_win) | (tm != 0)
        else:
            vis = (j[None, :] <= prefix + i[:, None]) & in_win
        vis = vis & j_ok[None, :] & i_ok[:, None]

        s = tl.where(vis, s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, V, slot, j_ok, kvh, d,
                                             stride_vn, stride_vh, DOT_PREC)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + tok[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=i_ok[:, None])


@triton.jit
def _det_kernel(Q, K, V, O, Table, Rows, KvLens, QLens, CuQ, Pos, Tree,
                stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                stride_ot, stride_oh, stride_tr, stride_mb, stride_mi,
                qk_scale, window,
                GROUP: tl.constexpr, BLOCK_G: tl.constexpr, HEAD_D: tl.constexpr,
                BLOCK_N: tl.constexpr, MAX_Q: tl.constexpr, HAS_TREE: tl.constexpr,
                DOT_PREC: tl.constexpr):
    """Deterministic mode, grid (B, max_q, Hkv): one program per (lane, query, kv-head).
    The query's visible entries, in position order, form its logical key sequence
    L = 0, 1, ...; the loop walks it in BLOCK_N chunks from lo. See paged_attention_triton."""
    b = tl.program_id(0)
    i = tl.program_id(1)
    kvh = tl.program_id(2)
    row = tl.load(Rows + b).to(tl.int64)
    kv_len = tl.load(KvLens + b).to(tl.int32)
    q_len = tl.load(QLens + b).to(tl.int32)
    t = tl.load(CuQ + b).to(tl.int64) + i
    prefix = kv_len - q_len
    q_ok = i < q_len
    live = q_ok.to(tl.int32)       # masks scale by it (no vector & scalar-bool in the interpreter)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, HEAD_D)
    n = tl.arange(0, BLOCK_N)
    g_ok = g < GROUP * live
    hq = kvh * GROUP + g
    q = tl.load(Q + t * stride_qt + hq[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None], other=0.0)
    pos = tl.load(Pos + t, mask=q_ok, other=0).to(tl.int32)
    lo = tl.maximum(pos - window + 1, 0)           # j >= lo <=> pos - j < window (linear part)
    if HAS_TREE:
        # Visible tree nodes of query i, ranked by position (ties by node index): the node of
        # rank k is logical entry prefix + k. Integer work on MAX_Q x MAX_Q, exact.
        jq = tl.arange(0, MAX_Q)
        j_in = jq < q_len
        vis = tl.load(Tree + b * stride_mb + i * stride_mi + jq, mask=jq < q_len * live,
                      other=0) != 0
        npos = tl.load(Pos + (t - i) + jq, mask=j_in, other=0).to(tl.int32)
        before = (npos[None, :] < npos[:, None]) | \
            ((npos[None, :] == npos[:, None]) & (jq[None, :] < jq[:, None]))
        rank = tl.sum((vis[None, :] & before).to(tl.int32), 1)                 # [MAX_Q]
        hi = prefix + tl.sum(vis.to(tl.int32), 0)
        lo = tl.minimum(lo, prefix)                # the window never hides tree entries
    else:
        hi = prefix + i + 1                        # causal: entries [0, prefix + i]
    hi = tl.where(q_ok, hi, 0)

    m_i = tl.full([BLOCK_G], _NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        L = start + n
        l_ok = L < hi
        if HAS_TREE:
            k_rank = L - prefix                    # >= 0: the tree node of that rank
            hit = vis[None, :] & (rank[None, :] == k_rank[:, None])             # [BLOCK_N, MAX_Q]
            node = tl.sum(tl.where(hit, jq[None, :], 0), 1)
            j = tl.where(L < prefix, L, prefix + node)
        else:
            j = L
        slot, kt = _load_keys(Table, K, row, j, l_ok, kvh, d, stride_tr, stride_kn, stride_kh)
        s = tl.dot(q, kt, input_precision=DOT_PREC) * qk_scale              # log2 domain
        s = tl.where(l_ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(s, m_i, l_i, acc, V, slot, l_ok, kvh, d,
                                             stride_vn, stride_vh, DOT_PREC)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(O + t * stride_ot + hq[:, None] * stride_oh + d[None, :],
             out.to(O.dtype.element_ty), mask=g_ok[:, None])


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    d = q.shape[-1]
    if d < 16 or d > 256 or d & (d - 1):
        raise ValueError(f"paged_attention_triton: head_dim must be a power of two in [16, 256], "
                         f"got {d}")
    if q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"Hq={q.shape[1]} is not a multiple of Hkv={k_cache.shape[1]}")
    if not (k_cache.dtype == v_cache.dtype == q.dtype):
        raise ValueError("q, k_cache and v_cache must share a dtype")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in head_dim")


def paged_attention_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           meta: AttnMeta, sm_scale: float, window: int = 0,
                           deterministic: bool = False) -> torch.Tensor:
    """q [T,Hq,d], k_cache/v_cache [N,Hkv,d] -> out [T,Hq,d] (dtype of q); see attn_meta.py.

    Decode kernel when meta.max_q == 1 and there is no tree mask, extend kernel otherwise;
    deterministic=True: the per-query kernel for every shape (see the module docstring).
    """
    _check(q, k_cache, v_cache)
    T, Hq, d = q.shape
    Hkv = k_cache.shape[1]
    group = Hq // Hkv
    B = meta.batch_size
    out = q.new_zeros(T, Hq, d)   # static size; tokens of no lane stay zero (as the reference)
    if B == 0 or T == 0:
        return out
    qk_scale = float(sm_scale) * _LOG2E
    win = int(window) if window > 0 else _NO_WINDOW.value
    dot_prec = "ieee" if q.dtype == torch.float32 else "tf32"   # tf32 == default for 16-bit
    common = (q, k_cache, v_cache, out, meta.table, meta.rows, meta.kv_lens, meta.q_lens,
              meta.cu_q, meta.positions)
    strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
               v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
               meta.table.stride(0))
    block_n = 64 if d <= 64 else 32
    block_g = max(16, triton.next_power_of_2(group))

    if deterministic:
        tree = meta.tree_mask
        has_tree = tree is not None
        tree = tree.view(torch.uint8) if has_tree else meta.positions   # unread without a tree
        tree_strides = (tree.stride(0), tree.stride(1)) if has_tree else (0, 0)
        _det_kernel[(B, meta.max_q, Hkv)](
            *common, tree, *strides, *tree_strides, qk_scale, win,
            GROUP=group, BLOCK_G=block_g, HEAD_D=d, BLOCK_N=block_n,
            MAX_Q=max(16, triton.next_power_of_2(meta.max_q)) if has_tree else 16,
            HAS_TREE=has_tree, DOT_PREC=dot_prec)
        return out

    if meta.max_q == 1 and meta.tree_mask is None:
        _decode_kernel[(B, Hkv)](
            *common, *strides, qk_scale, win,
            GROUP=group, BLOCK_G=block_g, HEAD_D=d,
            BLOCK_N=block_n, DOT_PREC=dot_prec)
        return out

    tree = meta.tree_mask
    has_tree = tree is not None
    if has_tree:
        tree = tree.view(torch.uint8)          # same storage, loadable as bytes
        tree_strides = (tree.stride(0), tree.stride(1))
    else:
        tree = meta.positions                  # never read when HAS_TREE is False
        tree_strides = (0, 0)
    # BLOCK_M rows = TILE_Q queries x GROUP heads (+ padding to a power of two >= 16).
    block_m = min(max(64, triton.next_power_of_2(group)),
                  max(16, triton.next_power_of_2(group * meta.max_q)))
    tile_q = block_m // group
    grid = (math.ceil(meta.max_q / tile_q), Hkv, B)
    _extend_kernel[grid](
        *common, tree, *strides, *tree_strides, qk_scale, win,
        GROUP=group, TILE_Q=tile_q, HEAD_D=d, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_TREE=has_tree, DOT_PREC=dot_prec)
    return out
