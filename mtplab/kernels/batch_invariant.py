"""Batch-invariant matmul, row mean and (log_)softmax, and the scope that routes aten to them.

A kernel is batch-invariant when row r of its output is a function of row r of its input
(and of the weights) alone: the same bits whether the launch holds 1, 8 or 33 rows, or a
tree-verify batch of B*D nodes. cuBLAS and torch's reductions are not: they pick split-K,
tile shapes and reduction strategies from the problem size, so a bf16 row's rounding changes
with the batch (after Thinking Machines' batch_invariant_ops; SGLang's
`--enable-deterministic-inference` does the same).

Invariants of every kernel here
  * Tile sizes depend on the dtype (and a row length N/K fixed by the model), never on M,
    the number of rows; M is not specialised by the JIT either (do_not_specialize).
  * No split-K / split-row: one program owns an output tile (matmul) or a row (reductions)
    and walks the reduction axis sequentially from 0 in fixed blocks; a block's partial sums
    are kept per lane and folded by one tl.sum at the end, so the order is fixed per shape.
  * Accumulation is fp32; fp32 dots run in IEEE fp32 (no TF32).

    matmul C[M,N] = A[M,K] @ B[K,N]        row mean / softmax over x[R, N]
    +--------+                            program r: acc[BLOCK] += x[r, c:c+BLOCK]
    | tile   | <- program (m, n): for k0 in 0, BK, 2BK, ...: acc = dot(A[m, k0], B[k0, n], acc)
    +--------+    rows m >= M load 0 and are not stored (they never touch a real row's sum)

`batch_invariant_mode(device_type)` registers these kernels for aten::mm, aten::addmm,
aten::mean.dim, aten::_softmax and aten::_log_softmax on that device's dispatch key for the
duration of a `with` block (the Engine enters it around graph capture and `generate`), then
restores torch's kernels. Inputs the kernels do not cover (non-float dtypes, several reduced
dims, a reduction dtype other than float32) go to torch's own `out=` overload, which the scope
leaves untouched.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Iterator, Optional

import torch

from ..lazy_triton import tl, triton

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


# -- matmul ------------------------------------------------------------------------------
@triton.jit(do_not_specialize=["M"])
def _mm_kernel(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
               stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               DOT_PREC: tl.constexpr, UPCAST: tl.constexpr = False):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        a = tl.load(A + rm[:, None].to(tl.int64) * stride_am + k[None, :] * stride_ak,
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(B + k[:, None] * stride_bk + rn[None, :].to(tl.int64) * stride_bn,
                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if UPCAST:       # the interpreter's tl.dot mis-computes bfloat16 (Triton 3.9)
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    tl.store(C + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn,
             acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def mm_config(dtype: torch.dtype, device_type: str) -> dict:
    """The tiles: fixed per dtype and device (never per M), the whole point. On CPU (the
    Triton interpreter) big tiles: few programs, each op one numpy call."""
    prec = "ieee" if dtype == torch.float32 else "tf32"
    if device_type != "cuda":      # bf16 operands widened to fp32 (exact): see _mm_kernel
        return dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, DOT_PREC=prec,
                    UPCAST=dtype == torch.bfloat16)
    if dtype == torch.float32:
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, DOT_PREC=prec, num_warps=4)
    return dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, DOT_PREC=prec, num_warps=4, num_stages=3)


def matmul(a: torch.Tensor, b: torch.Tensor, config: Optional[dict] = None) -> torch.Tensor:
    """a [M,K] @ b [K,N] -> [M,N] in a's dtype, batch-invariant (any strides). `config`
    overrides mm_config (tests run the CUDA tiles under the interpreter)."""
    M, K = a.shape
    N = b.shape[1]
    c = a.new_empty(M, N)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    cfg = config or mm_config(a.dtype, a.device.type)
    grid = (triton.cdiv(M, cfg["BLOCK_M"]), triton.cdiv(N, cfg["BLOCK_N"]))
    _mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1), **cfg)
    return c


# -- row reductions ------------------------------------------------------------------------
@triton.jit
def _row_mean_kernel(X, Y, N, stride_x, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, N, BLOCK):
        acc += tl.load(X + r * stride_x + c0 + c, mask=c0 + c < N, other=0.0).to(tl.float32)
    tl.store(Y + r, (tl.sum(acc, 0) / N).to(Y.dtype.element_ty))


@triton.jit
def _row_softmax_kernel(X, Y, N, stride_x, stride_y, LOG: tl.constexpr, BLOCK: tl.constexpr):
    """Three sequential passes over the row: max (exact in any order), sum of exp in fixed
    blocks, write. Masked lanes load -inf and add exp(-inf) = 0."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    mx = tl.full([BLOCK], float("-inf"), tl.float32)
    for c0 in range(0, N, BLOCK):
        x = tl.load(X + r * stride_x + c0 + c, mask=c0 + c < N, other=float("-inf"))
        mx = tl.maximum(mx, x.to(tl.float32))
    m = tl.max(mx, 0)
    m = tl.where(m == float("-inf"), 0.0, m)     # an all -inf row: exp(-inf - 0) = 0
    acc = tl.zeros([BLOCK], tl.float32)
    for c0 in range(0, N, BLOCK):
        x = tl.load(X + r * stride_x + c0 + c, mask=c0 + c < N, other=float("-inf"))
        acc += tl.exp(x.to(tl.float32) - m)
    s = tl.sum(acc, 0)
    for c0 in range(0, N, BLOCK):
        ok = c0 + c < N
        x = tl.load(X + r * stride_x + c0 + c, mask=ok, other=0.0).to(tl.float32)
        if LOG:
            y = x - m - tl.log(s)
        else:
            y = tl.exp(x - m) / s
        tl.store(Y + r * stride_y + c0 + c, y.to(Y.dtype.element_ty), mask=ok)


def _row_block(n: int) -> int:
    return min(1024, triton.next_power_of_2(max(n, 16)))


def _as_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x with `dim` moved last, as a contiguous [R, N] matrix."""
    return x.movedim(dim, -1).contiguous().view(-1, x.shape[dim])


def row_mean(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """x.mean(dim) (float input, fp32 accumulation), batch-invariant."""
    dim = dim % x.dim()
    rows = _as_rows(x, dim)
    R, N = rows.shape
    y = x.new_empty(R)
    if R and N:
        _row_mean_kernel[(R,)](rows, y, N, rows.stride(0), BLOCK=_row_block(N))
    elif R:
        y.fill_(float("nan"))                  # torch: the mean of nothing is nan
    shape = [s for i, s in enumerate(x.shape) if i != dim]
    y = y.view(shape)
    return y.unsqueeze(dim) if keepdim else y


def row_softmax(x: torch.Tensor, dim: int, log: bool,
                out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """(log_)softmax over `dim` (fp32 inside), batch-invariant; out_dtype defaults to x's."""
    dim = dim % max(x.dim(), 1)
    if x.dim() == 0:
        return row_softmax(x.view(1), 0, log, out_dtype).view(())
    rows = _as_rows(x, dim)
    R, N = rows.shape
    y = torch.empty(R, N, dtype=out_dtype or x.dtype, device=x.device)
    if R and N:
        _row_softmax_kernel[(R,)](rows, y, N, rows.stride(0), y.stride(0), LOG=log,
                                  BLOCK=_row_block(N))
    moved = list(x.shape[:dim]) + list(x.shape[dim + 1:]) + [x.shape[dim]]
    return y.view(moved).movedim(-1, dim).contiguous()


# -- aten overrides ----------------------------------------------------------------------
def _empty_like_out(x: torch.Tensor, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A size-0 `out=` tensor: torch resizes it silently (the fallback overloads)."""
    return torch.empty(0, dtype=dtype or x.dtype, device=x.device)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype in _FLOATS and a.dtype == b.dtype:
        return matmul(a, b)
    return torch.mm(a, b, out=_empty_like_out(a))


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1):
    if not (a.dtype in _FLOATS and a.dtype == b.dtype == bias.dtype):
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=_empty_like_out(a))
    c = matmul(a, b)                           # elementwise epilogue: per element, invariant
    if alpha != 1:
        c = c * alpha
    return c + bias if beta == 1 else c + bias * beta


def _mean_dim(x: torch.Tensor, dim, keepdim: bool = False, dtype=None):
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    if len(dims) == 1 and x.dtype in _FLOATS and dtype in (None, x.dtype) and x.numel():
        return row_mean(x, dims[0], keepdim)
    return torch.mean(x, dim, keepdim, dtype=dtype, out=_empty_like_out(x, dtype))


def _softmax(x: torch.Tensor, dim: int, half_to_float: bool):
    if x.dtype not in _FLOATS:
        return torch._softmax(x, dim, half_to_float, out=_empty_like_out(x))
    return row_softmax(x, dim, False, torch.float32 if half_to_float else None)


def _log_softmax(x: torch.Tensor, dim: int, half_to_float: bool):
    if x.dtype not in _FLOATS:
        return torch._log_softmax(x, dim, half_to_float, out=_empty_like_out(x))
    return row_softmax(x, dim, True, torch.float32 if half_to_float else None)


OVERRIDES = {"aten::mm": _mm, "aten::addmm": _addmm, "aten::mean.dim": _mean_dim,
             "aten::_softmax": _softmax, "aten::_log_softmax": _log_softmax}

_lock = threading.Lock()
_active: dict = {"lib": None, "key": None, "depth": 0}


@contextlib.contextmanager
def batch_invariant_mode(device_type: str = "cuda") -> Iterator[None]:
    """Route OVERRIDES to the kernels above on `device_type`'s dispatch key ("cuda"; "cpu"
    only under TRITON_INTERPRET=1) while inside; nests (reference counted), one device type
    at a time. Global to the process while active, like any dispatcher registration."""
    key = {"cuda": "CUDA", "cpu": "CPU"}[device_type]
    with _lock:
        if _active["depth"] and _active["key"] != key:
            raise RuntimeError(f"batch_invariant_mode is already active for {_active['key']}; "
                               f"one device type at a time.")
        if not _active["depth"]:
            lib = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():           # "Overriding a previously registered
                warnings.simplefilter("ignore")       # kernel": that is the intent
                for name, fn in OVERRIDES.items():
                    lib.impl(name, fn, key)
            _active.update(lib=lib, key=key)
        _active["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _active["depth"] -= 1
            if not _active["depth"]:
                _active["lib"]._destroy()
                _active.update(lib=None, key=None)


def is_active() -> bool:
    return _active["depth"] > 0
