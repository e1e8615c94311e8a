"""The future map's row moves (sched/future_map.py) as one self-stamping kernel per segment
tail: the `resolve` gathers, or `publish` + `stash` scatters, of a captured graph in one
launch that also carries the bubble meter's stamps of those stages (no stamp node of its own).

    gather   (resolve)         dst_k[i, :] = src_k[rows[i], :] + add_k   pad_k where rows[i] == 0
    scatter  (publish, stash)  dst_k[rows[i], :] = src_k[i, :]
    a move k: one field of W_k columns (a 1-D field is W = 1); the store casts to dst's dtype

    grid (lanes, column blocks of the widest field): program (i, c) moves columns
    [c*BLOCK, (c+1)*BLOCK) of lane i of every move, in move order.
    stamps (codes c0, [c1,] c_end; `split` = the first move of the second stage):
        program (0, 0)        c0 before its first move (`carried_begin`); c1 before its
                              move `split`
        the last program out  c_end after every program's moves (kernels/stamp.py
                              `carried_end`: a done counter, reset by the last program)
    c0 and c_end bound the kernel exactly; c1 is where program (0, 0) crossed from the first
    stage's moves to the second's (other programs may already be moving the second stage's
    columns: the two stages' split inside one kernel is good to a move's duration).
Row 0 of the future map mirrors graph padding lanes: a gather reads `pad` there, a scatter
from a padding lane writes row 0 (never read as data).

`move_rows_ref` is the plain-torch reference (stamps by `stamp_ref` with the caller's time).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lazy_triton import tl, triton
from .stamp import _stamp_now, carried_begin, carried_end, stamp_ref

MAX_MOVES = 8
BLOCK = 256


@dataclass(frozen=True)
class RowMove:
    """One field moved by row: gather dst[i] = src[rows[i]] (+ add, pad on padding lanes),
    scatter dst[rows[i]] = src[i]. Rows are dim 0; a 2-D field is contiguous along dim 1."""
    dst: torch.Tensor
    src: torch.Tensor
    pad: int = 0
    add: int = 0


def move_rows_ref(rows: torch.Tensor, moves: list[RowMove], gather: bool, split: int = 0,
                  stamp=None, now_ns=None) -> None:
    """Reference: the moves in order, stamped like the kernel when `stamp` = (ring, count,
    codes) (ring/count as numpy views or tensors; `now_ns()` gives the time)."""
    _check(rows, moves, gather, split, stamp)
    codes = stamp[2] if stamp is not None else ()
    for k, m in enumerate(moves):
        if stamp is not None and (k == 0 or (k == split and len(codes) == 3)):
            stamp_ref(stamp[0], stamp[1], codes[0 if k == 0 else 1], now_ns())
        if gather:
            real = (rows > 0).view(-1, *([1] * (m.src.dim() - 1)))
            m.dst.copy_(torch.where(real, m.src[rows] + m.add, m.pad))
        else:
            m.dst[rows] = m.src.to(m.dst.dtype)
    if stamp is not None:
        stamp_ref(stamp[0], stamp[1], codes[-1], now_ns())


def _check(rows, moves, gather, split, stamp) -> None:
    if not 1 <= len(moves) <= MAX_MOVES:
        raise ValueError(f"move_rows takes 1 to {MAX_MOVES} moves, got {len(moves)}.")
    n = rows.shape[0]
    for m in moves:
        lanes = m.dst if gather else m.src
        if lanes.shape[0] != n or m.src.shape[1:] != m.dst.shape[1:] or m.src.dim() > 2:
            raise ValueError(f"a row move needs [n] or [n, W] lanes for {n} rows and matching "
                             f"widths; got dst {tuple(m.dst.shape)}, src {tuple(m.src.shape)}.")
        if m.src.dim() == 2 and (m.src.stride(1) != 1 or m.dst.stride(1) != 1):
            raise ValueError("row moves need rows contiguous along dim 1.")
    if stamp is not None:
        codes = stamp[2]
        if len(codes) not in (2, 3) or (len(codes) == 3) != (0 < split < len(moves)):
            raise ValueError(f"stamp codes {codes} need a split move (0 < split < "
                             f"{len(moves)}) exactly when there are three.")


def _width(t: torch.Tensor) -> int:
    return t.shape[1] if t.dim() == 2 else 1


@triton.jit
def _slot(K: tl.constexpr, N: tl.constexpr, SPLIT: tl.constexpr, STAMP: tl.constexpr,
          first, r, i, c, D, S, W: tl.constexpr, SS: tl.constexpr, DS: tl.constexpr,
          PAD: tl.constexpr, ADD: tl.constexpr, GATHER: tl.constexpr, BLOCK: tl.constexpr,
          ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER: tl.constexpr):
    """Move K (when K < N), after the split stamp when K is the split move."""
    if K < N:
        if STAMP:
            if K == SPLIT:
                if first:
                    _stamp_now(ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
        offs = c * BLOCK + tl.arange(0, BLOCK)
        m = offs < W
        if GATHER:
            v = tl.load(S + r * SS + offs, mask=m & ((offs * 0 + r) > 0), other=0)
            if ADD != 0:
                v = v + ADD
            tl.store(D + i * DS + offs, tl.where(r > 0, v, PAD).to(D.dtype.element_ty),
                     mask=m)
        else:
            v = tl.load(S + i * SS + offs, mask=m)
            tl.store(D + r * DS + offs, v.to(D.dtype.element_ty), mask=m)

# move k: pointers D<k>, S<k>; constants (fixed per call site) width W<k>, row strides
# SS<k>/DS<k>, pad P<k>, add A<k>; moves k >= N are not compiled in
@triton.jit(do_not_specialize=["c0", "c1", "c_end", "mask"])
def _move_rows_kernel(Rows, done_ptr, ring_ptr, count_ptr, clock_ptr, c0, c1, c_end, mask,
                      D0, S0, W0: tl.constexpr, SS0: tl.constexpr, DS0: tl.constexpr,
                      P0: tl.constexpr, A0: tl.constexpr,
                      D1, S1, W1: tl.constexpr, SS1: tl.constexpr, DS1: tl.constexpr,
                      P1: tl.constexpr, A1: tl.constexpr,
                      D2, S2, W2: tl.constexpr, SS2: tl.constexpr, DS2: tl.constexpr,
                      P2: tl.constexpr, A2: tl.constexpr,
                      D3, S3, W3: tl.constexpr, SS3: tl.constexpr, DS3: tl.constexpr,
                      P3: tl.constexpr, A3: tl.constexpr,
                      D4, S4, W4: tl.constexpr, SS4: tl.constexpr, DS4: tl.constexpr,
                      P4: tl.constexpr, A4: tl.constexpr,
                      D5, S5, W5: tl.constexpr, SS5: tl.constexpr, DS5: tl.constexpr,
                      P5: tl.constexpr, A5: tl.constexpr,
                      D6, S6, W6: tl.constexpr, SS6: tl.constexpr, DS6: tl.constexpr,
                      P6: tl.constexpr, A6: tl.constexpr,
                      D7, S7, W7: tl.constexpr, SS7: tl.constexpr, DS7: tl.constexpr,
                      P7: tl.constexpr, A7: tl.constexpr,
                      N: tl.constexpr, SPLIT: tl.constexpr, GATHER: tl.constexpr,
                      STAMP: tl.constexpr, GLOBALTIMER: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    c = tl.program_id(1)
    first = (i == 0) & (c == 0)
    r = tl.load(Rows + i)
    carried_begin(ring_ptr, count_ptr, clock_ptr, c0, mask, STAMP, GLOBALTIMER)
    _slot(0, N, SPLIT, STAMP, first, r, i, c, D0, S0, W0, SS0, DS0, P0, A0,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(1, N, SPLIT, STAMP, first, r, i, c, D1, S1, W1, SS1, DS1, P1, A1,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(2, N, SPLIT, STAMP, first, r, i, c, D2, S2, W2, SS2, DS2, P2, A2,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(3, N, SPLIT, STAMP, first, r, i, c, D3, S3, W3, SS3, DS3, P3, A3,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(4, N, SPLIT, STAMP, first, r, i, c, D4, S4, W4, SS4, DS4, P4, A4,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(5, N, SPLIT, STAMP, first, r, i, c, D5, S5, W5, SS5, DS5, P5, A5,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(6, N, SPLIT, STAMP, first, r, i, c, D6, S6, W6, SS6, DS6, P6, A6,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    _slot(7, N, SPLIT, STAMP, first, r, i, c, D7, S7, W7, SS7, DS7, P7, A7,
          GATHER, BLOCK, ring_ptr, count_ptr, clock_ptr, c1, mask, GLOBALTIMER)
    carried_end(done_ptr, ring_ptr, count_ptr, clock_ptr, c_end, mask, STAMP, GLOBALTIMER)


def move_rows_triton(rows: torch.Tensor, moves: list[RowMove], gather: bool, split: int = 0,
                     stamp=None, clock: torch.Tensor | None = None) -> None:
    """One launch on the current stream (graph-capturable): the moves, stamped when `stamp`
    = (ring, count, codes, done) (codes: two or three, three with a `split` move; done: an
    int32 [1] zero counter of this call site). `clock` replaces %globaltimer (the
    interpreter, tests)."""
    _check(rows, moves, gather, split, stamp)
    kw = {}
    for k in range(MAX_MOVES):
        if k < len(moves):
            m = moves[k]
            kw.update({f"D{k}": m.dst, f"S{k}": m.src, f"W{k}": _width(m.src),
                       f"SS{k}": m.src.stride(0), f"DS{k}": m.dst.stride(0),
                       f"P{k}": m.pad, f"A{k}": m.add})
        else:                                        # an unused slot: not compiled in
            kw.update({f"D{k}": rows, f"S{k}": rows, f"W{k}": 0, f"SS{k}": 0, f"DS{k}": 0,
                       f"P{k}": 0, f"A{k}": 0})
    ring, count, codes, done = stamp if stamp is not None else (rows, rows, (0, 0), rows)
    wmax = max(_width(m.src) for m in moves)
    _move_rows_kernel[(rows.shape[0], triton.cdiv(wmax, BLOCK))](
        rows, done, ring, count, ring if clock is None else clock, codes[0],
        codes[1] if len(codes) == 3 else 0, codes[-1],
        ring.shape[0] - 1 if stamp is not None else 0, **kw, N=len(moves),
        SPLIT=split if stamp is not None and len(codes) == 3 else -1, GATHER=gather,
        STAMP=stamp is not None, GLOBALTIMER=clock is None, BLOCK=BLOCK, num_warps=4)
