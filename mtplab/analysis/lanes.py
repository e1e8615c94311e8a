"""Lane names by role for the figures of a Kineto trace (never the raw ids alone).

GPU streams:
    mtplab's own streams keep mtplab's names, read from the stage spans Kineto mirrors on
    them: `forward` (device stages), `schedule` (`schedule` / `prepare`: the inputs' H2D
    copies), `copy` (`d2h` only) -- the lanes of the event timeline and the demo.
    Any other stream is named from its work: `nccl` (NCCL kernels), `compute` (GEMM kernels;
    when no stream runs one, the stream with the most kernel time), `copy` (memcpy / memset
    only), else `side` (kernels, no GEMM).
Host threads: `host` (the thread holding the step spans, else the one issuing the most launch
calls), `autograd (thread <tid>)` (PyTorch's backward thread), any other thread that launches
work `host thread <tid>`.
A label carries the stream id (`compute (stream 7)`), so that it can be matched with the
stream table of `mtplab analyze`.
"""
from __future__ import annotations

import re

import numpy as np

from ..stages import HOST_PREP_STAGES, STAGES
from .trace_io import GPU_ACTIVITY_CATS, RUNTIME_CATS, Trace

# cuBLAS / cuBLASLt (Hopper `nvjet`), CUTLASS and Triton matmul kernel names
GEMM = re.compile(r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|matmul|_mm_|triton_mm", re.I)
NCCL = re.compile(r"nccl", re.I)
_MTPLAB_SCHEDULE = frozenset({"schedule", "prepare"})
_STAGE_SET = frozenset(STAGES)
_DEVICE_STAGES = _STAGE_SET - frozenset(HOST_PREP_STAGES) - {"sync", "d2h"}


def stream_roles(tr: Trace, device: int | None) -> dict[int, str]:
    """Role of every stream of `device` that carries GPU activity (module doc)."""
    on = tr.device == device if device is not None else np.ones(len(tr), bool)
    act = tr.cat_mask(*GPU_ACTIVITY_CATS) & on
    kern = tr.cat_mask("kernel") & on
    gua = tr.cat_mask("gpu_user_annotation") & on
    names = np.asarray(tr.names, dtype=object)
    roles: dict[int, str] = {}
    kernel_time: dict[int, float] = {}
    for s in sorted(np.unique(tr.stream[act]).tolist()):
        mine = tr.stream == s
        stages = set(names[np.unique(tr.name[gua & mine])].tolist()) & _STAGE_SET
        kn = names[np.unique(tr.name[kern & mine])].tolist()
        kernel_time[s] = float(tr.dur[kern & mine].sum())
        if stages & _DEVICE_STAGES:
            roles[s] = "forward"
        elif stages & _MTPLAB_SCHEDULE:
            roles[s] = "schedule"
        elif stages == {"d2h"} or not kn:
            roles[s] = "copy"
        elif any(NCCL.search(k) for k in kn):
            roles[s] = "nccl"
        elif any(GEMM.search(k) for k in kn):
            roles[s] = "compute"
        else:
            roles[s] = "side"
    if "compute" not in roles.values() and "forward" not in roles.values():
        side = [s for s, r in roles.items() if r == "side"]
        if side:
            roles[max(side, key=kernel_time.__getitem__)] = "compute"
    return roles


def stream_labels(tr: Trace, device: int | None) -> dict[int, str]:
    """'compute (stream 7)' per stream of `device` with GPU activity."""
    return {s: f"{r} (stream {s})" for s, r in stream_roles(tr, device).items()}


def host_labels(tr: Trace, threads: list[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """Labels of host threads ((pid, tid) pairs), the main one first: `host` for the thread
    holding the step spans (`step[...]`, ProfilerStep#N), else the one issuing the most launch
    calls; `autograd (thread <tid>)` for PyTorch's backward thread (its ops run under
    `autograd::engine::evaluate_function`), `host thread <tid>` for any other."""
    if not threads:
        return {}
    rt = tr.cat_mask(*RUNTIME_CATS)
    steps = tr.cat_mask("user_annotation") & tr.name_mask(
        lambda n: n.startswith("step[") or n.startswith("ProfilerStep#"))
    backward = tr.cat_mask("cpu_op") & tr.name_mask(
        lambda n: n.startswith("autograd::engine::evaluate_function"))

    def on(mask, pt):
        return int((mask & (tr.pid == pt[0]) & (tr.tid == pt[1])).sum())
    main = max(threads, key=lambda pt: (on(steps, pt) > 0, on(rt, pt), -threads.index(pt)))
    return {main: "host", **{pt: f"autograd (thread {pt[1]})" if on(backward, pt) else
                             f"host thread {pt[1]}" for pt in threads if pt != main}}
