"""Fused mixture-of-experts FFN: tokens sorted by expert, a grouped gate/up GEMM with SiLU * up
in its epilogue, a grouped down GEMM, and a weighted combine with the shared expert's output.

    x [T, H], routing (weights [T, k], ids [T, k]) -> N = T*k slots, slot s = t*k + j
    align        slots sorted by expert, each expert's run padded to a multiple of BLOCK_M:
                 sorted [L] (slot ids, N = padding), block_expert [L / BLOCK_M] (-1: unused)
                 L = N + min(E, N) * (BLOCK_M - 1) rounded up: a fixed length for a fixed T
    gate_up      program (block b, column tile n): e = block_expert[b];
                 act[slot] = round(round(silu(round(x[tok] @ Wgu[e, n]))) * round(x[tok] @
                 Wgu[e, I + n]))  -- gate and up tiles of one program, one pass over x
    down         program (block b, column tile n): y[slot] = round(act[slot] @ Wd[e, n])
    combine      program (token t, column tile): out[t] = round(shared[t] + sum_j w[t,j] *
                 y[t*k + j])   (fp32, j in order 0..k-1)

    sorted   | e0 e0 e0 -- | e3 -- -- -- | e7 e7 e7 e7 | e7 -- -- -- | (-1 blocks) |
    block    |     0       |     1       |     2       |     3       |   4 ...     |

Each GEMM program owns one expert's tile: the expert's weights are read once per block that
holds its tokens (an expert no token chose is never read), and a row's result depends on its
own row only (the K loop runs from 0 in fixed BLOCK_K steps; tiles are fixed per dtype, never
chosen by T), so the kernels are batch-invariant as deterministic mode needs. Every shape is
fixed by T (the grid covers L / BLOCK_M blocks; unused blocks exit at once) and no length is
read on the host: the whole FFN is CUDA-graph capturable.

`fused_moe_ref` computes the same function in torch (the same alignment, one gathered bmm per
block; its shapes are fixed by T as well, so it captures too): the CPU path, the engine's
unfused mode and the kernels' test oracle. It gathers each used block's expert weights, so on
a GPU at large batch it moves more bytes than the kernels.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from ..lazy_triton import tl, triton
from . import batch_invariant
from .fused_ops import dispatch


def block_m(device_type: str) -> int:
    """Rows per block: 16 on CUDA (the smallest tensor-core tile), 4 in the interpreter."""
    return 16 if device_type == "cuda" else 4


def _tiles(dtype: torch.dtype, device_type: str) -> dict:
    """Column / reduction tiles: fixed per dtype and device, never per T (batch invariance).
    The interpreter's tl.dot mis-computes bfloat16 operands (Triton 3.9), so there the
    operands are widened to fp32 first (exact; the products and sums are fp32 either way)."""
    if device_type != "cuda":
        return dict(BLOCK_N=32, BLOCK_K=32, DOT_PREC="ieee", UPCAST=True)
    if dtype == torch.float32:
        return dict(BLOCK_N=32, BLOCK_K=32, DOT_PREC="ieee", UPCAST=False, num_warps=4)
    return dict(BLOCK_N=32, BLOCK_K=128, DOT_PREC="tf32", UPCAST=False, num_warps=4,
                num_stages=4)


def aligned_len(num_slots: int, num_experts: int, bm: int) -> int:
    """L: the slots plus at most BLOCK_M - 1 padding rows per expert that holds one."""
    n = num_slots + min(num_experts, num_slots) * (bm - 1)
    return (n + bm - 1) // bm * bm


def align(ids: torch.Tensor, num_experts: int, bm: int):
    """Sort the N = T*k slots by expert, each expert's run padded to a multiple of `bm`.
    -> sorted [L] int32 (slot ids; N marks padding), block_expert [L / bm] int32 (-1 past
    the last used block). Static shapes, no host read."""
    flat = ids.reshape(-1).long()
    N, E, dev = flat.numel(), num_experts, flat.device
    L = aligned_len(N, E, bm)
    counts = torch.zeros(E, dtype=torch.long, device=dev).scatter_add_(
        0, flat, torch.ones_like(flat))
    padded = (counts + bm - 1) // bm * bm
    pad_end = padded.cumsum(0)
    cnt_start = counts.cumsum(0) - counts
    order = torch.sort(flat, stable=True).indices          # slots grouped by expert
    e_sorted = flat[order]
    dest = pad_end[e_sorted] - padded[e_sorted] + torch.arange(N, device=dev) \
        - cnt_start[e_sorted]
    sorted_ids = torch.full((L,), N, dtype=torch.int32, device=dev)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    starts = torch.arange(0, L, bm, device=dev)
    be = torch.searchsorted(pad_end, starts, right=True)
    block_expert = torch.where(be < E, be, -1).to(torch.int32)
    return sorted_ids, block_expert


def route(logits: torch.Tensor, top_k: int, dtype: torch.dtype, norm: bool = True):
    """Softmax over the experts in fp32, the top k, renormalised to sum to 1 when `norm`
    (Qwen2-MoE's norm_topk_prob): -> (weights [T, k] in `dtype`, ids [T, k] int64)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    w, ids = torch.topk(probs, top_k, dim=-1)
    return (w / w.sum(-1, keepdim=True) if norm else w).to(dtype), ids


# -- torch reference ------------------------------------------------------------------------
def fused_moe_ref(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                  weights: torch.Tensor, ids: torch.Tensor,
                  shared: Optional[torch.Tensor]) -> torch.Tensor:
    """x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I], weights/ids [T, k], shared [T, H]
    (the gated shared expert's output, or None) -> [T, H]; the module doc's arithmetic."""
    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    k = ids.shape[1]
    N = T * k
    bm = 4
    sorted_ids, block_expert = align(ids, E, bm)
    nb = block_expert.numel()
    slots = sorted_ids.long().view(nb, bm)
    valid = slots < N
    tok = torch.where(valid, slots // k, 0)
    e = block_expert.long().clamp(min=0)
    gu = torch.bmm(x[tok], w_gate_up[e].transpose(1, 2))               # [nb, bm, 2I]
    g, u = gu.split(I2 // 2, dim=-1)
    act = F.silu(g.float()).to(x.dtype) * u
    y = torch.bmm(act, w_down[e].transpose(1, 2))                        # [nb, bm, H]
    per_slot = torch.zeros(N + 1, H, dtype=x.dtype, device=x.device)
    per_slot[torch.where(valid, slots, N).reshape(-1)] = y.reshape(-1, H)
    acc = (per_slot[:N].view(T, k, H).float() * weights[..., None].float()).sum(1)
    if shared is not None:
        acc = acc + shared.float()
    return acc.to(x.dtype)


# -- Triton ---------------------------------------------------------------------------------
# the two GEMMs' K-step tiles: rows of the block's tokens / slots, an expert's weight columns
@triton.jit
def _row_tile(P, rows, stride, k, valid, k_ok):
    """[BLOCK_M, BLOCK_K]: P[rows[m], k], 0 on invalid rows and past K."""
    return tl.load(P + rows[:, None] * stride + k[None, :],
                   mask=valid[:, None] & k_ok[None, :], other=0.0)


@triton.jit
def _weight_tile(w_e, cols, stride_wn, k, n_ok, k_ok):
    """[BLOCK_K, BLOCK_N]: the expert's weight rows `cols`, transposed (w_e[cols[n], k])."""
    return tl.load(w_e + cols[None, :].to(tl.int64) * stride_wn + k[:, None],
                   mask=n_ok[None, :] & k_ok[:, None], other=0.0)


@triton.jit(do_not_specialize=["N"])
def _gate_up_kernel(X, W, A, Sorted, BlockExpert, N, K, I, stride_xt, stride_we, stride_wn,
                    stride_as, TOPK: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
                    UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BlockExpert + pid_m)
    if e >= 0:
        slots = tl.load(Sorted + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = slots < N
        tok = (slots // TOPK).to(tl.int64)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < I
        rk = tl.arange(0, BLOCK_K)
        w_e = W + e.to(tl.int64) * stride_we
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            k_ok = k < K
            x = _row_tile(X, tok, stride_xt, k, valid, k_ok)
            wg = _weight_tile(w_e, rn, stride_wn, k, n_ok, k_ok)
            wu = _weight_tile(w_e, I + rn, stride_wn, k, n_ok, k_ok)
            if UPCAST:
                x, wg, wu = x.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
            acc_g = tl.dot(x, wg, acc_g, input_precision=DOT_PREC)
            acc_u = tl.dot(x, wu, acc_u, input_precision=DOT_PREC)
        g = acc_g.to(A.dtype.element_ty).to(tl.float32)
        u = acc_u.to(A.dtype.element_ty).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(A.dtype.element_ty).to(tl.float32)
        tl.store(A + slots[:, None].to(tl.int64) * stride_as + rn[None, :],
                 (s * u).to(A.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["N"])
def _down_kernel(A, W, Y, Sorted, BlockExpert, N, K, H, stride_as, stride_we, stride_wn,
                 stride_ys, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(BlockExpert + pid_m)
    if e >= 0:
        slots = tl.load(Sorted + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
        valid = slots < N
        rows = slots.to(tl.int64)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        rk = tl.arange(0, BLOCK_K)
        w_e = W + e.to(tl.int64) * stride_we
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            k_ok = k < K
            a = _row_tile(A, rows, stride_as, k, valid, k_ok)
            w = _weight_tile(w_e, rn, stride_wn, k, n_ok, k_ok)
            if UPCAST:
                a, w = a.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(a, w, acc, input_precision=DOT_PREC)
        tl.store(Y + rows[:, None] * stride_ys + rn[None, :], acc.to(Y.dtype.element_ty),
                 mask=valid[:, None] & n_ok[None, :])


@triton.jit
def _combine_kernel(Y, Wt, S, Out, H, stride_ys, stride_ot, stride_st,
                    TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < H
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(TOPK):
        w = tl.load(Wt + t * TOPK + j).to(tl.float32)
        y = tl.load(Y + (t * TOPK + j) * stride_ys + cols, mask=m, other=0.0).to(tl.float32)
        acc += w * y
    if HAS_SHARED:
        acc += tl.load(S + t * stride_st + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Out + t * stride_ot + cols, acc.to(Out.dtype.element_ty), mask=m)


def fused_moe_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     weights: torch.Tensor, ids: torch.Tensor,
                     shared: Optional[torch.Tensor]) -> torch.Tensor:
    """Triton version of `fused_moe_ref` (same arguments; weights' last dim contiguous)."""
    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    I, k = I2 // 2, ids.shape[1]
    N = T * k
    out = torch.empty_like(x)
    if T == 0:
        return out
    dev = x.device.type
    bm = block_m(dev)
    cfg = _tiles(x.dtype, dev)
    x, weights = x.contiguous(), weights.contiguous()
    sorted_ids, block_expert = align(ids, E, bm)
    nb = block_expert.numel()
    act = torch.empty(N, I, dtype=x.dtype, device=x.device)
    y = torch.empty(N, H, dtype=x.dtype, device=x.device)
    bn = cfg["BLOCK_N"]
    _gate_up_kernel[(nb, triton.cdiv(I, bn))](
        x, w_gate_up, act, sorted_ids, block_expert, N, H, I, x.stride(0),
        w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0), TOPK=k, BLOCK_M=bm, **cfg)
    _down_kernel[(nb, triton.cdiv(H, bn))](
        act, w_down, y, sorted_ids, block_expert, N, I, H, act.stride(0), w_down.stride(0),
        w_down.stride(1), y.stride(0), BLOCK_M=bm, **cfg)
    s = shared.contiguous() if shared is not None else x
    block = min(1024, triton.next_power_of_2(H))
    _combine_kernel[(T, triton.cdiv(H, block))](
        y, weights, s, out, H, y.stride(0), out.stride(0), s.stride(0), TOPK=k,
        HAS_SHARED=shared is not None, BLOCK=block)
    return out


def fused_moe(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
              weights: torch.Tensor, ids: torch.Tensor,
              shared: Optional[torch.Tensor] = None, reference: bool = False) -> torch.Tensor:
    """The routed experts' weighted sum (+ the shared expert's output). In deterministic mode
    (batch_invariant_mode active) the Triton kernels on any device (the interpreter on CPU):
    they are batch-invariant by construction, the reference's batched GEMMs are not. Else
    the reference when `reference`, or Triton on CUDA and the reference elsewhere or inside
    `references()` (fused_ops.dispatch)."""
    args = (x, w_gate_up, w_down, weights, ids, shared)
    if batch_invariant.is_active():
        return fused_moe_triton(*args)
    if reference:
        return fused_moe_ref(*args)
    return dispatch("fused_moe", fused_moe_triton, fused_moe_ref, *args)


def experts_touched(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Distinct experts the slots `ids` [T, k] route to (a 0-dim device tensor, no host read)."""
    hit = torch.zeros(num_experts, dtype=torch.bool, device=ids.device)
    return hit.index_fill_(0, ids.reshape(-1), True).sum()
