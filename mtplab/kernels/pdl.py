"""Programmatic dependent launch (PDL, CUDA sm_90 and later): a kernel launched with it may be
scheduled while the kernel before it on the stream (or in the captured graph) still runs, so
its launch and its first weight loads overlap that kernel's tail.

    kernel A  (a trigger)   gdc_launch_dependents() at entry: A's successor may launch now
    kernel B  (launch_pdl)  loads of weights (nothing a kernel of the step writes)
                            gdc_wait()      <- waits until A has completed, its writes visible
                            every read of an activation, every store

    who                     waits                          triggers
    skinny GEMM (gemv)      after its first weight tile    at entry when split over K
    its split-K reduce      at entry                       -
    add_rmsnorm, silu_mul,  -                              at entry
    split_reduce
    MoE routing             after its first router tile    at entry
    MoE gate_up (grouped)   at entry                       after its wait
    MoE down (grouped)      after the routing's block map  -
                            and its first weight tile

Invariants: a kernel launched with `launch_pdl` reads no activation and stores nothing before
its gdc_wait, in every program; so when it completes, so has everything before it (by
induction over the stream), and a kernel launched without PDL after it sees the usual order.
The one activation read before a wait: the grouped down GEMM reads the routing (two kernels
back), which has completed because gate_up triggers only after its own wait.
A trigger whose successor is launched without PDL does nothing; a PDL launch after a kernel
that never triggers starts when that kernel completes. The kernels take `PDL` as a constexpr
(False: no GDC instruction, the interpreter's case) and their launchers pass `enabled(t)`.
`off()` builds engines, or captures graphs, without it (the side-by-side figure's other arm).
"""
from __future__ import annotations

import contextlib

import torch

_off = 0                              # > 0 inside `off()`
_capable: dict[int, bool] = {}        # CUDA device index -> sm_90 or later


def enabled(t: torch.Tensor) -> bool:
    """PDL for kernels on `t`'s device: a CUDA device of compute capability 9.0 or later,
    outside `off()`."""
    if _off or not t.is_cuda:
        return False
    i = t.device.index if t.device.index is not None else torch.cuda.current_device()
    if i not in _capable:
        _capable[i] = torch.cuda.get_device_capability(i) >= (9, 0)
    return _capable[i]


@contextlib.contextmanager
def off():
    """While inside, every launch is an ordinary one (graphs captured inside keep that)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1
