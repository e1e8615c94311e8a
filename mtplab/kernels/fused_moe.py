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
    combine      program (token t, column tile): out[t] = round(shared + sum_j w[t,j] *
                 y[t*k + j])   (fp32, j in order 0..k-1, then the shared term); with
                 `defer` (moe_ffn) the consumer's add_rmsnorm sums the rows instead, with
                 the same arithmetic (fused_ops.PendingCombine): one launch fewer a layer

    sorted   | e0 e0 e0 -- | e3 -- -- -- | e7 e7 e7 e7 | e7 -- -- -- | (-1 blocks) | shared |
    block    |     0       |     1       |     2       |     3       |   4 ...     | NB ... |

Two ways in:
    fused_moe   (split)    routing from torch (`route`, `align` here), the shared expert's
                           output computed before (its own GEMMs): shared = that [T, H] tensor
    moe_ffn     (grouped)  a `Routing` from the one routing kernel (kernels/moe_route.py) and
                           the shared expert folded into the same two GEMM launches: after the
                           NB routed blocks come ceil(T / BLOCK_M) shared blocks whose rows
                           are the tokens (act / y rows N + t) and whose weights are the
                           shared expert's own (width Is, not I);
                           shared = gate[t] * y[N + t], gate = sigmoid(x . w_shared_gate);
                           where the routing launch computed the shared act rows
                           (Routing.shared_act) gate_up skips the shared blocks and down
                           reads those rows

Each GEMM program owns one expert's tile: the expert's weights are read once per block that
holds its tokens (an expert no token chose is never read), and a row's result depends on its
own row only (the K loop runs from 0 in fixed BLOCK_K steps; tiles are fixed per dtype, never
chosen by T), so the kernels are batch-invariant as deterministic mode needs. Every shape is
fixed by T (the grid covers L / BLOCK_M blocks; unused blocks exit at once) and no length is
read on the host: the whole FFN is CUDA-graph capturable.

`fused_moe_ref` / `moe_ffn_ref` compute the same functions in torch (the same alignment, one
gathered bmm per block; their shapes are fixed by T as well, so they capture too): the CPU
path, the engine's unfused mode and the kernels' test oracles. They gather each used block's
expert weights, so on a GPU at large batch they move more bytes than the kernels.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.nn.functional as F
from ..lazy_triton import tl, triton
from . import batch_invariant
from .fused_ops import PendingCombine, combine_rows, dispatch


def block_m(device_type: str) -> int:
    """Rows per block: 16 on CUDA (the smallest tensor-core tile), 4 in the interpreter."""
    return 16 if device_type == "cuda" else 4


# The grouped kernels' launch shapes for 16-bit weights on CUDA, per kernel (gate/up reads
# K = H per tile, down K = I): studies/moe/moe_floor_runner.py's `tiles` phase times each
# kernel at every shape of its TILE_SWEEP against these.
TILES_16BIT = {"gate_up": dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4),
               "down": dict(BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)}


def _tiles(dtype: torch.dtype, device_type: str, kernel: str) -> dict:
    """Column / reduction tiles of `kernel` (gate_up | down): fixed per dtype and device,
    never per T (batch invariance). The interpreter's tl.dot mis-computes bfloat16 operands
    (Triton 3.9), so there the operands are widened to fp32 first (exact; the products and
    sums are fp32 either way)."""
    if device_type != "cuda":
        return dict(BLOCK_N=32, BLOCK_K=32, DOT_PREC="ieee", UPCAST=True)
    if dtype == torch.float32:
        return dict(BLOCK_N=32, BLOCK_K=32, DOT_PREC="ieee", UPCAST=False, num_warps=4)
    return dict(TILES_16BIT[kernel], DOT_PREC="tf32", UPCAST=False)


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


@dataclass(frozen=True)
class Routing:
    """One MoE layer's routing of T tokens (kernels/moe_route.py makes it): weights [T, k]
    float32 and ids [T, k] int64 (best first), the shared expert's gate [T] float32 (None
    without one), and the alignment of the T*k slots (`align`'s layout at `bm` rows a block):
    sorted_ids [L] int32, block_expert [L / bm] int32; shared_act [T, Is]: the shared
    expert's silu(gate) * up rows where the routing launch computed them (then gate_up reads
    only the routed blocks), else None."""
    weights: torch.Tensor
    ids: torch.Tensor
    gate: Optional[torch.Tensor]
    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    shared_act: Optional[torch.Tensor] = None


# -- torch references -----------------------------------------------------------------------
def _routed_ref(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, k: int,
                sorted_ids: torch.Tensor, block_expert: torch.Tensor) -> torch.Tensor:
    """y [T*k, H]: every slot's expert output (rounded to x's dtype), one bmm per block."""
    T, H = x.shape
    I = w_gate_up.shape[1] // 2
    N = T * k
    nb = block_expert.numel()
    slots = sorted_ids.long().view(nb, -1)
    valid = slots < N
    tok = torch.where(valid, slots // k, 0)
    e = block_expert.long().clamp(min=0)
    gu = torch.bmm(x[tok], w_gate_up[e].transpose(1, 2))               # [nb, bm, 2I]
    g, u = gu.split(I, dim=-1)
    act = F.silu(g.float()).to(x.dtype) * u
    y = torch.bmm(act, w_down[e].transpose(1, 2))                        # [nb, bm, H]
    per_slot = torch.zeros(N + 1, H, dtype=x.dtype, device=x.device)
    per_slot[torch.where(valid, slots, N).reshape(-1)] = y.reshape(-1, H)
    return per_slot[:N]


def fused_moe_ref(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                  weights: torch.Tensor, ids: torch.Tensor,
                  shared: Optional[torch.Tensor]) -> torch.Tensor:
    """x [T, H], w_gate_up [E, 2I, H], w_down [E, H, I], weights/ids [T, k], shared [T, H]
    (the gated shared expert's output, or None) -> [T, H]; the module doc's arithmetic."""
    T, H = x.shape
    k = ids.shape[1]
    y = _routed_ref(x, w_gate_up, w_down, k, *align(ids, w_gate_up.shape[0], 4))
    acc = (y.view(T, k, H).float() * weights[..., None].float()).sum(1)
    if shared is not None:
        acc = acc + shared.float()
    return acc.to(x.dtype)


def moe_ffn_ref(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                routing: Routing, shared_gate_up: Optional[torch.Tensor],
                shared_down: Optional[torch.Tensor]) -> torch.Tensor:
    """The grouped FFN (module doc): the routed experts as `fused_moe_ref` (the routing's
    alignment), plus gate[t] * the shared expert's SwiGLU (shared_gate_up [2Is, H], gate rows
    first; shared_down [H, Is]), each GEMM's output rounded to x's dtype."""
    T, H = x.shape
    k = routing.ids.shape[1]
    y = _routed_ref(x, w_gate_up, w_down, k, routing.sorted_ids, routing.block_expert)
    acc = (y.view(T, k, H).float() * routing.weights[..., None].float()).sum(1)
    if shared_gate_up is not None:
        g, u = (x @ shared_gate_up.T).split(shared_gate_up.shape[0] // 2, dim=-1)
        ys = (F.silu(g.float()).to(x.dtype) * u) @ shared_down.T
        acc = acc + routing.gate[:, None].float() * ys.float()
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


@triton.jit
def _gate_up_tile(X, Wg, Wu, A, tok, out_rows, valid, width, K, stride_xt, stride_wn,
                  stride_as, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """act[out_rows, n tile] = silu(x[tok] @ Wg^T) * (x[tok] @ Wu^T) for the columns of
    tile `pid_n` below `width` (a tile past it does nothing)."""
    if pid_n * BLOCK_N < width:
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < width
        rk = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + rk
            k_ok = k < K
            x = _row_tile(X, tok, stride_xt, k, valid, k_ok)
            wg = _weight_tile(Wg, rn, stride_wn, k, n_ok, k_ok)
            wu = _weight_tile(Wu, rn, stride_wn, k, n_ok, k_ok)
            if UPCAST:
                x, wg, wu = x.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
            acc_g = tl.dot(x, wg, acc_g, input_precision=DOT_PREC)
            acc_u = tl.dot(x, wu, acc_u, input_precision=DOT_PREC)
        g = acc_g.to(A.dtype.element_ty).to(tl.float32)
        u = acc_u.to(A.dtype.element_ty).to(tl.float32)
        s = (g / (1.0 + tl.exp(-g))).to(A.dtype.element_ty).to(tl.float32)
        tl.store(A + out_rows[:, None] * stride_as + rn[None, :],
                 (s * u).to(A.dtype.element_ty), mask=valid[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["N", "T", "NBR"])
def _gate_up_kernel(X, W, A, Sorted, BlockExpert, N, K, I, stride_xt, stride_we, stride_wn,
                    stride_as, T, NBR, WS, IS, stride_wsn,
                    TOPK: tl.constexpr, SHARED: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PREC: tl.constexpr,
                    UPCAST: tl.constexpr):
    """Blocks 0..NBR-1: the routed blocks of the alignment; from NBR on (SHARED): the
    shared expert's blocks of BLOCK_M tokens, rows N + t."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m < NBR:
        e = tl.load(BlockExpert + pid_m)
        if e >= 0:
            slots = tl.load(Sorted + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
            valid = slots < N
            w_e = W + e.to(tl.int64) * stride_we
            _gate_up_tile(X, w_e, w_e + I * stride_wn, A, (slots // TOPK).to(tl.int64),
                          slots.to(tl.int64), valid, I, K, stride_xt, stride_wn, stride_as,
                          pid_n, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PREC, UPCAST)
    if SHARED:
        if pid_m >= NBR:
            tok = (pid_m - NBR) * BLOCK_M + tl.arange(0, BLOCK_M)
            valid = tok < T
            tok = tok.to(tl.int64)
            _gate_up_tile(X, WS, WS + IS * stride_wsn, A, tok, N + tok, valid, IS, K,
                          stride_xt, stride_wsn, stride_as, pid_n, BLOCK_M, BLOCK_N, BLOCK_K,
                          DOT_PREC, UPCAST)


@triton.jit
def _down_tile(A, W, Y, rows, y_rows, valid, K, H, stride_as, stride_wn, stride_ys, pid_n,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """y[y_rows, n tile] = act[rows, :K] @ W[n tile, :K]^T."""
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < H
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        k_ok = k < K
        a = _row_tile(A, rows, stride_as, k, valid, k_ok)
        w = _weight_tile(W, rn, stride_wn, k, n_ok, k_ok)
        if UPCAST:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = tl.dot(a, w, acc, input_precision=DOT_PREC)
    tl.store(Y + y_rows[:, None] * stride_ys + rn[None, :], acc.to(Y.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["N", "T", "NBR"])
def _down_kernel(A, W, Y, Sorted, BlockExpert, N, K, H, stride_as, stride_we, stride_wn,
                 stride_ys, T, NBR, WS, IS, stride_wsn, AS, stride_ass, SHARED: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """Shared blocks read the shared expert's act rows t from AS (act[N:] or the routing's
    shared_act) and write y rows N + t."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m < NBR:
        e = tl.load(BlockExpert + pid_m)
        if e >= 0:
            slots = tl.load(Sorted + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            _down_tile(A, W + e.to(tl.int64) * stride_we, Y, slots, slots, slots < N,
                       K, H, stride_as, stride_wn, stride_ys, pid_n, BLOCK_M, BLOCK_N,
                       BLOCK_K, DOT_PREC, UPCAST)
    if SHARED:
        if pid_m >= NBR:
            tok = ((pid_m - NBR) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            _down_tile(AS, WS, Y, tok, N + tok, tok < T, IS, H, stride_ass,
                       stride_wsn, stride_ys, pid_n, BLOCK_M, BLOCK_N, BLOCK_K, DOT_PREC,
                       UPCAST)


@triton.jit(do_not_specialize=["N"])
def _combine_kernel(Y, Wt, S, G, Out, N, H, stride_ys, stride_ot, stride_st,
                    TOPK: tl.constexpr, SHARED: tl.constexpr, BLOCK: tl.constexpr):
    """SHARED 0: no shared expert; 1: + S[t] (its gated output); 2: + G[t] * Y[N + t]."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < H
    acc = combine_rows(Y, Wt, G, t, cols, m, N, stride_ys, TOPK, SHARED == 2, BLOCK)
    if SHARED == 1:
        acc += tl.load(S + t * stride_st + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(Out + t * stride_ot + cols, acc.to(Out.dtype.element_ty), mask=m)


def _launch(x, w_gate_up, w_down, weights, k, sorted_ids, block_expert, shared=None,
            gate=None, shared_gate_up=None, shared_down=None, shared_act=None,
            defer=False) -> Union[torch.Tensor, PendingCombine]:
    """The three launches; `shared` (a [T, H] output, combine mode 1) or the shared expert's
    weights and gate (folded in, mode 2) or neither. Folded with `shared_act` (the routing
    launch's shared rows): gate_up runs the routed blocks only, down reads shared_act.
    `defer` (not with `shared`): the two GEMMs only, and their rows as a PendingCombine."""
    T, H = x.shape
    E, I2, _ = w_gate_up.shape
    I, N = I2 // 2, T * k
    if T == 0:
        return torch.empty_like(x)
    dev = x.device.type
    bm = block_m(dev)
    gu, dn = _tiles(x.dtype, dev, "gate_up"), _tiles(x.dtype, dev, "down")
    x, weights = x.contiguous(), weights.contiguous()
    folded = shared_gate_up is not None
    nbr = block_expert.numel()
    Is = shared_gate_up.shape[0] // 2 if folded else 0
    rows = N + (T if folded else 0)
    y = torch.empty(rows, H, dtype=x.dtype, device=x.device)
    nbs = triton.cdiv(T, bm) if folded else 0
    sgu = shared_gate_up if folded else w_gate_up
    sd = shared_down if folded else w_down
    gu_shared = folded and shared_act is None          # gate_up computes the shared rows
    if gu_shared:
        act = torch.empty(rows, max(I, Is), dtype=x.dtype, device=x.device)
    else:
        act = torch.empty(N, I, dtype=x.dtype, device=x.device)
    sact = act[N:] if gu_shared else shared_act if folded else act
    _gate_up_kernel[(nbr + (nbs if gu_shared else 0),
                     triton.cdiv(max(I, Is if gu_shared else 0), gu["BLOCK_N"]))](
        x, w_gate_up, act, sorted_ids, block_expert, N, H, I, x.stride(0),
        w_gate_up.stride(0), w_gate_up.stride(1), act.stride(0), T, nbr, sgu, Is,
        sgu.stride(-2), TOPK=k, SHARED=gu_shared, BLOCK_M=bm, **gu)
    _down_kernel[(nbr + nbs, triton.cdiv(H, dn["BLOCK_N"]))](
        act, w_down, y, sorted_ids, block_expert, N, I, H, act.stride(0), w_down.stride(0),
        w_down.stride(1), y.stride(0), T, nbr, sd, Is, sd.stride(-2), sact, sact.stride(0),
        SHARED=folded, BLOCK_M=bm, **dn)
    if defer and shared is None:
        return PendingCombine(y, weights, gate.contiguous() if folded else None)
    out = torch.empty_like(x)
    s = shared.contiguous() if shared is not None else x
    g = gate if folded else weights
    block = min(1024, triton.next_power_of_2(H))
    _combine_kernel[(T, triton.cdiv(H, block))](
        y, weights, s, g, out, N, H, y.stride(0), out.stride(0), s.stride(0), TOPK=k,
        SHARED=2 if folded else 1 if shared is not None else 0, BLOCK=block)
    return out


def fused_moe_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                     weights: torch.Tensor, ids: torch.Tensor,
                     shared: Optional[torch.Tensor]) -> torch.Tensor:
    """Triton version of `fused_moe_ref` (same arguments; weights' last dim contiguous)."""
    sorted_ids, block_expert = align(ids, w_gate_up.shape[0], block_m(x.device.type))
    return _launch(x, w_gate_up, w_down, weights, ids.shape[1], sorted_ids, block_expert,
                   shared=shared)


def moe_ffn_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor,
                   routing: Routing, shared_gate_up: Optional[torch.Tensor],
                   shared_down: Optional[torch.Tensor],
                   defer: bool = False) -> Union[torch.Tensor, PendingCombine]:
    """Triton version of `moe_ffn_ref`: the routing's alignment must have `block_m` rows a
    block on x's device (kernels/moe_route.py makes it so); weights' last dims contiguous.
    `defer`: the combine left to the consumer's add_rmsnorm (a PendingCombine)."""
    bm = block_m(x.device.type)
    if routing.sorted_ids.numel() != routing.block_expert.numel() * bm:
        raise ValueError(f"moe_ffn_triton: the routing's alignment has "
                         f"{routing.sorted_ids.numel() // max(1, routing.block_expert.numel())}"
                         f" rows a block, the kernels {bm}; route with bm={bm}.")
    return _launch(x, w_gate_up, w_down, routing.weights, routing.ids.shape[1],
                   routing.sorted_ids, routing.block_expert, gate=routing.gate,
                   shared_gate_up=shared_gate_up, shared_down=shared_down,
                   shared_act=routing.shared_act if shared_gate_up is not None else None,
                   defer=defer)


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


def moe_ffn(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, routing: Routing,
            shared_gate_up: Optional[torch.Tensor] = None,
            shared_down: Optional[torch.Tensor] = None,
            defer: bool = False) -> Union[torch.Tensor, PendingCombine]:
    """The grouped FFN: the kernels in deterministic mode (any device) and on CUDA, the
    reference elsewhere or inside `references()` (as `fused_moe`). `defer`: where the
    kernels run on CUDA, a PendingCombine for the consumer's add_rmsnorm to sum (fused_ops);
    a tensor otherwise."""
    args = (x, w_gate_up, w_down, routing, shared_gate_up, shared_down)
    kernels = functools.partial(moe_ffn_triton, defer=defer and x.is_cuda)
    if batch_invariant.is_active():
        return kernels(*args)
    return dispatch("moe_ffn", kernels, moe_ffn_ref, *args)
