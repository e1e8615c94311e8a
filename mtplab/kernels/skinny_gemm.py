"""Skinny GEMM: y = x @ w^T for decode's few rows (M <= MAX_M), every weight read once.

A decode step's GEMMs have M = the batch (x tree nodes) rows against an [N, K] weight: the
weight is the whole cost. cuBLAS picks tiles sized for large M and, for the narrow ones, a
split-K pass plus a separate reduce kernel. Here one kernel streams the weight:

    grid (N tiles of BLOCK_N rows, S splits of K)       program (n, s):
    +---- K ----+                                         acc[BLOCK_M, BLOCK_N] (fp32)
    | s=0 | s=1 |  <- W rows n*BLOCK_N ..                   = x[:, ks] @ W[n tile, ks]^T
    +-----+-----+                                           over its K range ks, BLOCK_K at a
                                                            time; S = 1: store y, done
    S > 1: each program stores its partial tile into the workspace, then takes a ticket on
    its N tile's counter (acq_rel atomic, after a CTA barrier: every thread's partial is
    visible first); the program holding the last ticket sums the S partials in split order
    (0, 1, ..., S-1: the same bits every launch), stores y, and resets the counter to 0.

Invariants
  * One launch, no host sync, shapes and pointers fixed per call: CUDA-graph capturable. The
    workspace (partials and counters, `Workspace`) is allocated once, before capture; every
    launch leaves its counters at 0. Launches sharing a workspace run one after another (one
    stream runs the model's forwards). Without a workspace the plan is S = 1.
  * The plan (`plan`: tiles, S, warps, stages) depends on N, K, the dtype and the device's SM
    count, never on M: a row's result is the same at any M <= MAX_M (not across MAX_M, where
    `linear` hands the rows to cuBLAS: deterministic mode keeps cuBLAS's batch-invariant
    replacement instead, config.py refuses both).
  * Accumulation is fp32; fp32 inputs are multiplied in IEEE fp32 (no TF32).
  * `silu_mul=True` reads x = [gate | up] (2K wide) and multiplies by silu(gate) * up rounded
    as kernels/fused_ops.py's silu_mul rounds it: the down projection without the silu_mul
    kernel before it, the same function as `linear(silu_mul(gu), w)`.

`linear(x, w)` / `linear_silu_mul(gu, w)` are the model's fused-path GEMMs: inside
`using(workspace)` (the engine's numerics scope with RunConfig.skinny_gemm) rows M <= MAX_M
run this kernel (logged fallback to the reference on a failure, fused_ops.dispatch), any other
call F.linear. `*_ref` are the plain-torch references.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ..lazy_triton import tl, triton
from . import fused_ops as fo

MAX_M = 8               # rows this kernel takes; more go to cuBLAS
BLOCK_M = 16            # tl.dot's smallest tile: rows M..15 load zeros and are never stored
PART_FLOATS = 1 << 22   # workspace partials (16 MiB fp32): S * BLOCK_M * N of one launch
TILES = 1 << 13         # workspace counters: N tiles of one launch
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit(do_not_specialize=["M"])
def _skinny_gemm_kernel(X, W, Y, Part, Count, M, N, K, K_SPLIT, SPLITS, stride_xm, stride_wn,
                        stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, REDUCE: tl.constexpr, SILU_MUL: tl.constexpr,
                        DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = X + rm[:, None].to(tl.int64) * stride_xm
    w_rows = W + rn[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_lo = pid_s * K_SPLIT
    for k0 in range(0, K_SPLIT, BLOCK_K):
        rk = k_lo + k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
        xm = m_ok[:, None] & k_ok[None, :]
        if SILU_MUL:        # x = round(round(silu(gate)) * up), as fused_ops.silu_mul
            g = tl.load(x_rows + rk[None, :], mask=xm, other=0.0).to(tl.float32)
            u = tl.load(x_rows + K + rk[None, :], mask=xm, other=0.0).to(tl.float32)
            a = (g / (1.0 + tl.exp(-g))).to(W.dtype.element_ty).to(tl.float32)
            x = (a * u).to(W.dtype.element_ty)
        else:
            x = tl.load(x_rows + rk[None, :], mask=xm, other=0.0)
        if UPCAST:          # the interpreter's tl.dot mis-computes bfloat16 (Triton 3.9)
            x, w = x.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PREC)
    y_ptr = Y + rm[:, None].to(tl.int64) * stride_ym + rn[None, :]
    out_ok = m_ok[:, None] & n_ok[None, :]
    if REDUCE:
        part = Part + (pid_s * BLOCK_M + rm[:, None]).to(tl.int64) * N + rn[None, :]
        tl.store(part, acc, mask=out_ok)
        tl.debug_barrier()              # every thread's partial before the ticket (release)
        ticket = tl.atomic_add(Count + pid_n, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLITS - 1:        # the last split of this N tile sums them in order
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, SPLITS):
                p = Part + (s * BLOCK_M + rm[:, None]).to(tl.int64) * N + rn[None, :]
                total += tl.load(p, mask=out_ok, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr, total.to(Y.dtype.element_ty), mask=out_ok)
            tl.store(Count + pid_n, 0)  # the next launch finds its counters at 0
    else:
        tl.store(y_ptr, acc.to(Y.dtype.element_ty), mask=out_ok)


@dataclass(frozen=True)
class Plan:
    """One launch's shape: BLOCK_N rows of W per program, K cut into `splits` ranges of
    k_split (a multiple of BLOCK_K) columns."""
    block_n: int
    block_k: int
    splits: int
    k_split: int
    num_warps: int = 4
    num_stages: int = 4


def plan(N: int, K: int, dtype: torch.dtype, sms: int, *, block_n: int = 32,
         block_k: Optional[int] = None, splits: Optional[int] = None, num_warps: int = 4,
         num_stages: int = 4, part_floats: int = PART_FLOATS) -> Plan:
    """The launch for an [N, K] weight: BLOCK_N=32 rows per program, BLOCK_K 256 (128 for
    fp32); K split in two until there are >= 2 programs per SM, each split keeping >= 4
    BLOCK_K steps (at most 16 splits). `splits` (and the tile keywords) override, capped by
    the workspace's partials (part_floats) and its counters."""
    bk = block_k or (128 if dtype == torch.float32 else 256)
    tiles = triton.cdiv(N, block_n)
    if splits is None:
        splits = 1
        while tiles * splits < 2 * sms and K >= splits * 2 * 4 * bk and splits < 16:
            splits *= 2
    while splits > 1 and (splits * BLOCK_M * N > part_floats or tiles > TILES):
        splits //= 2
    k_split = triton.cdiv(triton.cdiv(K, max(splits, 1)), bk) * bk
    return Plan(block_n, bk, triton.cdiv(K, k_split), k_split, num_warps, num_stages)


class Workspace:
    """The split-K partials and per-tile counters of one device (zeroed once; every launch
    leaves the counters at 0). Allocate it before graph capture; the engine owns it (freed
    with the engine)."""

    def __init__(self, device: torch.device, part_floats: int = PART_FLOATS):
        device = torch.device(device)
        self.part = torch.empty(part_floats, dtype=torch.float32, device=device)
        self.count = torch.zeros(TILES, dtype=torch.int32, device=device)
        self.sms = (torch.cuda.get_device_properties(device).multi_processor_count
                    if device.type == "cuda" else 4)


_workspace: Optional[Workspace] = None      # inside `using()`: the kernel path is on


@contextlib.contextmanager
def using(ws: Optional[Workspace]):
    """While inside, `linear` and `linear_silu_mul` run the kernel for M <= MAX_M rows with
    `ws` as the split-K workspace (None: F.linear, the kernel path off)."""
    global _workspace
    prev, _workspace = _workspace, ws
    try:
        yield
    finally:
        _workspace = prev


def skinny_gemm_triton(x: torch.Tensor, w: torch.Tensor, ws: Optional[Workspace] = None,
                       silu_mul: bool = False, config: Optional[Plan] = None) -> torch.Tensor:
    """x [M, K] (or [M, 2K] = [gate | up] with silu_mul) @ w[N, K]^T -> [M, N] in x's dtype;
    M <= MAX_M, rows contiguous. `ws` None: no split-K (S = 1). `config` overrides `plan`."""
    M = x.shape[0]
    N, K = w.shape
    if M > MAX_M or x.shape[1] != (2 * K if silu_mul else K) or x.stride(-1) != 1 \
            or w.stride(-1) != 1 or x.dtype != w.dtype:
        raise ValueError(f"skinny_gemm: x {tuple(x.shape)} {x.dtype} @ w {tuple(w.shape)} "
                         f"{w.dtype}^T needs M <= {MAX_M}, matching K and dtypes, and "
                         "contiguous rows.")
    y = x.new_empty(M, N)
    if M == 0 or N == 0:
        return y
    cuda = x.device.type == "cuda"
    p = config or plan(N, K, x.dtype, ws.sms if ws is not None else 1,
                       part_floats=ws.part.numel() if ws is not None else 0)
    if ws is None and p.splits > 1:
        raise ValueError("skinny_gemm: a split-K plan needs a Workspace.")
    reduce = p.splits > 1
    part, count = (ws.part, ws.count) if reduce else (y, y)
    opts = dict(num_warps=p.num_warps, num_stages=p.num_stages) if cuda else {}
    _skinny_gemm_kernel[(triton.cdiv(N, p.block_n), p.splits)](
        x, w, y, part, count, M, N, K, p.k_split, p.splits, x.stride(0), w.stride(0),
        y.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=p.block_n, BLOCK_K=p.block_k, REDUCE=reduce,
        SILU_MUL=silu_mul, DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32",
        UPCAST=not cuda and x.dtype != torch.float32, **opts)
    return y


def linear_ref(x: torch.Tensor, w: torch.Tensor, ws: Optional[Workspace] = None) -> torch.Tensor:
    """x @ w^T (F.linear): what the kernel computes."""
    return F.linear(x, w)


def linear_silu_mul_ref(gu: torch.Tensor, w: torch.Tensor,
                        ws: Optional[Workspace] = None) -> torch.Tensor:
    """silu(gate) * up @ w^T, gu = [gate | up]: the kernel with silu_mul=True."""
    return F.linear(fo.silu_mul_ref(gu), w)


def _eligible(x: torch.Tensor, w: torch.Tensor, k: int) -> bool:
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_M and x.shape[1] == k * w.shape[1]
            and x.dtype == w.dtype and x.dtype in _DTYPES and x.stride(-1) == 1
            and w.stride(-1) == 1)


def _gemm(x, w, ws):
    return skinny_gemm_triton(x, w, ws)


def _gemm_silu(gu, w, ws):
    return skinny_gemm_triton(gu, w, ws, silu_mul=True)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w^T: the kernel inside `using()` for M <= MAX_M rows, F.linear otherwise."""
    ws = _workspace
    if ws is None or not _eligible(x, w, 1):
        return F.linear(x, w)
    if not x.is_cuda:               # a CPU run under the interpreter (RunConfig allows no other)
        return _gemm(x, w, ws)
    return fo.dispatch("skinny_gemm", _gemm, linear_ref, x, w, ws)


def linear_silu_mul(gu: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up @ w^T (gu = [gate | up]): one kernel inside `using()` for M <= MAX_M
    rows, else silu_mul (fused_ops) then F.linear."""
    ws = _workspace
    if ws is None or not _eligible(gu, w, 2):
        return F.linear(fo.silu_mul(gu), w)
    if not gu.is_cuda:
        return _gemm_silu(gu, w, ws)
    return fo.dispatch("skinny_gemm_silu_mul", _gemm_silu, linear_silu_mul_ref, gu, w, ws)
