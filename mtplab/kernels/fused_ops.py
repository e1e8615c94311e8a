"""Fused decoder-layer ops: residual add + RMSNorm, RoPE + KV-cache write, SiLU * mul.

Each op is a Triton kernel beside a plain-torch reference of the same function (`*_ref`, the
exact arithmetic of the unfused model path in models/llama.py); tests compare the two. The
public functions (`add_rmsnorm`, `rope_qkv_cache`, `silu_mul`) run the kernel on CUDA tensors
and the reference elsewhere. A kernel that fails to compile or launch is logged once at
WARNING and that op runs its reference from then on (same function, torch arithmetic).
`dispatch` is shared with the speculative-stage kernels (fused_spec.py); inside
`references()` every dispatched op runs its reference (the engine's unfused mode).

Inside `carrying(carrier)` (a captured graph's segment, graphs/runner.py) a dispatched op
asks `carrier(name)` for the meter's stamps its kernel carries, (begin, end), each a
`Carried` or None: the stage code never sees them, and its kernel launches the stamping
variant only where the capture says so (the reference then runs between stamp launches).

Rounding follows the unfused path step by step, so bf16 results differ from it only by the
order of the RMSNorm reduction and by fused multiply-adds:
    add_rmsnorm   r = round(x + res); y = round(w * round(r * rsqrt(mean(r^2) + eps)))
                  res may be a `PendingCombine`: a grouped MoE FFN's expert rows not yet
                  summed; the kernel sums them first, as the combine kernel would
                  (kernels/fused_moe.py), and the combine's launch is saved
    rope          out = round(x * cos + rotate_half(x) * sin)   (cos/sin as stored, in fp32)
    silu_mul      out = round(round(silu(g)) * u)

Grids use only static shapes and read every length on the device: all three are CUDA-graph
capturable.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F

from ..lazy_triton import tl, triton
from .stamp import stamp_around

logger = logging.getLogger("mtplab")
_failed: set[str] = set()       # ops whose kernel failed once: they run the reference
_references = 0                 # > 0 inside `references()`
_carrier = None                 # inside `carrying()`: op name -> (begin, end) stamps


def _warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


@contextlib.contextmanager
def references(on: bool = True):
    """While inside (and `on`), every dispatched op runs its torch reference; CUDA graphs
    captured inside keep the reference ops."""
    global _references
    _references += bool(on)
    try:
        yield
    finally:
        _references -= bool(on)


@contextlib.contextmanager
def carrying(carrier):
    """While inside, `dispatch(name, ...)` hands its kernel the stamps `carrier(name)`
    returns: (begin, end), each a `Carried` (kernels/stamp.py) or None."""
    global _carrier
    prev, _carrier = _carrier, carrier
    try:
        yield
    finally:
        _carrier = prev


def dispatch(name: str, kernel, ref, *args):
    """kernel(*args) on CUDA tensors (ref after a failure, logged once, inside
    `references()`, or where `kernel` is None: no kernel for these shapes), ref(*args)
    otherwise. Inside `carrying()` the kernel carries the stamps the carrier hands this op
    (kernels/stamp.py); the reference runs between stamp launches instead."""
    begin = end = None
    if _carrier is not None:
        begin, end = _carrier(name)
    if kernel is not None and args[0].is_cuda and not _references and name not in _failed:
        try:
            if begin is None and end is None:        # every op's hot path: no stamps
                return kernel(*args)
            return kernel(*args, **{k: c for k, c in (("begin", begin), ("end", end))
                                    if c is not None})
        except Exception as e:   # a compile/launch failure: fall back, loudly, once
            _failed.add(name)
            logger.warning("fused %s: the Triton kernel failed (%s: %s); this op runs its "
                           "torch reference from now on.", name, type(e).__name__,
                           str(e).splitlines()[0] if str(e) else "")
    if begin is None and end is None:
        return ref(*args)
    return stamp_around(begin, end, ref, *args)


# -- residual add + RMSNorm ---------------------------------------------------------------
@dataclass(frozen=True)
class PendingCombine:
    """A grouped MoE FFN's output [T, H] before its weighted combine, for the add_rmsnorm
    that consumes it to sum (kernels/fused_moe.py `combine`):

        out[t] = round(sum_j weights[t, j] * y[t*k + j]     fp32, j = 0 .. k-1 in order
                       + gate[t] * y[T*k + t])               only where gate is given

    y [T*k (+ T), H] in the output's dtype; weights [T, k], gate [T] fp32 (contiguous)."""
    y: torch.Tensor
    weights: torch.Tensor
    gate: Optional[torch.Tensor]

    def materialize(self) -> torch.Tensor:
        """`out` in torch (the reference path; the kernels sum it inside add_rmsnorm)."""
        T, k = self.weights.shape
        y = self.y.float()
        acc = torch.zeros(T, y.shape[1], dtype=torch.float32, device=y.device)
        for j in range(k):
            acc = acc + self.weights[:, j, None].float() * y[j:T * k:k]
        if self.gate is not None:
            acc = acc + self.gate[:, None].float() * y[T * k:T * k + T]
        return acc.to(self.y.dtype)


Residual = Union[torch.Tensor, PendingCombine, None]


@triton.jit
def combine_rows(Y, Wt, G, t, cols, m, NK, stride_y, TOPK: tl.constexpr, GATED: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Token t's combine over `cols` in fp32, unrounded: sum_j Wt[t, j] * Y[t*TOPK + j]
    (j in order), then + G[t] * Y[NK + t] where GATED. The one sum of the combine kernel
    (fused_moe.py) and of add_rmsnorm over a PendingCombine."""
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOPK):
        w = tl.load(Wt + t * TOPK + j).to(tl.float32)
        acc += w * tl.load(Y + (t * TOPK + j) * stride_y + cols, mask=m, other=0.0).to(tl.float32)
    if GATED:
        g = tl.load(G + t)
        acc += g * tl.load(Y + (NK + t) * stride_y + cols, mask=m, other=0.0).to(tl.float32)
    return acc


@triton.jit
def _add_rmsnorm_kernel(X, R, W, Y, RO, Wt, G, stride_x, stride_r, stride_y, stride_ro, N, NK,
                        eps, RES: tl.constexpr, TOPK: tl.constexpr, GATED: tl.constexpr,
                        BLOCK: tl.constexpr):
    """One program per row; the row's sum of squares is one tl.sum over the row in a fixed
    order, so a row's result never depends on how many rows the batch has (batch-invariant
    by construction). RES 0: no residual; 1: R's row; 2: a PendingCombine of R = y, Wt =
    weights, G = gate (GATED), NK = T*k, summed as the combine kernel sums it."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < N
    x = tl.load(X + row * stride_x + cols, mask=m, other=0.0).to(tl.float32)
    if RES == 1:
        r = tl.load(R + row * stride_r + cols, mask=m, other=0.0).to(tl.float32)
    if RES == 2:
        r = combine_rows(R, Wt, G, row, cols, m, NK, stride_r, TOPK, GATED, BLOCK)
        r = r.to(RO.dtype.element_ty).to(tl.float32)
    if RES > 0:
        s = (x + r).to(RO.dtype.element_ty)
        tl.store(RO + row * stride_ro + cols, s, mask=m)
        x = s.to(tl.float32)
    var = tl.sum(x * x, axis=0) / N
    rstd = 1.0 / tl.sqrt(var + eps)
    y = (x * rstd).to(Y.dtype.element_ty).to(tl.float32)
    w = tl.load(W + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (w * y).to(Y.dtype.element_ty), mask=m)


def add_rmsnorm_ref(x: torch.Tensor, residual: Residual, weight: torch.Tensor,
                    eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) * weight, x + residual); residual None -> (RMSNorm(x), x)."""
    if isinstance(residual, PendingCombine):
        residual = residual.materialize()
    s = x if residual is None else x + residual
    sf = s.float()
    sf = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * sf.to(s.dtype), s


def add_rmsnorm_triton(x: torch.Tensor, residual: Residual, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of `add_rmsnorm_ref`: x/residual [T, N] (last dim contiguous)."""
    T, N = x.shape
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty_like(x)
    if residual is None:
        mode, r, ro, wt, g, nk, k = 0, x, x, x, x, 0, 1
    elif isinstance(residual, PendingCombine):
        r, wt = residual.y.contiguous(), residual.weights.contiguous()
        k = wt.shape[1]
        g = residual.gate if residual.gate is not None else wt
        mode, ro, nk = 2, torch.empty_like(x), T * k
    else:
        mode, r, ro, wt, g, nk, k = 1, residual.contiguous(), torch.empty_like(x), x, x, 0, 1
    if T:
        block = triton.next_power_of_2(N)
        _add_rmsnorm_kernel[(T,)](x, r, weight, y, ro, wt, g, x.stride(0), r.stride(0),
                                  y.stride(0), ro.stride(0), N, nk, float(eps), RES=mode,
                                  TOPK=k, GATED=mode == 2 and residual.gate is not None,
                                  BLOCK=block, num_warps=_warps(block))
    return y, ro


def add_rmsnorm(x: torch.Tensor, residual: Residual, weight: torch.Tensor,
                eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (normed, x + residual): the residual add and the RMSNorm in one kernel on CUDA
    (a PendingCombine residual summed in the same kernel)."""
    return dispatch("add_rmsnorm", add_rmsnorm_triton, add_rmsnorm_ref, x, residual, weight,
                    eps)


# -- RoPE + KV-cache write ----------------------------------------------------------------
@triton.jit
def _rope_rows(src, c, s, heads, j, m, HALF: tl.constexpr):
    """Rotate [heads, 2*HALF] rows at `src` (row stride 2*HALF): (first half, second half)."""
    x1 = tl.load(src + heads[:, None] * (2 * HALF) + j[None, :], mask=m, other=0.0)
    x2 = tl.load(src + heads[:, None] * (2 * HALF) + HALF + j[None, :], mask=m, other=0.0)
    x1 = x1.to(tl.float32)
    x2 = x2.to(tl.float32)
    return x1 * c[None, :] - x2 * s[None, :], x2 * c[None, :] + x1 * s[None, :]


@triton.jit
def _rope_kv_kernel(QKV, Pos, Cos, Sin, Q, KC, VC, Loc,
                    stride_t, stride_qt, stride_qh, stride_cos, stride_sin,
                    stride_kn, stride_kh, stride_vn, stride_vh,
                    NQ: tl.constexpr, NKV: tl.constexpr, HALF: tl.constexpr,
                    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
                    WRITE_KV: tl.constexpr):
    """One program per token. Row layout of QKV: [q heads | k heads | v heads], head_dim
    2*HALF each. Writes rotated q to Q and, with WRITE_KV, rotated k and v into the caches
    at slot Loc[t]."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    j = tl.arange(0, BLOCK_D)
    jm = j < HALF
    c = tl.load(Cos + pos * stride_cos + j, mask=jm, other=0.0).to(tl.float32)
    s = tl.load(Sin + pos * stride_sin + j, mask=jm, other=0.0).to(tl.float32)
    src = QKV + t * stride_t
    hq = tl.arange(0, BLOCK_HQ)
    qm = (hq < NQ)[:, None] & jm[None, :]
    o1, o2 = _rope_rows(src, c, s, hq, j, qm, HALF)
    dst = Q + t * stride_qt + hq[:, None] * stride_qh + j[None, :]
    tl.store(dst, o1.to(Q.dtype.element_ty), mask=qm)
    tl.store(dst + HALF, o2.to(Q.dtype.element_ty), mask=qm)
    if WRITE_KV:
        loc = tl.load(Loc + t).to(tl.int64)
        hk = tl.arange(0, BLOCK_HK)
        km = (hk < NKV)[:, None] & jm[None, :]
        k1, k2 = _rope_rows(src + NQ * 2 * HALF, c, s, hk, j, km, HALF)
        kdst = KC + loc * stride_kn + hk[:, None] * stride_kh + j[None, :]
        tl.store(kdst, k1.to(KC.dtype.element_ty), mask=km)
        tl.store(kdst + HALF, k2.to(KC.dtype.element_ty), mask=km)
        vsrc = src + (NQ + NKV) * 2 * HALF + hk[:, None] * (2 * HALF) + j[None, :]
        v1 = tl.load(vsrc, mask=km, other=0.0)
        v2 = tl.load(vsrc + HALF, mask=km, other=0.0)
        vdst = VC + loc * stride_vn + hk[:, None] * stride_vh + j[None, :]
        tl.store(vdst, v1.to(VC.dtype.element_ty), mask=km)
        tl.store(vdst + HALF, v2.to(VC.dtype.element_ty), mask=km)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
    """x [T, heads, d] rotated at `positions` [T] with tables cos/sin [max_pos, d] (each
    row = [freqs, freqs]); computed in fp32, returned in x's dtype."""
    c = cos[positions][:, None, :]
    s = sin[positions][:, None, :]
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], -1)
    return (xf * c + rot * s).to(x.dtype)


def rope_qkv_cache_ref(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, nq: int, nkv: int, k_cache: Optional[torch.Tensor],
                       v_cache: Optional[torch.Tensor],
                       out_loc: Optional[torch.Tensor]) -> torch.Tensor:
    """qkv [T, (nq + 2*nkv) * d] -> rotated q [T, nq, d]; with out_loc, rotated k and v are
    written to k_cache/v_cache [N, nkv, d] at slots out_loc [T] (nkv may be 0 without it)."""
    T, d = qkv.shape[0], cos.shape[-1]
    q = apply_rope(qkv[:, :nq * d].view(T, nq, d), cos, sin, positions)
    if out_loc is not None:
        k = apply_rope(qkv[:, nq * d:(nq + nkv) * d].view(T, nkv, d), cos, sin, positions)
        v = qkv[:, (nq + nkv) * d:(nq + 2 * nkv) * d].view(T, nkv, d)
        k_cache[out_loc] = k.to(k_cache.dtype)
        v_cache[out_loc] = v.to(v_cache.dtype)
    return q


def rope_qkv_cache_triton(qkv: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, nq: int, nkv: int, k_cache: Optional[torch.Tensor],
                          v_cache: Optional[torch.Tensor],
                          out_loc: Optional[torch.Tensor]) -> torch.Tensor:
    """Triton version of `rope_qkv_cache_ref` (one program per token)."""
    T, d = qkv.shape[0], cos.shape[-1]
    if d % 2 or qkv.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("rope_qkv_cache: head_dim must be even and rows contiguous.")
    q = qkv.new_empty(T, nq, d)
    write = out_loc is not None
    positions = positions.contiguous()          # read with unit stride
    kc = k_cache if write else q
    vc = v_cache if write else q
    loc = out_loc.contiguous() if write else positions
    if write and (kc.stride(-1) != 1 or vc.stride(-1) != 1):
        raise ValueError("rope_qkv_cache: the KV caches must be contiguous in head_dim.")
    if T:
        half = d // 2
        tile = triton.next_power_of_2(nq) * triton.next_power_of_2(half)
        _rope_kv_kernel[(T,)](
            qkv, positions, cos, sin, q, kc, vc, loc,
            qkv.stride(0), q.stride(0), q.stride(1), cos.stride(0), sin.stride(0),
            kc.stride(0), kc.stride(1), vc.stride(0), vc.stride(1),
            NQ=nq, NKV=nkv if write else 0, HALF=half,
            BLOCK_HQ=triton.next_power_of_2(nq), BLOCK_HK=triton.next_power_of_2(max(nkv, 1)),
            BLOCK_D=triton.next_power_of_2(half), WRITE_KV=write, num_warps=_warps(tile))
    return q


def rope_qkv_cache(qkv, positions, cos, sin, nq, nkv, k_cache, v_cache, out_loc):
    """RoPE on q (and k) plus the KV-cache write of k and v in one kernel on CUDA (see
    `rope_qkv_cache_ref`)."""
    return dispatch("rope_qkv_cache", rope_qkv_cache_triton, rope_qkv_cache_ref, qkv,
                     positions, cos, sin, nq, nkv, k_cache, v_cache, out_loc)


# -- SiLU * mul -----------------------------------------------------------------------------
@triton.jit
def _silu_mul_kernel(GU, O, stride_g, stride_o, I, BLOCK: tl.constexpr):
    """Grid (rows, column blocks): out[t, c] = silu(gu[t, c]) * gu[t, I + c]."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < I
    g = tl.load(GU + t * stride_g + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(GU + t * stride_g + I + cols, mask=m, other=0.0).to(tl.float32)
    a = (g / (1.0 + tl.exp(-g))).to(O.dtype.element_ty).to(tl.float32)
    tl.store(O + t * stride_o + cols, (a * u).to(O.dtype.element_ty), mask=m)


def silu_mul_ref(gu: torch.Tensor) -> torch.Tensor:
    """gu [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    g, u = gu.chunk(2, dim=-1)
    return F.silu(g) * u


def silu_mul_triton(gu: torch.Tensor) -> torch.Tensor:
    T, I2 = gu.shape
    if I2 % 2 or gu.stride(-1) != 1:
        raise ValueError("silu_mul: the last dim must be even ([gate | up]) and contiguous.")
    I = I2 // 2
    out = gu.new_empty(T, I)
    block = min(1024, triton.next_power_of_2(I))
    if T:
        _silu_mul_kernel[(T, triton.cdiv(I, block))](gu, out, gu.stride(0), out.stride(0), I,
                                                     BLOCK=block, num_warps=4)
    return out


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up in one kernel on CUDA (see `silu_mul_ref`)."""
    return dispatch("silu_mul", silu_mul_triton, silu_mul_ref, gu)
