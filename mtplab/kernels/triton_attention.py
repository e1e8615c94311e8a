"""Triton paged attention: a split-KV kernel (any lane whose queries fit one tile: decode,
tree verify, draft steps) and an extend kernel (long q: prefill).

Same contract as `attention_ref.paged_attention_ref` (semantics in attn_meta.py). KV entry j of
lane b lives in cache slot `table[rows[b], j]`, so pages of any size (and shuffled pages) are
just a table; the kernels gather BLOCK_N slots at a time and never see a page size.

Split-KV ("flash-decoding"), grid (parts, Hkv, B). One program holds ALL of lane b's q_len
queries x the GROUP query heads of KV head kvh as one tile (row r -> query r // GROUP, head
r % GROUP), so each K/V entry is loaded once for every query of the lane: a verify tree's D
nodes, a Frozen-KV draft step's K branches (kv_shared), a decode's one token. The row is cut
into parts so that bs 1 with 8 KV heads still fills the GPU:

    entries of lane b:  [lo ................................ p_lin)[p_lin .. kv_len)
                         shared part: every query sees it (window)   tail: the lane's own
                         split 0 | split 1 | ... | split ns-1       entries (MODE 1 causal,
                         BLOCK_N-aligned chunks of cdiv(n, ns)       MODE 2 tree mask): one
                                                                     more part
    MODE 0 (decode, kv_shared): p_lin = kv_len, no tail.  lo = max(min pos - window + 1, 0):
    a sliding layer reads only its window.
    part p -> Part[t, h, p, :] (unnormalised fp32), ML[t, h, p] = (running max, sum)
    reduce, grid (B, max_q, Hq): out = sum_p acc_p 2^(m_p - M) / sum_p l_p 2^(m_p - M), the
    parts in index order (no atomics: the same bits on every run)
ns = split_count(B x Hkv, split_kv, SMs, launch): about launch.per_sm programs per SM, never
chunks under launch.min_chunk entries of the longest row (the launch of the lanes' shape
class, LAUNCHES); ns == 1 (large batches) writes the output directly, with
no partials and no reduce launch. ns depends only on static ints (B, Hkv, meta.split_kv: the
row width W in eager and captured steps alike), so a CUDA graph captures one plan and an eager
step of the same lanes makes the same one; the chunk size is computed on the device from kv_len.

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
query, kv-head), decode, prefill and tree verify alike. The split and extend kernels above do
not reduce a query's keys the same way: their tiles hold a different number of rows (so
different MMA shapes), the split plan depends on the batch, the extend loop starts its blocks
at the tile's lo, and a tree node's ancestors sit at scattered entries (seq_len + node index),
while target-only decoding holds the same tokens at consecutive entries. The per-query kernel
instead walks the query's *logical* key sequence, its visible entries in position order:

    linear (decode, prefill)  L -> entry L,                     L in [lo, prefix + i]
    tree node i               L -> entry L          for L < prefix
                              L -> prefix + node    of the visible node of rank L - prefix
                                                    (rank = order by position, ties by index)
    chunks [lo + c*BLOCK_N, lo + (c+1)*BLOCK_N), lo = max(pos - window + 1, 0) (min prefix)

A tree node at depth k (position p) and a target-only decode at position p then see the same
tokens in the same order, chunked at the same offsets, through one compiled kernel (BLOCK_G,
BLOCK_N, HEAD_D fixed by the model): the same bits, given the same K/V bits. Deterministic
mode keeps this kernel and so does not split the row: one program per (lane, query, KV head),
as slow at long context as the per-lane kernels were before split-KV (the split plan depends on
the batch size, which a batch-invariant reduction cannot).

Invariants
  * kv_lens / q_lens / cu_q / positions / rows / table are read on the device only; grids use
    only static ints (B, heads, meta.max_q), so the call is CUDA-graph capturable.
  * A query row i >= q_len (padding of a tile, or a whole padded tile) loads nothing and stores
    nothing: each output token is written only by the (lane, row) that owns it, every head of
    it (a lane with no visible entry writes zeros). Tokens covered by no lane stay zero, as in
    the reference; under AttnMeta.full_lanes there are none and the output is not zeroed.
  * Masked scores are -inf while the running max starts at a finite -1e30, so exp2 never sees
    (-inf) - (-inf); a row with no visible entry ends with l == 0 and writes zeros (the reference
    is degenerate there).
  * Accumulation is fp32; for fp32 inputs the dots run in IEEE fp32 (no TF32).
  * No window is passed to the kernels as _NO_WINDOW (2**30, above any position), so the
    window test `pos - j < window` needs no branch. Every kernel starts its key loop at the
    window's lower end (lo = min pos - window + 1), so a sliding layer never loads an entry
    outside the window of its oldest query; a decode's one query needs no further check.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import torch

from ..lazy_triton import tl, triton
from .attn_meta import AttnMeta

_LOG2E = 1.4426950408889634
_NEG_INIT = tl.constexpr(-1.0e30)   # finite start of the running max (see invariants)
_NO_WINDOW = tl.constexpr(1 << 30)  # the kernels' `window` when there is none (> any position)
SPLIT_MAX_ROWS = 128   # lanes of up to this many (query, head) rows per KV head: split kernel
MIN_CHUNK = 256        # fewest row entries per split worth a program of their own
PROGRAMS_PER_SM = 4    # split plan (decode class): about this many split programs per SM in all
_SMS: dict = {}


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100 SXM) -- the interpreter
    stands in for one of those on the CPU."""
    if device.type != "cuda":
        return 132
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SMS:
        _SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SMS[idx]


@dataclass(frozen=True)
class SplitLaunch:
    """The split kernel's launch for one shape class: keys a tile (BLOCK_N), warps, pipeline
    stages, and the split plan's aim: about `per_sm` programs per SM in all, never chunks
    under `min_chunk` entries of the longest row."""
    block_n: int
    warps: int
    stages: int
    per_sm: int = PROGRAMS_PER_SM
    min_chunk: int = MIN_CHUNK


# Shape class -> head_dim -> launch, from the launch sweep of `python -m
# benchmarks.bench_long_context --only attn` on the H100 (docs/results/long_context/):
#   decode  one query a lane, or a draft step's branches (MODE 0), and fp32 verifies
#   verify  a lane's causal or tree queries (MODE 1, 2) in 16 bits: 128 keys a tile in two
#           stages over fewer, longer chunks (32k rows: 32 splits at bs 1, 17 at bs 8), where
#           the decode launch took 1.2-1.6x as long; fp32 tiles that wide overflow shared memory
LAUNCHES = {"decode": {64: SplitLaunch(64, 4, 3), 128: SplitLaunch(32, 4, 3),
                       256: SplitLaunch(32, 4, 3),
                       512: SplitLaunch(16, 4, 2)},   # Gemma-4's global layers: half the keys
            "verify": {128: SplitLaunch(128, 4, 2, per_sm=8, min_chunk=1024)}}
OTHER_HEAD_DIM = SplitLaunch(32, 4, 2)


def split_launch(head_dim: int, block_m: int, verify: bool = False) -> SplitLaunch:
    """The split kernel's launch for a tile of block_m rows: the verify class's where
    `verify` and it has one for head_dim, else the decode class's; 8 warps from 128 rows."""
    table = LAUNCHES["verify"] if verify and head_dim in LAUNCHES["verify"] else LAUNCHES[
        "decode"]
    launch = table.get(head_dim, OTHER_HEAD_DIM)
    return replace(launch, warps=8) if block_m >= 128 else launch


def split_count(programs: int, max_kv: int, sms: int, launch: SplitLaunch) -> int:
    """Splits per (lane, KV head): about launch.per_sm programs per SM in all, never chunks
    under launch.min_chunk entries of the longest row (max_kv is static, so a CUDA graph
    keeps it)."""
    want = -(-launch.per_sm * sms // max(programs, 1))
    return max(1, min(want, -(-max_kv // launch.min_chunk)))


def split_plan(meta: AttnMeta, head_dim: int, group: int, Hkv: int, dtype: torch.dtype,
               sms: int) -> tuple[int, int, SplitLaunch, int]:
    """(MODE, BLOCK_M, launch, splits) of the split kernel for these lanes (module doc)."""
    mode = 2 if meta.tree_mask is not None else (0 if meta.kv_shared or meta.max_q == 1
                                                 else 1)
    block_m = max(16, triton.next_power_of_2(meta.max_q * group))
    launch = split_launch(head_dim, block_m, verify=mode != 0 and dtype != torch.float32)
    return mode, block_m, launch, split_count(meta.batch_size * Hkv,
                                              meta.split_kv or meta.max_kv, sms, launch)


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
def _split_kernel(Q, K, V, O, Part, ML, Table, Rows, KvLens, QLens, CuQ, Pos, Tree,
                  stride_qt, stride_qh, stride_kn, stride_kh, stride_vn, stride_vh,
                  stride_ot, stride_oh, stride_tr, stride_mb, stride_mi,
                  stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ls,
                  qk_scale, window, num_splits,
                  GROUP: tl.constexpr, MAX_Q: tl.constexpr, HEAD_D: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, MODE: tl.constexpr,
                  DIRECT: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_PREC: tl.constexpr):
    """Split-KV, grid (splits, Hkv, B): program (s, kvh, b) holds all q_len queries x GROUP
    heads of lane b (one tile) and reduces its part of the row; see paged_attention_triton."""
    s_id = tl.program_id(0)
    kvh = tl.program_id(1)
    b = tl.program_id(2)
    row = tl.load(Rows + b).to(tl.int64)
    kv_len = tl.load(KvLens + b).to(tl.int32)
    q_len = tl.load(QLens + b).to(tl.int32)
    t0 = tl.load(CuQ + b).to(tl.int64)

    r = tl.arange(0, BLOCK_M)
    i = r // GROUP
    h = kvh * GROUP + r % GROUP
    i_ok = (r < MAX_Q * GROUP) & (i < q_len)
    d = tl.arange(0, HEAD_D)
    n = tl.arange(0, BLOCK_N)
    tok = t0 + i
    q = tl.load(Q + tok[:, None] * stride_qt + h[:, None] * stride_qh + d[None, :],
                mask=i_ok[:, None], other=0.0)
    pos = tl.load(Pos + tok, mask=i_ok, other=0).to(tl.int32)

    # The shared part [lo, p_lin) is seen by every query (window aside); MODE 1/2 lanes have a
    # tail [p_lin, kv_len) of their own entries, causal (1) or under the tree mask (2).
    if MODE == 0:
        p_lin = kv_len
    else:
        p_lin = kv_len - q_len
    pos_min = tl.min(tl.where(i_ok, pos, _NO_WINDOW), 0)
    lo = tl.minimum(tl.maximum(pos_min - window + 1, 0), p_lin)
    if DIRECT:                       # one program per lane and head: the whole row
        start = lo
        end = kv_len
    else:
        # splits 0..num_splits-1: BLOCK_N-aligned chunks of [lo, p_lin); split num_splits
        # (MODE 1/2 only): the tail
        n_lin = p_lin - lo
        chunk = tl.cdiv(tl.cdiv(n_lin, num_splits), BLOCK_N) * BLOCK_N
        tail = s_id >= num_splits
        start = tl.where(tail, p_lin, lo + s_id * chunk)
        end = tl.where(tail, kv_len, tl.minimum(lo + (s_id + 1) * chunk, p_lin))
    end = tl.where(q_len > 0, end, start)

    m_i = tl.full([BLOCK_M], _NEG_INIT, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    # The shared part of [start, end): no mask but the window's (a padded row computes
    # scores of q = 0 and is never stored).
    hi = tl.minimum(end, p_lin)
    for st in range(start, hi, BLOCK_N):
        j = st + n
        j_ok = j < hi
        slot = tl.load(Table + row * stride_tr + j, mask=j_ok, other=0).to(tl.int64)
        k = tl.load(K + slot[:, None] * stride_kn + kvh * stride_kh + d[None, :],
                    mask=j_ok[:, None], other=0.0)                          # [BLOCK_N, HEAD_D]
        sc = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale   # log2 domain
        if HAS_WINDOW:
            vis = (pos[:, None] - j[None, :] < window) & j_ok[None, :]
        else:
            vis = j_ok[None, :]
        sc = tl.where(vis, sc, float("-inf"))
        m_i, l_i, acc = _online_softmax_step(sc, m_i, l_i, acc, V, slot, j_ok, kvh, d,
                                             stride_vn, stride_vh, DOT_PREC)
    if MODE != 0:   # the tail: the lane's own entries, causal or under the tree mask
        for st in range(tl.maximum(start, p_lin), end, BLOCK_N):
            j = st + n
            j_ok = j < end
            slot = tl.load(Table + row * stride_tr + j, mask=j_ok, other=0).to(tl.int64)
            k = tl.load(K + slot[:, None] * stride_kn + kvh * stride_kh + d[None, :],
                        mask=j_ok[:, None], other=0.0)
            sc = tl.dot(q, tl.trans(k), input_precision=DOT_PREC) * qk_scale
            if MODE == 2:
                t_ok = i_ok[:, None] & j_ok[None, :]
                tm = tl.load(Tree + b * stride_mb + i[:, None] * stride_mi
                             + (j - p_lin)[None, :], mask=t_ok, other=0)
                vis = (tm != 0) & t_ok
            else:
                vis = ((j[None, :] <= p_lin + i[:, None]) & (pos[:, None] - j[None, :] < window)
                       & j_ok[None, :] & i_ok[:, None])
            sc = tl.where(vis, sc, float("-inf"))
            m_i, l_i, acc = _online_softmax_step(sc, m_i, l_i, acc, V, slot, j_ok, kvh, d,
                                                 stride_vn, stride_vh, DOT_PREC)

    if DIRECT:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(O + tok[:, None] * stride_ot + h[:, None] * stride_oh + d[None, :],
                 out.to(O.dtype.element_ty), mask=i_ok[:, None])
    else:   # every split stores (an empty one m = -1e30, l = 0, acc = 0): the reduce reads all
        tl.store(Part + tok[:, None] * stride_pt + h[:, None] * stride_ph + s_id * stride_ps
                 + d[None, :], acc, mask=i_ok[:, None])
        ml = ML + tok * stride_lt + h * stride_lh + s_id * stride_ls
        tl.store(ml, m_i, mask=i_ok)
        tl.store(ml + 1, l_i, mask=i_ok)


@triton.jit
def _split_reduce_kernel(Part, ML, O, QLens, CuQ, num_parts,
                         stride_pt, stride_ph, stride_ps, stride_lt, stride_lh, stride_ls,
                         stride_ot, stride_oh,
                         BLOCK_S: tl.constexpr, HEAD_D: tl.constexpr):
    """Grid (B, max_q, Hq): combine one query head's split partials, splits in index order
    (a fixed tree: the same bits on every run)."""
    b = tl.program_id(0)
    i = tl.program_id(1)
    h = tl.program_id(2)
    live = (i < tl.load(QLens + b)).to(tl.int32)
    t = tl.load(CuQ + b).to(tl.int64) + i
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, HEAD_D)
    s_ok = sp < num_parts * live
    ml = ML + t * stride_lt + h * stride_lh + sp * stride_ls
    m = tl.load(ml, mask=s_ok, other=_NEG_INIT)
    l = tl.load(ml + 1, mask=s_ok, other=0.0)
    w = tl.exp2(m - tl.max(m, 0))
    den = tl.sum(l * w, 0)
    acc = tl.load(Part + t * stride_pt + h * stride_ph + sp[:, None] * stride_ps + d[None, :],
                  mask=s_ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(den > 0, den, 1.0)
    tl.store(O + t * stride_ot + h * stride_oh + d, out.to(O.dtype.element_ty),
             mask=d < HEAD_D * live)


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
                KV_SHARED: tl.constexpr, DOT_PREC: tl.constexpr):
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
    elif KV_SHARED:
        hi = kv_len                                # every query sees the whole row
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
    if d < 16 or d > 512 or d & (d - 1):
        raise ValueError(f"paged_attention_triton: head_dim must be a power of two in [16, 512], "
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
                           deterministic: bool = False,
                           num_splits: Optional[int] = None) -> torch.Tensor:
    """q [T,Hq,d], k_cache/v_cache [N,Hkv,d] -> out [T,Hq,d] (dtype of q); see attn_meta.py.

    The split-KV kernel when a lane's queries x GQA group fit one tile (max_q x group <=
    SPLIT_MAX_ROWS: decode, tree verify, draft steps, short extends), the extend kernel
    otherwise (prefill); deterministic=True: the per-query kernel for every shape (module
    docstring). num_splits: splits per (lane, KV head) of the split kernel (default
    `split_count`; 1 = no reduce pass).
    """
    _check(q, k_cache, v_cache)
    T, Hq, d = q.shape
    Hkv = k_cache.shape[1]
    group = Hq // Hkv
    B = meta.batch_size
    # static size; tokens of no lane stay zero (as the reference): with full_lanes there are
    # none, every token is written by its lane, so no fill runs
    out = q.new_empty(T, Hq, d) if meta.full_lanes else q.new_zeros(T, Hq, d)
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
    block_n = 64 if d <= 64 else 32 if d <= 256 else 16   # extend and deterministic kernels
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
            HAS_TREE=has_tree, KV_SHARED=meta.kv_shared and not has_tree, DOT_PREC=dot_prec)
        return out

    if meta.max_q * group <= SPLIT_MAX_ROWS:
        return _split_attention(q, k_cache, v_cache, out, meta, qk_scale, win, group,
                                dot_prec, num_splits)
    if meta.kv_shared:
        raise ValueError(f"kv_shared lanes need max_q x GQA group <= {SPLIT_MAX_ROWS} "
                         f"(got {meta.max_q} x {group})")
    tree = meta.tree_mask
    has_tree = tree is not None
    if has_tree:
        tree = tree.view(torch.uint8)          # same storage, loadable as bytes
        tree_strides = (tree.stride(0), tree.stride(1))
    else:
        tree = meta.positions                  # never read when HAS_TREE is False
        tree_strides = (0, 0)
    # BLOCK_M rows = TILE_Q queries x GROUP heads (+ padding to a power of two >= 16); a
    # head_dim-512 tile holds half the rows (its fp32 accumulator is twice as wide).
    block_m = min(max(64 if d <= 256 else 32, triton.next_power_of_2(group)),
                  max(16, triton.next_power_of_2(group * meta.max_q)))
    tile_q = block_m // group
    grid = (math.ceil(meta.max_q / tile_q), Hkv, B)
    _extend_kernel[grid](
        *common, tree, *strides, *tree_strides, qk_scale, win,
        GROUP=group, TILE_Q=tile_q, HEAD_D=d, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_TREE=has_tree, DOT_PREC=dot_prec)
    return out


def _split_attention(q, k_cache, v_cache, out, meta: AttnMeta, qk_scale: float, win: int,
                     group: int, dot_prec: str, num_splits: Optional[int]) -> torch.Tensor:
    """The split-KV kernel (+ the reduce pass when a lane's row is split in several parts)."""
    T, Hq, d = q.shape
    Hkv = k_cache.shape[1]
    B = meta.batch_size
    tree = meta.tree_mask
    mode, block_m, launch, planned = split_plan(meta, d, group, Hkv, q.dtype,
                                                num_sms(q.device))
    if tree is not None:
        tree = tree.view(torch.uint8)          # same storage, loadable as bytes
        tree_strides = (tree.stride(0), tree.stride(1))
    else:
        tree, tree_strides = meta.positions, (0, 0)   # never read without a tree
    ns = num_splits or planned
    direct = ns == 1
    parts = ns + (0 if mode == 0 or direct else 1)     # MODE 1/2: the tail is one more part
    if direct:
        part = ml = out                                # not written
        pstr = lstr = (0, 0, 0)
    else:
        part = torch.empty(T, Hq, parts, d, dtype=torch.float32, device=q.device)
        ml = torch.empty(T, Hq, parts, 2, dtype=torch.float32, device=q.device)
        pstr, lstr = part.stride()[:3], ml.stride()[:3]
    block_n, warps, stages = launch.block_n, launch.warps, launch.stages
    _split_kernel[(parts, Hkv, B)](
        q, k_cache, v_cache, out, part, ml, meta.table, meta.rows, meta.kv_lens, meta.q_lens,
        meta.cu_q, meta.positions, tree,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
        meta.table.stride(0), *tree_strides, *pstr, *lstr, qk_scale, win, ns,
        GROUP=group, MAX_Q=meta.max_q, HEAD_D=d, BLOCK_M=block_m, BLOCK_N=block_n,
        MODE=mode, DIRECT=direct, HAS_WINDOW=win != _NO_WINDOW.value, DOT_PREC=dot_prec,
        num_warps=warps, num_stages=stages)
    if not direct:
        _split_reduce_kernel[(B, meta.max_q, Hq)](
            part, ml, out, meta.q_lens, meta.cu_q, parts, *pstr, *lstr,
            out.stride(0), out.stride(1),
            BLOCK_S=triton.next_power_of_2(parts), HEAD_D=d)
    return out
