"""GPU time stamps into a ring buffer: one tiny kernel per stamp, usable eagerly and inside a
captured CUDA graph (the ring slot is claimed on the device when the kernel runs).

    ring  int64 [capacity, 2]     record = (code, ns)      capacity a power of two
    count int32 [1]               records ever claimed (wraps the ring: slot = count & (cap-1))

    stamp(ring, count, code):   t   = %globaltimer         (ns, the GPU's global timer)
                                s   = atomic_add(count, 1) & (capacity - 1)
                                ring[s] = (code, t)
Stamps on one stream claim slots in stream order (a stream runs its kernels one after the
other), so the records of one stream appear in the ring in the order they were issued.

`stamped_copy` is a stage whose one kernel stamps itself (the `d2h` stage: results into
pinned host buffers, one launch instead of a copy per tensor plus two stamp launches):
    [stamp begin] dst0[:] = src0 ; dst1[:] = src1 [stamp end]     one program, in order
its reference is the copies between two `stamp_ref` calls.

A kernel that does a stage's own work can carry the stage's stamps (`Carried`, handed out by
a captured graph's marks, graphs/runner.py): no stamp node of its own on the graph's chain.
    carried_begin   program 0 stamps the begin before its work (a grid's programs start together)
    carried_end     the last program out stamps the end: each program adds 1 to the call
                    site's `done` counter once its work is issued; the one reading nprog - 1
                    resets it to 0 and stamps (a one-program grid stamps at once)
`carry_args` gives such a kernel its stamp arguments; `stamp_around` runs a stage's torch
fallback between stamp launches instead (the same records, as nodes).

`stamp_ref` is the plain-torch reference of the same function: the caller gives the time
(host `perf_counter_ns` on CPU). Under TRITON_INTERPRET=1 the `%globaltimer` read (inline PTX)
cannot run, so the interpreter path takes its time from a tensor (`clock`): the slot and
buffer logic are the same code.
"""
from __future__ import annotations

import contextlib
import time
from typing import NamedTuple, Optional

import torch

from ..lazy_triton import tl, triton

RECORD_WORDS = 2             # (code, ns)


class Carried(NamedTuple):
    """Stamps one kernel issues itself: `codes` into `ring` (slots claimed through `count`);
    `done` is the last-program-out counter (int32 [1], zero between launches)."""
    ring: torch.Tensor
    count: torch.Tensor
    codes: tuple
    done: torch.Tensor


def stamp_ref(ring, count, code: int, now_ns: int) -> None:
    """Reference: claim the next slot and write (code, now_ns) there (torch tensors or numpy
    views of them)."""
    slot = int(count[0]) & (ring.shape[0] - 1)
    count[0] += 1
    ring[slot, 0] = code
    ring[slot, 1] = now_ns


@triton.jit
def _stamp_now(ring_ptr, count_ptr, clock_ptr, code, mask, GLOBALTIMER: tl.constexpr):
    if GLOBALTIMER:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                      is_pure=False, pack=1)
    else:
        t = tl.load(clock_ptr)
    # relaxed: the claim only needs a unique slot; the records are read after a
    # synchronize, so no ordering (no fence: the stamp is a node on the critical path)
    slot = tl.atomic_add(count_ptr, 1, sem="relaxed") & mask
    tl.store(ring_ptr + 2 * slot, code)        # cast to int64 by the store
    tl.store(ring_ptr + 2 * slot + 1, t)


@triton.jit
def carried_begin(Ring, Count, Clock, code, mask, ON: tl.constexpr,
                  GLOBALTIMER: tl.constexpr):
    """Program 0 stamps `code` (call before the program's work)."""
    if ON:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0):
            _stamp_now(Ring, Count, Clock, code, mask, GLOBALTIMER)


@triton.jit
def carried_end(Done, Ring, Count, Clock, code, mask, ON: tl.constexpr,
                GLOBALTIMER: tl.constexpr):
    """The last program out stamps `code` (call after the program's work)."""
    if ON:
        tl.debug_barrier()                      # every thread's work is issued
        n = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
        before = n - 1                          # one program: no counter to claim
        if n > 1:
            before = tl.atomic_add(Done, 1, sem="acq_rel")
        if before == n - 1:
            tl.store(Done, 0)
            _stamp_now(Ring, Count, Clock, code, mask, GLOBALTIMER)


# `code` is not specialized: one compiled variant serves every stamp site (no compile,
# hence no module load, can happen later inside a graph capture)
@triton.jit(do_not_specialize=["code"])
def _stamp_kernel(ring_ptr, count_ptr, clock_ptr, code, mask, GLOBALTIMER: tl.constexpr):
    _stamp_now(ring_ptr, count_ptr, clock_ptr, code, mask, GLOBALTIMER)


@triton.jit(do_not_specialize=["n0", "n1", "code_b", "code_e"])
def _stamped_copy_kernel(S0, D0, n0, S1, D1, n1, ring_ptr, count_ptr, clock_ptr, code_b,
                         code_e, mask, STAMP: tl.constexpr, GLOBALTIMER: tl.constexpr,
                         BLOCK: tl.constexpr):
    if STAMP:
        _stamp_now(ring_ptr, count_ptr, clock_ptr, code_b, mask, GLOBALTIMER)
    offs = tl.arange(0, BLOCK)
    for i in range(0, n0, BLOCK):
        m = i + offs < n0
        tl.store(D0 + i + offs, tl.load(S0 + i + offs, mask=m), mask=m)
    for i in range(0, n1, BLOCK):
        m = i + offs < n1
        tl.store(D1 + i + offs, tl.load(S1 + i + offs, mask=m), mask=m)
    if STAMP:
        _stamp_now(ring_ptr, count_ptr, clock_ptr, code_e, mask, GLOBALTIMER)


def stamp_triton(ring: torch.Tensor, count: torch.Tensor, code: int,
                 clock: torch.Tensor | None = None):
    """Launch one stamp on the current stream. `clock` (an int64 [1] tensor) replaces
    `%globaltimer` (the interpreter, tests); None reads the GPU's global timer. Returns
    Triton's compiled kernel (the JIT path's return value)."""
    return _stamp_kernel[(1,)](ring, count, ring if clock is None else clock, code,
                               ring.shape[0] - 1, GLOBALTIMER=clock is None, num_warps=1)


class StampLauncher:
    """`%globaltimer` stamps into one ring, launched through the compiled kernel's own
    launcher: no JIT argument binding or cache lookup per stamp (the eager hot path). The
    first launch goes through the JIT (compile + load); the direct launcher is then tried
    once and checked (two records with the right codes); where this Triton version's
    launcher takes other arguments, every stamp goes through the JIT path instead.
    Leaves the ring and its counter zeroed."""

    def __init__(self, ring: torch.Tensor, count: torch.Tensor):
        self.ring, self.count, self.mask = ring, count, ring.shape[0] - 1
        ck = stamp_triton(ring, count, 2)
        self.direct = None
        try:
            run = ck[(1, 1, 1)]
            run(ring, count, ring, 3, self.mask, True)
            torch.cuda.synchronize(ring.device)
            if int(count[0]) == 2 and ring[:2, 0].tolist() == [2, 3]:
                self.direct = run
        except Exception:          # another launcher signature: the JIT path stays correct
            torch.cuda.synchronize(ring.device)
        count.zero_()
        ring.zero_()
        torch.cuda.synchronize(ring.device)

    def __call__(self, code: int) -> None:
        if self.direct is not None:
            self.direct(self.ring, self.count, self.ring, code, self.mask, True)
        else:
            stamp_triton(self.ring, self.count, code)


def carry_args(begin: Optional[Carried], end: Optional[Carried], like: torch.Tensor,
               clock: torch.Tensor | None = None) -> dict:
    """A carrying kernel's stamp arguments (Ring, Count, Clock, Done, code_b, code_e,
    st_mask, STAMP_B, STAMP_E, GLOBALTIMER): `begin` / `end` each carry one code (None: not
    stamped; `like`, any tensor of the call, fills unused pointers). `clock` replaces
    %globaltimer (the interpreter, tests)."""
    for c in (begin, end):
        if c is not None and len(c.codes) != 1:
            raise ValueError(f"a carried begin or end stamp is one code, got {c.codes}.")
    s = begin if begin is not None else end
    if s is None:
        return dict(Ring=like, Count=like, Clock=like, Done=like, code_b=0, code_e=0,
                    st_mask=0, STAMP_B=False, STAMP_E=False, GLOBALTIMER=True)
    return dict(Ring=s.ring, Count=s.count, Clock=s.ring if clock is None else clock,
                Done=end.done if end is not None else s.count,
                code_b=begin.codes[0] if begin is not None else 0,
                code_e=end.codes[0] if end is not None else 0, st_mask=s.ring.shape[0] - 1,
                STAMP_B=begin is not None, STAMP_E=end is not None, GLOBALTIMER=clock is None)


CARRY_CODES = ["code_b", "code_e", "st_mask"]    # a carrying kernel's do_not_specialize


def stamp_around(begin: Optional[Carried], end: Optional[Carried], fn, *args):
    """fn(*args) between a begin and an end stamp launch: a carrying kernel's fallback (a
    stamp kernel each, inside a capture a node each; on CPU `stamp_ref` at host time)."""
    def one(c: Optional[Carried]) -> None:
        if c is None:
            return
        if c.ring.is_cuda:
            stamp_triton(c.ring, c.count, c.codes[0])
        else:
            stamp_ref(c.ring.numpy(), c.count.numpy(), c.codes[0], time.perf_counter_ns())
    one(begin)
    out = fn(*args)
    one(end)
    return out


def stamped_copy_ref(dsts: list, srcs: list, stamp=None, now_ns=None) -> None:
    """Reference: the copies, between two `stamp_ref` records when `stamp` = (ring, count,
    code_begin, code_end) (ring/count as numpy views; `now_ns()` gives the time)."""
    if stamp is not None:
        stamp_ref(stamp[0], stamp[1], stamp[2], now_ns())
    for d, s in zip(dsts, srcs):
        d.copy_(s)
    if stamp is not None:
        stamp_ref(stamp[0], stamp[1], stamp[3], now_ns())


def stamped_copy_triton(dsts: list, srcs: list, stamp=None,
                        clock: torch.Tensor | None = None) -> None:
    """One launch on the current stream: dst[i][:] = src[i] for one or two contiguous pairs
    of one dtype (dsts may be pinned host buffers: the kernel writes them through their
    device mapping), stamped at both ends when `stamp` = (ring, count, code_begin,
    code_end). `clock` replaces %globaltimer (the interpreter, tests)."""
    if not 1 <= len(srcs) == len(dsts) <= 2:
        raise ValueError(f"stamped_copy takes one or two (dst, src) pairs, got {len(srcs)}.")
    for d, s in zip(dsts, srcs):
        if d.numel() != s.numel() or d.dtype != s.dtype or not (d.is_contiguous()
                                                                and s.is_contiguous()):
            raise ValueError("stamped_copy pairs must be contiguous, of one size and dtype.")
    (s0, d0), (s1, d1) = (srcs[0], dsts[0]), ((srcs[1], dsts[1]) if len(srcs) > 1
                                              else (srcs[0], dsts[0]))
    n1 = srcs[1].numel() if len(srcs) > 1 else 0
    ring, count, cb, ce = stamp if stamp is not None else (s0, s0, 0, 0)
    return _stamped_copy_kernel[(1,)](s0, d0, s0.numel(), s1, d1, n1, ring, count,
                                      ring if clock is None else clock, cb, ce,
                                      ring.shape[0] - 1 if stamp is not None else 0,
                                      STAMP=stamp is not None, GLOBALTIMER=clock is None,
                                      BLOCK=256, num_warps=4)


class StampedCopy:
    """`stamped_copy_triton` on two int64 pairs through the compiled kernel's own launcher:
    no JIT argument binding per call (tens of µs of host time per launch on the JIT path).
    Built for one stamp ring size (the variant is specialised on it; None = unstamped), it
    compiles and checks the direct launch once on scratch buffers (a synchronize, at build
    time); a pair it was not built for (one pair, another dtype, a pointer that is not
    16-byte aligned) takes the JIT path, and so does every call where this Triton's
    launcher takes other arguments."""

    def __init__(self, device, ring_capacity: Optional[int]):
        dev = torch.device(device)
        self.cap = ring_capacity
        self.run = None
        src = torch.arange(48, dtype=torch.long, device=dev)
        dst = torch.zeros(48, dtype=torch.long, device=dev)
        ring = torch.zeros(ring_capacity or 4, 2, dtype=torch.long, device=dev)
        count = torch.zeros(1, dtype=torch.int32, device=dev)
        st = (ring, count, 5, 7) if ring_capacity else None
        ck = stamped_copy_triton([dst[:8], dst[16:24]], [src[:8], src[16:24]], st)
        try:
            run = ck[(1, 1, 1)]
            args = self._args([dst[32:40], dst[40:48]], [src[32:40], src[40:48]], st)
            run(*args)
            torch.cuda.synchronize(dev)
            ok = torch.equal(dst[32:48], src[32:48]) and (
                st is None or (int(count[0]) == 4 and ring[2:4, 0].tolist() == [5, 7]))
            self.run = run if ok else None
        except Exception:          # another launcher signature: the JIT path stays correct
            torch.cuda.synchronize(dev)

    @staticmethod
    def _args(dsts, srcs, stamp) -> tuple:
        (s0, s1), (d0, d1) = srcs, dsts
        ring, count, cb, ce = stamp if stamp is not None else (s0, s0, 0, 0)
        return (s0, d0, s0.numel(), s1, d1, s1.numel(), ring, count, ring, cb, ce,
                ring.shape[0] - 1 if stamp is not None else 0, stamp is not None, True, 256)

    def direct(self, dsts: list, srcs: list, stamp=None) -> bool:
        """The pairs (and stamp) take the direct launch this was built for."""
        return (self.run is not None and len(srcs) == 2 and (stamp is not None) == bool(self.cap)
                and (stamp is None or stamp[0].shape[0] == self.cap)
                and all(t.dtype == torch.long and t.data_ptr() % 16 == 0 and t.is_contiguous()
                        for t in (*dsts, *srcs)))

    def __call__(self, dsts: list, srcs: list, stamp=None, stream=None) -> None:
        """One launch on `stream` (a torch Stream; None: the current one)."""
        if self.direct(dsts, srcs, stamp):
            self.run(*self._args(dsts, srcs, stamp),
                     stream=None if stream is None else stream.cuda_stream)
            return
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            stamped_copy_triton(dsts, srcs, stamp)
