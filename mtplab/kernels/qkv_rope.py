"""The QKV projection of a decode step with RoPE and the KV-cache write in its epilogue:
one kernel where the skinny GEMM (kernels/gemv.py) and `rope_qkv_cache` (fused_ops.py) were
two, and the [T, (nq + 2*nkv) * d] qkv tensor is never stored.

    qkv_rope(x [M, K], w [(nq + 2*nkv) * d, K], launch, positions, cos, sin, nq, nkv,
             k_cache, v_cache, out_loc) -> q [M, nq, d]     (= rope_qkv_cache(x @ w^T, ...))

RoPE pairs dim j of a head with dim j + d/2, so a program owns BLOCK_H = launch.block_n / 2
dims of each half of one head: the w rows of both halves, one accumulator each.

    program p:  head hd = p // P, dims j = (p % P) * BLOCK_H + [0, BLOCK_H)   (P = HALF / BLOCK_H)
                acc1 = x @ w[hd*d + j]^T          acc2 = x @ w[hd*d + HALF + j]^T      (fp32)
                x1, x2 = round(acc1), round(acc2)             (qkv's dtype: the GEMM's output)
       hd < nq           q[:, hd, j] = x1*cos - x2*sin ; q[:, hd, HALF + j] = x2*cos + x1*sin
       hd < nq + nkv     the same rotation into k_cache[out_loc, hd - nq]
       otherwise         x1, x2 into v_cache[out_loc, hd - nq - nkv]
    Without out_loc (a read-only layer) the grid covers the q heads only.

The arithmetic is `rope_qkv_cache`'s on the GEMM's rounded output (fused_ops.py: cos/sin as
stored, fp32), and each output's K sum is the skinny GEMM's at the same launch (same tiles of
BLOCK_K, fp32 accumulation). Static grid, no host synchronisation: CUDA-graph capturable.
`qkv_rope` runs the kernel where `gemv.planned(x, launch)` (a planned launch, at most
PLAN_MAX_M CUDA rows, no batch-invariant mode) and the launch `fits`; otherwise the GEMM
(`gemv.linear`) then `rope_qkv_cache`. The decode GEMM plan (models/gemm_plan.py) times this
kernel against cuBLAS followed by the RoPE kernel, and names a launch only where it wins.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..lazy_triton import tl, triton
from .fused_ops import dispatch, rope_qkv_cache, rope_qkv_cache_ref
from .gemv import MAX_M, GemvConfig, linear, planned


@dataclass(frozen=True)
class RopeShape:
    """The heads a QKV site's output holds: [nq q heads | nkv k heads | nkv v heads] of
    head_dim each (RoPE on q and k)."""
    nq: int
    nkv: int
    head_dim: int


def fits(launch: GemvConfig, rope: RopeShape) -> bool:
    """Whether the fused kernel takes `launch` for these heads: no split K (the epilogue needs
    the whole sum), and half a head a whole number of BLOCK_H = block_n / 2 >= 16 dims (the
    smallest tl.dot tile)."""
    h = launch.block_n // 2
    half = rope.head_dim // 2
    return launch.split_k == 1 and h >= 16 and launch.block_n % 2 == 0 and half % h == 0


@triton.jit
def _gemv_rope_kernel(X, W, Pos, Cos, Sin, Q, KC, VC, Loc, M, K,
                      stride_xm, stride_wn, stride_cos, stride_sin, stride_qt, stride_qh,
                      stride_kn, stride_kh, stride_vn, stride_vh,
                      NQ: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                      UPCAST: tl.constexpr):
    pid = tl.program_id(0)
    hd = pid // (HALF // BLOCK_H)
    j = (pid % (HALF // BLOCK_H)) * BLOCK_H + tl.arange(0, BLOCK_H)
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    row1 = hd.to(tl.int64) * (2 * HALF) + j
    acc1 = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w1 = tl.load(W + row1[:, None] * stride_wn + rk[None, :], mask=k_ok[None, :], other=0.0)
        w2 = tl.load(W + (row1 + HALF)[:, None] * stride_wn + rk[None, :], mask=k_ok[None, :],
                     other=0.0)
        if UPCAST:       # the interpreter's tl.dot mis-computes bfloat16 (Triton 3.9)
            x, w1, w2 = x.to(tl.float32), w1.to(tl.float32), w2.to(tl.float32)
        acc1 += tl.dot(x, tl.trans(w1), input_precision="ieee")
        acc2 += tl.dot(x, tl.trans(w2), input_precision="ieee")
    x1 = acc1.to(Q.dtype.element_ty).to(tl.float32)
    x2 = acc2.to(Q.dtype.element_ty).to(tl.float32)
    out = m_ok[:, None]
    if hd < NQ + NKV:                                         # q or k: rotated
        pos = tl.load(Pos + rm, mask=m_ok, other=0).to(tl.int64)
        c = tl.load(Cos + pos[:, None] * stride_cos + j[None, :], mask=out, other=0.0)
        s = tl.load(Sin + pos[:, None] * stride_sin + j[None, :], mask=out, other=0.0)
        c = c.to(tl.float32)
        s = s.to(tl.float32)
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        if hd < NQ:
            dst = Q + rm[:, None] * stride_qt + hd * stride_qh + j[None, :]
            tl.store(dst, o1.to(Q.dtype.element_ty), mask=out)
            tl.store(dst + HALF, o2.to(Q.dtype.element_ty), mask=out)
        else:
            loc = tl.load(Loc + rm, mask=m_ok, other=0).to(tl.int64)
            dst = KC + loc[:, None] * stride_kn + (hd - NQ) * stride_kh + j[None, :]
            tl.store(dst, o1.to(KC.dtype.element_ty), mask=out)
            tl.store(dst + HALF, o2.to(KC.dtype.element_ty), mask=out)
    else:                                                     # v: as computed
        loc = tl.load(Loc + rm, mask=m_ok, other=0).to(tl.int64)
        dst = VC + loc[:, None] * stride_vn + (hd - NQ - NKV) * stride_vh + j[None, :]
        tl.store(dst, x1.to(VC.dtype.element_ty), mask=out)
        tl.store(dst + HALF, x2.to(VC.dtype.element_ty), mask=out)


def qkv_rope_ref(x: torch.Tensor, w: torch.Tensor, launch: Optional[GemvConfig],
                 positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nq: int,
                 nkv: int, k_cache: Optional[torch.Tensor], v_cache: Optional[torch.Tensor],
                 out_loc: Optional[torch.Tensor]) -> torch.Tensor:
    """The plain-torch reference: rope_qkv_cache_ref(F.linear(x, w), ...)."""
    return rope_qkv_cache_ref(F.linear(x, w), positions, cos, sin, nq, nkv, k_cache, v_cache,
                              out_loc)


def _qkv_rope_triton(x, w, launch: GemvConfig, positions, cos, sin, nq, nkv, k_cache, v_cache,
                     out_loc) -> torch.Tensor:
    M, K = x.shape
    d = cos.shape[-1]
    half, bh = d // 2, launch.block_n // 2
    if not fits(launch, RopeShape(nq, nkv, d)) or w.shape != ((nq + 2 * nkv) * d, K):
        raise ValueError(f"qkv_rope: launch {launch} or weight {tuple(w.shape)} does not fit "
                         f"{nq} + 2 x {nkv} heads of {d} over K={K}.")
    if M > MAX_M or x.stride(-1) != 1 or not w.is_contiguous() or cos.stride(-1) != 1 \
            or sin.stride(-1) != 1:
        raise ValueError(f"qkv_rope: at most {MAX_M} rows, unit-stride rows and a contiguous "
                         "weight.")
    q = x.new_empty(M, nq, d)
    write = out_loc is not None
    kc = k_cache if write else q
    vc = v_cache if write else q
    loc = out_loc.contiguous() if write else positions
    if write and (kc.stride(-1) != 1 or vc.stride(-1) != 1):
        raise ValueError("qkv_rope: the KV caches must be contiguous in head_dim.")
    heads = nq + 2 * nkv if write else nq
    if M:
        _gemv_rope_kernel[(heads * (half // bh),)](
            x, w, positions.contiguous(), cos, sin, q, kc, vc, loc, M, K,
            x.stride(0), w.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
            kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
            NQ=nq, NKV=nkv, HALF=half, BLOCK_M=MAX_M, BLOCK_H=bh, BLOCK_K=launch.block_k,
            UPCAST=not x.is_cuda, num_warps=launch.num_warps, num_stages=launch.num_stages)
    return q


def qkv_rope(x: torch.Tensor, w: torch.Tensor, launch: Optional[GemvConfig],
             positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, nq: int, nkv: int,
             k_cache: Optional[torch.Tensor], v_cache: Optional[torch.Tensor],
             out_loc: Optional[torch.Tensor]) -> torch.Tensor:
    """rope_qkv_cache(x @ w^T, ...) -> q [M, nq, d]: the fused kernel where the plan's launch
    applies to x and fits the heads, the GEMM then the RoPE op otherwise (module doc)."""
    if (planned(x, launch) and x.dtype == w.dtype
            and fits(launch, RopeShape(nq, nkv, cos.shape[-1]))):
        return dispatch("qkv_rope", _qkv_rope_triton, qkv_rope_ref, x, w, launch, positions,
                        cos, sin, nq, nkv, k_cache, v_cache, out_loc)
    return rope_qkv_cache(linear(x, w, launch), positions, cos, sin, nq, nkv, k_cache, v_cache,
                          out_loc)
