"""Skinny GEMM for decode: y = x @ w^T with few rows (M <= MAX_M), reading w once.

    gemv(x [M, K], w [N, K]) -> y [M, N]      (F.linear(x, w), same dtype as x)

At M <= 8 a decode step's linear layers are bound by reading w (N*K*2 bytes, bf16) and nothing
else; the kernel is a stream over w's rows:

    grid (cdiv(N, BLOCK_N), SPLIT_K); program (n, s) owns rows n*BLOCK_N .. +BLOCK_N of w and
    the s-th of SPLIT_K equal slices of K (each a multiple of BLOCK_K):
        acc[BLOCK_M, BLOCK_N] (fp32) = sum over its K slice, BLOCK_K at a time, of
            x[:, k-tile] @ w[n-tile, k-tile]^T            (tl.dot; rows of x past M read 0)
        SPLIT_K == 1: y[:M, n-tile] = acc                 (cast to y's dtype)
        SPLIT_K  > 1: part[s, :M, n-tile] = acc (fp32), then one reduce program per n-tile
                      sums part[0..SPLIT_K-1] in a fixed order -> y

No atomics: the result depends only on (M, N, K, config), not on scheduling, so it is run to
run deterministic. It is not batch-invariant across M (a row's sum is the same for every M
within one config, but `config()` may pick another split for another N, K), so deterministic
mode keeps cuBLAS/batch-invariant GEMMs. Numerics: fp32 accumulation as cuBLAS, in another
order: agrees with F.linear to bf16 rounding (tests: rtol 2e-2 on bf16, 1e-4 on fp32 inputs
via TF32-free fp32 dot).

`gemv` runs the kernel on CUDA tensors and `gemv_ref` (F.linear) elsewhere or inside
`references()` (fused_ops.dispatch). Static grids, no host synchronisation: CUDA-graph
capturable (the split-K partials are allocated per call from the caching allocator, which a
graph capture pools).

`linear(x, w, launch)` is what a model's GEMM sites call (models/linear.py): the kernel at
`launch` where the engine's GEMM plan chose it for w's shape (models/gemm_plan.py), x has at
most PLAN_MAX_M rows and batch-invariant mode is off; F.linear otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..lazy_triton import tl, triton
from . import batch_invariant
from .fused_ops import dispatch

MAX_M = 16                   # rows of x the kernel takes (one tl.dot tile); more run cuBLAS
PLAN_MAX_M = 8               # rows up to which `linear` follows a plan (the rows it measures)


@dataclass(frozen=True)
class GemvConfig:
    """One launch shape: rows of w per program, K per load, K slices, warps, pipeline stages."""
    block_n: int = 32
    block_k: int = 256
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4


def config(n: int, k: int, sms: int = 132) -> GemvConfig:
    """The launch shape for an [N, K] weight when no plan names one: 32 rows of w by 256 of K
    a program, 4 warps, 4 stages (within 4% of the fastest shape on llama3-8b's decode GEMMs,
    docs/results/long_context/), K split only while the row tiles leave half the SMs idle."""
    tiles = -(-n // 32)
    split = 1
    while 2 * tiles * split <= sms and k // (split * 2) >= 1024:
        split *= 2
    return GemvConfig(block_n=32, block_k=256, split_k=split)


@triton.jit
def _gemv_kernel(X, W, Y, P, M, N, K, stride_xm, stride_wn, stride_ym, k_per,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, UPCAST: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k0 = pid_k * k_per
    for kk in range(0, k_per, BLOCK_K):
        rk = k0 + kk + tl.arange(0, BLOCK_K)
        x = tl.load(X + rm[:, None] * stride_xm + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(W + rn[:, None] * stride_wn + rk[None, :],
                    mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        if UPCAST:       # the interpreter's tl.dot mis-computes bfloat16 (Triton 3.9)
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    out = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=out)
    else:
        tl.store(P + pid_k * BLOCK_M * N + rm[:, None] * N + rn[None, :], acc, mask=out)


@triton.jit
def _gemv_reduce_kernel(P, Y, M, N, stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out = (rm[:, None] < M) & (rn[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT_K):                                   # fixed order: deterministic
        acc += tl.load(P + s * BLOCK_M * N + rm[:, None] * N + rn[None, :], mask=out, other=0.0)
    tl.store(Y + rm[:, None] * stride_ym + rn[None, :], acc.to(Y.dtype.element_ty), mask=out)


def gemv_ref(x: torch.Tensor, w: torch.Tensor, cfg: GemvConfig | None = None) -> torch.Tensor:
    """The plain-torch reference: F.linear(x, w)."""
    return F.linear(x, w)


def _gemv_triton(x: torch.Tensor, w: torch.Tensor, cfg: GemvConfig | None = None) -> torch.Tensor:
    m, k = x.shape
    n = w.shape[0]
    if cfg is None:
        cfg = config(n, k, torch.cuda.get_device_properties(x.device).multi_processor_count)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    k_per = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    tiles = triton.cdiv(n, cfg.block_n)
    part = (torch.empty(cfg.split_k, MAX_M, n, device=x.device, dtype=torch.float32)
            if cfg.split_k > 1 else y)
    _gemv_kernel[(tiles, cfg.split_k)](
        x, w, y, part, m, n, k, x.stride(0), w.stride(0), y.stride(0), k_per,
        BLOCK_M=MAX_M, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
        UPCAST=not x.is_cuda, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.split_k > 1:
        _gemv_reduce_kernel[(tiles,)](part, y, m, n, y.stride(0), BLOCK_M=MAX_M,
                                      BLOCK_N=cfg.block_n, SPLIT_K=cfg.split_k)
    return y


def gemv(x: torch.Tensor, w: torch.Tensor, cfg: GemvConfig | None = None) -> torch.Tensor:
    """F.linear(x, w) for a 2-D x of at most MAX_M contiguous rows and a contiguous w; other
    shapes run F.linear."""
    ok = (x.dim() == 2 and x.shape[0] <= MAX_M and x.stride(-1) == 1 and w.is_contiguous()
          and x.dtype == w.dtype)
    return dispatch("gemv", _gemv_triton if ok else None, gemv_ref, x, w, cfg)


def planned(x: torch.Tensor, launch: GemvConfig | None) -> bool:
    """Whether a planned launch applies to x: one is given, x is a CUDA matrix of at most
    PLAN_MAX_M rows, and batch-invariant mode is off (its matmul keeps a row's bits across
    batch sizes; this kernel does not)."""
    return (launch is not None and x.dim() == 2 and x.shape[0] <= PLAN_MAX_M and x.is_cuda
            and not batch_invariant.is_active())


def linear(x: torch.Tensor, w: torch.Tensor, launch: GemvConfig | None) -> torch.Tensor:
    """F.linear(x, w), on the skinny GEMM at `launch` where it is `planned`."""
    if planned(x, launch):
        return gemv(x, w, launch)
    return F.linear(x, w)
