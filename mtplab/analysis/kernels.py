"""Kernel counts of a Kineto trace: GPU activities per step window and per decoder layer.

    per_window(tr, w0, w1)                       activities starting in each [w0, w1)
    layer_block(name_codes, layers)              (block length, repetitions) or (0, 0)
    per_layer(tr, w0, w1, layers)                one block length per target forward, NaN
                                                 where none is found

GPU activities are kernels, memcpys and memsets (`GPU_ACTIVITY_CATS`); a CUDA graph replay
lists each of its kernels, so the counts are the same with and without graphs.

Kernels per decoder layer. A decoder runs the same kernels for each of its L layers, so the
kernels of one target forward, in launch order on its stream, read

    prologue (embedding, ...)   block x L   epilogue (final norm, LM head, sampling)

and the block's length is the number of GPU activities per decoder layer. `layer_block` finds
it from the kernel names alone: among the blocks that repeat back to back between
max(2, L - 1) and L times (the first layer may differ in a kernel, e.g. a norm with no residual
yet to add), the one covering the most activities, the shortest on a tie. Nothing per layer
needs to be annotated (inside a CUDA graph a `record_function` would not be seen), and no
second run at another depth is needed. The result is NaN (not found) where the layers do not
launch one identical sequence (e.g. layer types that launch different kernels) or L < 2.
`per_layer` reads one forward per `verify` span (the stage of the target forward; a
target-only decode's forward is `verify` of a one-node tree): the activities on the span's
lane (its pid and tid: device and stream for GPU lanes) that start inside it.
"""
from __future__ import annotations

import numpy as np

from .trace_io import GPU_ACTIVITY_CATS, Trace

NAN = float("nan")


def per_window(tr: Trace, w0: np.ndarray, w1: np.ndarray,
               cats: tuple = GPU_ACTIVITY_CATS) -> np.ndarray:
    """Number of activities (`cats`) that start in each window [w0[i], w1[i])."""
    t = np.sort(tr.ts[tr.cat_mask(*cats)])
    return np.searchsorted(t, np.asarray(w1)) - np.searchsorted(t, np.asarray(w0))


def _longest_run(b: np.ndarray) -> int:
    """Length of the longest run of True in a boolean array."""
    if not b.any():
        return 0
    d = np.diff(np.concatenate(([0], b.astype(np.int8), [0])))
    return int((np.flatnonzero(d == -1) - np.flatnonzero(d == 1)).max())


def layer_block(seq, layers: int) -> tuple[int, int]:
    """(k, reps) of the block of `seq` (name codes in launch order) that repeats back to back
    reps times, max(2, layers - 1) <= reps <= layers, covering the most items (k * reps; the
    smallest k on a tie); (0, 0) when there is none (module doc)."""
    s = np.asarray(seq)
    lo = max(2, int(layers) - 1)
    if layers < 2 or s.size < lo:
        return 0, 0
    best = (0, 0, 0)                          # (coverage, k, reps)
    for k in range(1, s.size // lo + 1):
        reps = _longest_run(s[k:] == s[:-k]) // k + 1
        if lo <= reps <= layers and reps * k > best[0]:
            best = (reps * k, k, reps)
    return best[1], best[2]


def per_layer(tr: Trace, w0: np.ndarray, w1: np.ndarray, layers: int, *,
              stage: str = "verify", cats: tuple = GPU_ACTIVITY_CATS,
              annotation: str = "gpu_user_annotation") -> np.ndarray:
    """Activities per decoder layer of each `stage` span (`annotation` category) that starts
    in one of the windows [w0, w1): the `layer_block` length of the activities (`cats`) on the
    span's lane (pid, tid) that start inside it; NaN where no block is found. The defaults
    read the GPU lanes; cats=("cpu_op",), annotation="user_annotation" read the host's ops."""
    spans = np.flatnonzero(tr.cat_mask(annotation) & tr.name_mask(lambda n: n == stage))
    w0, w1 = np.asarray(w0, float), np.asarray(w1, float)
    inside = ((tr.ts[spans][:, None] >= w0[None, :]) & (tr.ts[spans][:, None] < w1[None, :]))
    spans = spans[inside.any(axis=1)]
    act = np.flatnonzero(tr.cat_mask(*cats))
    act = act[np.argsort(tr.ts[act], kind="stable")]
    out = np.full(spans.size, NAN)
    for j, i in enumerate(spans):
        t0, t1 = tr.ts[i], tr.ts[i] + tr.dur[i]
        a = act[np.searchsorted(tr.ts[act], t0):np.searchsorted(tr.ts[act], t1, side="right")]
        a = a[(tr.pid[a] == tr.pid[i]) & (tr.tid[a] == tr.tid[i])]
        k, _ = layer_block(tr.name[a], layers)
        if k:
            out[j] = k
    return out
