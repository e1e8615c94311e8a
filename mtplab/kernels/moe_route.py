"""MoE routing in one kernel: the router GEMM, softmax, top-k, renormalisation, the shared
expert's sigmoid gate and the alignment of the slots by expert (kernels/fused_moe.py `Routing`,
what `moe_ffn`'s grouped GEMMs read).

    x [T, H], router Wr [E, H] (+ bias [E]), shared gate Wsg [1, H] (or none)
    logits[t, e]  = x[t] . Wr[e] (+ bias[e])             fp32 accumulation
    ids[t, :]     = the k largest logits, larger first, equal logits by the lower expert
    weights[t, j] = softmax(logits[t])[ids[t, j]]        fp32; / sum_j when `norm`
    gate[t]       = sigmoid(x[t] . Wsg)                  fp32
    sorted_ids, block_expert = fused_moe.align(ids, E, bm)    (bit for bit)

One launch, grid (token blocks of BT, column blocks of BE over the E router rows and the
shared gate's row, KS splits of H + XS shared-expert slices):

    ks >= KS           (with `shared_gate_up`) a shared-expert program: the act rows of its
                       token block for column tile (ks - KS) * NEB + eb, silu(gate) * up as
                       fused_moe's gate_up kernel computes them (its tiles, its K order);
                       no arrival. They stream the shared weights while the routing's
                       arrival chain runs, so gate_up reads only the routed experts.

    ks < KS, each      partial logits of its [BT, BE] tile over its share of H -> Part[ks];
                       its share of the padding: Sorted = N and BlockExpert = -1 over
                       strided CHUNK-wide pieces (program p: p*CHUNK, p*CHUNK + P*CHUNK, ..)
                       then one arrival on its token block's counter
    the last arrival   of a token block (counter = NEB * KS - 1): sums the KS partials in
                       order ks = 0..KS-1, softmax / top-k / renormalises its BT tokens,
                       writes weights, ids and gate; per expert e its tokens' count c[tb, e]
                       and each chosen (t, e)'s rank r[t, e] among the block's tokens of e
      NTB = 1            it aligns from its registers: place[e] = padded prefix sum of c,
                         Sorted[place[e] + r[t, e]] = t*k + j (e = ids[t, j]), then the used
                         blocks' experts; no second arrival
      NTB > 1            c and r go to Scratch, then one arrival on the global counter; the
                         last block (counter = NTB - 1) sums c over blocks (TBC blocks a
                         trip), writes each block's first row per expert over its c, the used
                         blocks' experts, then scatters the slots CHUNK at a time:
                         Sorted[first[tb(t), e] + r[t, e]] = s
    used blocks        BlockExpert[place[e] / BM] = e for each used expert, then a running
                       max along the used blocks (experts ascend along them)

The finishing programs run their code once per launch, on whichever SM they land, so its
size is on the critical path: the top-k is a loop (its body fetched once), not unrolled, and
the resets of the counters are relaxed (no fence). `serial_work` counts what runs one after
the other (programs, arrival phases, fill trips of a program, loop trips of the aligning
program) from the shapes alone: at gemma4-26b-a4b's router (E 128, k 8, BM 16) one trip up
to 16 tokens, at most 11 up to ALIGN_MAX_SLOTS.

Arrivals are acq_rel atomics after a CTA barrier, and the finishing programs read the
others' results with L1-bypassing loads: what the earlier programs stored (the fill
included, through the chain of arrivals) is what the last one reads and overwrites. The
last arrival sets its counter back to 0, so `counts` (int32 zeros, at least `counts_len(T)`
entries, owned by the caller) is ready for the next launch; launches that share one `counts`
must not run concurrently (one MoE layer after the other on a stream).

Tiles and the K split depend on H, E and the dtype only, never on T, and a token's logits,
softmax and top-k use its own row only: the kernel is batch-invariant (deterministic mode).
Above ALIGN_MAX_SLOTS slots (a long prefill) the one aligning program's slot loop would be
long, so the kernel stops after the top-k and `align` (torch) sorts the slots; T is a shape,
so the choice is static and the whole routing is CUDA-graph capturable (no host read).

`route_align_ref` computes the same function in torch: the CPU path and the kernel's test
oracle (the logits' fp32 sums run in another order, so values agree to fp32 rounding and ids
wherever the logits are not within that rounding of a tie).
"""
from __future__ import annotations

from typing import Optional

import torch

from ..lazy_triton import tl, triton
from . import batch_invariant
from .fused_moe import Routing, _gate_up_tile, _tiles, align, aligned_len
from .fused_ops import dispatch
from .topk import _SENT, _index, _key, _value

ALIGN_MAX_SLOTS = 4096     # T*k above this: the slots are aligned by `align` after the kernel


def _block_t(device_type: str) -> int:
    """Tokens per routing program: 16 on CUDA (the smallest tensor-core tile), 4 in the
    interpreter."""
    return 16 if device_type == "cuda" else 4


def _config(H: int, E: int, dtype: torch.dtype, device_type: str) -> dict:
    """Tiles and the K split, fixed by H, E, dtype and device (never by T). The interpreter
    widens bf16 operands to fp32 first, as fused_moe's tiles, and runs small chunks (so that
    the tests cover several trips of every loop). On CUDA 4 warps, the warps of gate_up's
    tiles: most of a decode launch's programs stream the shared expert's weights with those
    tiles. The finishing program's code is larger at 4 warps than at 8 (about 5.0k SASS
    instructions against 3.4k at gemma4-26b-a4b's router, sm_90); bench_moe_floor's ffn
    phase times the launch at 4, 8 and 16 warps side by side, and 4 is the fastest there at
    T = 1, 8 and 32."""
    gpu = device_type == "cuda"
    bk = 64 if gpu else 32
    steps = triton.cdiv(H, bk)
    per = triton.cdiv(steps, 8)                  # ~8 splits: enough programs at T = 1
    e_p2 = triton.next_power_of_2(E)
    return dict(BT=_block_t(device_type), BE=16 if gpu else 8, BK=bk, KSTEPS=per,
                KS=triton.cdiv(steps, per), E_P2=e_p2, CHUNK=512 if gpu else 8,
                TBC=max(1, min(32, 4096 // e_p2)) if gpu else 2,
                DOT_PREC="ieee" if dtype == torch.float32 or not gpu else "tf32",
                UPCAST=not gpu, **(dict(num_warps=4) if gpu else {}))


def serial_work(T: int, H: int, E: int, top_k: int, bm: int, dtype: torch.dtype,
                device_type: str = "cuda", chunk: Optional[int] = None) -> dict:
    """The kernel's serial work at T tokens (module doc), counted from the launch's shapes:
    programs; arrival phases on the critical path (partials, then top-k, then alignment: 2
    when one token block also aligns); the most fill stores one program makes; and the loop
    trips of the one aligning program (block counts and offsets, used blocks at most, slots).
    Plain Python, no kernel runs."""
    cfg = _config(H, E, dtype, device_type)
    ch = chunk or cfg["CHUNK"]
    ntb = triton.cdiv(T, cfg["BT"])
    programs = ntb * triton.cdiv(E + 1, cfg["BE"]) * cfg["KS"]
    N = T * top_k
    L = aligned_len(N, E, bm)
    used = min(L // bm, N // bm + min(E, N))              # at most: the used blocks
    trips = triton.cdiv(used, ch)
    if ntb > 1:
        trips += 2 * triton.cdiv(ntb, cfg["TBC"]) + triton.cdiv(N, ch)
    return dict(programs=programs, phases=2 if ntb == 1 else 3,
                fill_trips=triton.cdiv(L, programs * ch) + triton.cdiv(L // bm, programs * ch),
                align_trips=trips)


def counts_len(T: int, device_type: str = "cuda") -> int:
    """Entries of `counts` a launch over T tokens needs: the global counter + one per block
    (plain Python: a CPU run of the reference never imports Triton)."""
    bt = _block_t(device_type)
    return 1 + (max(T, 1) + bt - 1) // bt


@triton.jit
def _max2(a, b):
    return tl.maximum(a, b)


@triton.jit(do_not_specialize=["T", "L", "NB"])
def _route_kernel(X, Wr, Br, Wsg, Part, Counts, Wout, Iout, Gout, Sorted, BlockExpert, Scratch,
                  T, H, L, NB, stride_x, stride_w, WS, SA, IS, stride_wsn, stride_sa,
                  E: tl.constexpr, E_P2: tl.constexpr, EW: tl.constexpr, TOPK: tl.constexpr,
                  TOPK_P2: tl.constexpr, NORM: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HAS_GATE: tl.constexpr, ALIGN: tl.constexpr, BM: tl.constexpr,
                  BT: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr,
                  KSTEPS: tl.constexpr, KS: tl.constexpr, CHUNK: tl.constexpr,
                  TBC: tl.constexpr, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr,
                  SG_BN: tl.constexpr, SG_BK: tl.constexpr, SG_PREC: tl.constexpr):
    """Grid axis 2: KS partial-logit programs, then (shared_gate_up given) the shared
    expert's programs: act rows of their token block, one SG_BN-column tile each."""
    tb = tl.program_id(0)
    eb = tl.program_id(1)
    ks = tl.program_id(2)
    ntb = tl.num_programs(0)
    if ks < KS:
        rows = tb * BT + tl.arange(0, BT)
        r_ok = rows < T
        rows64 = rows.to(tl.int64)
        cols = eb * BE + tl.arange(0, BE)            # router rows; row E is the shared gate's
        rk = tl.arange(0, BK)
        acc = tl.zeros([BT, BE], tl.float32)
        for i in range(KSTEPS):
            k = (ks * KSTEPS + i) * BK + rk
            k_ok = k < H
            x = tl.load(X + rows64[:, None] * stride_x + k[None, :],
                        mask=r_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(Wr + cols[None, :].to(tl.int64) * stride_w + k[:, None],
                        mask=(cols < E)[None, :] & k_ok[:, None], other=0.0)
            if HAS_GATE:
                w += tl.load(Wsg + k[:, None] + 0 * cols[None, :],
                             mask=(cols == E)[None, :] & k_ok[:, None], other=0.0)
            if UPCAST:
                x, w = x.to(tl.float32), w.to(tl.float32)
            acc = tl.dot(x, w, acc, input_precision=DOT_PREC)
        tl.store(Part + (ks * T + rows64[:, None]) * EW + cols[None, :], acc,
                 mask=r_ok[:, None] & (cols < EW)[None, :])
        f = tl.arange(0, CHUNK)
        if ALIGN:
            # -- every program: its share of the padding (sentinel N, block -1), CHUNK-wide ----
            P = ntb * tl.num_programs(1) * KS
            pid = tb + ntb * (eb + tl.num_programs(1) * ks)
            for s0 in range(pid * CHUNK, L, P * CHUNK):
                tl.store(Sorted + s0 + f, tl.zeros([CHUNK], tl.int32) + T * TOPK, mask=s0 + f < L)
            for b0 in range(pid * CHUNK, NB, P * CHUNK):
                tl.store(BlockExpert + b0 + f, tl.zeros([CHUNK], tl.int32) - 1, mask=b0 + f < NB)
        tl.debug_barrier()
        arrived = tl.atomic_add(Counts + 1 + tb, 1, sem="acq_rel")
        if arrived == tl.num_programs(1) * KS - 1:
            # -- the last arrival of token block tb: softmax, top-k, gate -----------------------
            tl.atomic_xchg(Counts + 1 + tb, 0, sem="relaxed")
            tl.debug_barrier()
            e = tl.arange(0, E_P2)
            e_ok = e < E
            logits = tl.zeros([BT, E_P2], tl.float32)
            for s in tl.static_range(KS):            # unrolled: the KS loads in flight together
                logits += tl.load(Part + (s * T + rows64[:, None]) * EW + e[None, :],
                                  mask=r_ok[:, None] & e_ok[None, :], other=0.0,
                                  cache_modifier=".cg")
            if HAS_BIAS:
                logits += tl.load(Br + e, mask=e_ok, other=0.0).to(tl.float32)[None, :]
            logits = tl.where(e_ok[None, :], logits, float("-inf"))
            m = tl.max(logits, axis=1)
            p = tl.exp(logits - m[:, None])
            total = tl.sum(p, axis=1)
            keys = tl.where(e_ok[None, :], _key(logits, e[None, :]), _SENT)
            j = tl.arange(0, TOPK_P2)
            wts = tl.zeros([BT, TOPK_P2], tl.float32)
            ids = tl.zeros([BT, TOPK_P2], tl.int64)
            pos = tl.zeros([BT, E_P2], tl.int32) - 1  # each expert's place in its token's top k
            best = tl.max(keys, axis=1)
            for jj in range(TOPK):                   # a loop: its body is fetched once (module doc)
                wj = tl.exp(_value(best) - m) / total
                wts = tl.where(j[None, :] == jj, wj[:, None], wts)
                ids = tl.where(j[None, :] == jj, _index(best).to(tl.int64)[:, None], ids)
                pos = tl.where(keys == best[:, None], jj, pos)     # keys are distinct
                best = tl.max(tl.where(keys < best[:, None], keys, _SENT), axis=1)
            if NORM:
                wts = wts / tl.sum(wts, axis=1)[:, None]
            out = rows64[:, None] * TOPK + j[None, :]
            o_ok = r_ok[:, None] & (j < TOPK)[None, :]
            tl.store(Wout + out, wts, mask=o_ok)
            tl.store(Iout + out, ids, mask=o_ok)
            if HAS_GATE:
                gl = tl.zeros([BT], tl.float32)
                for s in tl.static_range(KS):
                    gl += tl.load(Part + (s * T + rows64) * EW + E, mask=r_ok, other=0.0,
                                  cache_modifier=".cg")
                tl.store(Gout + rows64, 1.0 / (1.0 + tl.exp(-gl)), mask=r_ok)
            if ALIGN:
                # -- the block's share of the alignment: per expert, the count of its tokens and
                # each chosen (token, expert)'s rank among them and slot t * k + place ----------
                sel = (pos >= 0) & r_ok[:, None] & e_ok[None, :]                # [BT, E_P2]
                seli = sel.to(tl.int32)
                rank = tl.cumsum(seli, axis=0) - seli
                if ntb == 1:
                    # one token block: it aligns from its registers, no second arrival
                    counts = tl.sum(seli, axis=0)
                    padded = (counts + BM - 1) // BM * BM
                    place = tl.cumsum(padded, axis=0) - padded      # each expert's first row
                    tl.store(Sorted + place[None, :] + rank, rows[:, None] * TOPK + pos, mask=sel)
                    _block_experts(BlockExpert, place, counts, padded, e, e_ok, BM, CHUNK)
                else:
                    tl.store(Scratch + tb * E + e, tl.sum(seli, axis=0), mask=e_ok)
                    tl.store(Scratch + ntb * E + rows64[:, None] * E + e[None, :], rank, mask=sel)
                    tl.debug_barrier()
                    blocks_done = tl.atomic_add(Counts, 1, sem="acq_rel")
                    if blocks_done == ntb - 1:
                        # -- the last token block: the experts' first rows, each block's first
                        # row per expert (in place of its counts), the used blocks, the slots --
                        tl.atomic_xchg(Counts, 0, sem="relaxed")
                        tl.debug_barrier()
                        b = tl.arange(0, TBC)
                        counts = tl.zeros([E_P2], tl.int32)
                        for b0 in range(0, ntb, TBC):
                            c = tl.load(Scratch + (b0 + b)[:, None] * E + e[None, :],
                                        mask=(b0 + b < ntb)[:, None] & e_ok[None, :], other=0,
                                        cache_modifier=".cg")
                            counts += tl.sum(c, axis=0)
                        padded = (counts + BM - 1) // BM * BM
                        place = tl.cumsum(padded, axis=0) - padded
                        run = place
                        for b0 in range(0, ntb, TBC):
                            b_ok = (b0 + b < ntb)[:, None] & e_ok[None, :]
                            c = tl.load(Scratch + (b0 + b)[:, None] * E + e[None, :], mask=b_ok,
                                        other=0, cache_modifier=".cg")
                            tl.store(Scratch + (b0 + b)[:, None] * E + e[None, :],
                                     run[None, :] + tl.cumsum(c, axis=0) - c, mask=b_ok)
                            run += tl.sum(c, axis=0)
                        _block_experts(BlockExpert, place, counts, padded, e, e_ok, BM, CHUNK)
                        f = tl.arange(0, CHUNK)
                        N = T * TOPK
                        for s0 in range(0, N, CHUNK):
                            s_ok = s0 + f < N
                            ex = tl.load(Iout + s0 + f, mask=s_ok, other=0,
                                         cache_modifier=".cg").to(tl.int32)
                            t = (s0 + f) // TOPK
                            dest = tl.load(Scratch + (t // BT) * E + ex, mask=s_ok, other=0,
                                           cache_modifier=".cg") \
                                + tl.load(Scratch + ntb * E + t.to(tl.int64) * E + ex,
                                          mask=s_ok, other=0, cache_modifier=".cg")
                            tl.store(Sorted + dest, (s0 + f).to(tl.int32), mask=s_ok)
    else:
        # -- a shared-expert program: act rows of token block tb, column tile j ------------
        j = (ks - KS) * tl.num_programs(1) + eb
        tok = (tb * BT + tl.arange(0, BT)).to(tl.int64)
        _gate_up_tile(X, WS, WS + IS * stride_wsn, SA, tok, tok, tok < T, IS, H, stride_x,
                      stride_wsn, stride_sa, j, BT, SG_BN, SG_BK, SG_PREC, UPCAST)


@triton.jit
def _block_experts(BlockExpert, place, counts, padded, e, e_ok, BM: tl.constexpr,
                   CHUNK: tl.constexpr):
    """BlockExpert of the used blocks (the rest hold -1 from the fill): each used expert's
    first block, then a running max over the blocks (experts ascend along them)."""
    tl.store(BlockExpert + place // BM, e, mask=e_ok & (counts > 0))
    tl.debug_barrier()
    used = tl.sum(padded, axis=0) // BM
    f = tl.arange(0, CHUNK)
    carry = tl.zeros([CHUNK], tl.int32) - 1
    for b0 in range(0, used, CHUNK):
        v = tl.load(BlockExpert + b0 + f, mask=b0 + f < used, other=-1, cache_modifier=".cg")
        v = tl.maximum(tl.associative_scan(v, 0, _max2), carry)
        tl.store(BlockExpert + b0 + f, v, mask=b0 + f < used)
        carry = tl.zeros([CHUNK], tl.int32) + tl.max(v, axis=0)


def route_align_ref(x: torch.Tensor, w_router: torch.Tensor, bias: Optional[torch.Tensor],
                    w_gate: Optional[torch.Tensor], top_k: int, norm: bool, bm: int,
                    counts: Optional[torch.Tensor] = None,
                    shared_gate_up: Optional[torch.Tensor] = None) -> Routing:
    """x [T, H], w_router [E, H], bias [E] or None, w_gate [1, H] or None -> Routing (module
    doc). `counts` is the kernel's and unused here; so is `shared_gate_up` (no shared_act:
    the FFN computes the shared expert itself)."""
    logits = x.float() @ w_router.float().T
    if bias is not None:
        logits = logits + bias.float()
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k]
    w = torch.softmax(logits, dim=-1).gather(1, ids)
    if norm:
        w = w / w.sum(-1, keepdim=True)
    gate = torch.sigmoid(x.float() @ w_gate.float().reshape(-1)) if w_gate is not None \
        else None
    return Routing(w, ids, gate, *align(ids, w_router.shape[0], bm))


def route_align_triton(x: torch.Tensor, w_router: torch.Tensor, bias: Optional[torch.Tensor],
                       w_gate: Optional[torch.Tensor], top_k: int, norm: bool, bm: int,
                       counts: torch.Tensor, shared_gate_up: Optional[torch.Tensor] = None,
                       chunk: Optional[int] = None, tbc: Optional[int] = None,
                       num_warps: Optional[int] = None) -> Routing:
    """Triton version of `route_align_ref`; `counts`: int32 zeros of at least
    `counts_len(T)` entries (left zero); `chunk` / `tbc` override the fill and aligning
    chunk and the token blocks per counting trip (tests), `num_warps` the CUDA warps per
    program (bench_moe_floor times several side by side). With `shared_gate_up` ([2Is, H],
    gate rows first) the same launch computes the shared expert's act rows (Routing
    shared_act, as the grouped gate_up kernel would: its tiles and K order)."""
    T, H = x.shape
    E = w_router.shape[0]
    dev = x.device
    cfg = _config(H, E, x.dtype, dev.type)
    cfg["CHUNK"] = chunk or cfg["CHUNK"]
    cfg["TBC"] = tbc or cfg["TBC"]
    if num_warps and dev.type == "cuda":
        cfg["num_warps"] = num_warps
    if counts.numel() < counts_len(T, dev.type) or counts.dtype != torch.int32:
        raise ValueError(f"route_align_triton: counts must be int32 with at least "
                         f"{counts_len(T, dev.type)} entries for T={T}.")
    if w_router.stride(-1) != 1:
        raise ValueError("route_align_triton: the router weight's rows must be contiguous.")
    x = x if x.stride(-1) == 1 else x.contiguous()
    N = T * top_k
    L = aligned_len(N, E, bm)
    has_gate = w_gate is not None
    EW = E + has_gate
    weights = torch.empty(T, top_k, dtype=torch.float32, device=dev)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=dev)
    gate = torch.empty(T, dtype=torch.float32, device=dev) if has_gate else None
    sorted_ids = torch.empty(L, dtype=torch.int32, device=dev)
    block_expert = torch.empty(L // bm, dtype=torch.int32, device=dev)
    sg = shared_gate_up
    Is = sg.shape[0] // 2 if sg is not None else 0
    sact = torch.empty(T, Is, dtype=x.dtype, device=dev) if sg is not None else None
    if T == 0:
        return Routing(weights, ids, gate, sorted_ids, block_expert, sact)
    if sg is not None and sg.stride(-1) != 1:
        raise ValueError("route_align_triton: the shared gate_up weight's rows must be "
                         "contiguous.")
    do_align = N <= ALIGN_MAX_SLOTS
    part = torch.empty(cfg["KS"], T, EW, dtype=torch.float32, device=dev)
    neb = triton.cdiv(EW, cfg["BE"])
    tiles = _tiles(x.dtype, dev.type, "gate_up")
    xs = triton.cdiv(triton.cdiv(Is, tiles["BLOCK_N"]), neb) if sg is not None else 0
    grid = (triton.cdiv(T, cfg["BT"]), neb, cfg["KS"] + xs)
    # the blocks' counts per expert [NTB, E], then each token's rank per chosen expert [T, E]
    scratch = torch.empty((grid[0] + T) * E if do_align else 1, dtype=torch.int32, device=dev)
    _route_kernel[grid](
        x, w_router, bias if bias is not None else w_router,
        w_gate if has_gate else w_router, part, counts, weights, ids,
        gate if has_gate else weights, sorted_ids, block_expert, scratch, T, H, L,
        L // bm,
        x.stride(0), w_router.stride(0), sg if sg is not None else x,
        sact if sg is not None else x, Is, sg.stride(0) if sg is not None else 0,
        sact.stride(0) if sg is not None else 0, E=E, EW=EW, TOPK=top_k,
        TOPK_P2=triton.next_power_of_2(top_k), NORM=bool(norm), HAS_BIAS=bias is not None,
        HAS_GATE=has_gate, ALIGN=do_align, BM=bm, SG_BN=tiles["BLOCK_N"],
        SG_BK=tiles["BLOCK_K"], SG_PREC=tiles["DOT_PREC"], **cfg)
    if not do_align:
        sorted_ids, block_expert = align(ids, E, bm)
    return Routing(weights, ids, gate, sorted_ids, block_expert, sact)


def route_align(x: torch.Tensor, w_router: torch.Tensor, bias: Optional[torch.Tensor],
                w_gate: Optional[torch.Tensor], top_k: int, norm: bool, bm: int,
                counts: torch.Tensor, shared_gate_up: Optional[torch.Tensor] = None) -> Routing:
    """The routing of one MoE layer: the kernel in deterministic mode (any device) and on
    CUDA, the reference elsewhere or inside `references()` (fused_ops.dispatch)."""
    args = (x, w_router, bias, w_gate, top_k, norm, bm, counts, shared_gate_up)
    if batch_invariant.is_active():
        return route_align_triton(*args)
    return dispatch("route_align", route_align_triton, route_align_ref, *args)
