"""Per-cell figures derived from the event timeline and the Kineto trace of the measured run.

From the event timeline, over the decode steps (`step[decode bs=B]` spans) of the timeline
generate (the measured workload once more, with spans on; see measure.py):
    stage_<stage>_ms         median over decode steps of the summed time of that stage's spans
                             in the step (0 where a step has none; GPU clock for device lanes
                             on CUDA, else host clock)
    stage_sum_gpu_ms         median over decode steps of the summed GPU intervals of every
                             stage span on a device lane (NaN without a GPU clock): an upper
                             estimate of the bubble-free step time, since an event pair also
                             spans the dispatch latency before its stage's first kernel
    sync_spans_per_step      mean number of host `sync` spans (blocking waits) per decode step
`stage_shares` splits a decode step's time among its stages and `OTHER_STAGE` (shares that
add up to 1; notebook 00's table).

From the bubble meter (measure.py; instrument/meter.py), over the measured generate's
decode steps, unprofiled: the headline
    bubble_frac, bubble_us_per_step    device time not covered by any stage / step wall time

From the trace (only when the cell profiles; NaN otherwise), over the decode steps of the
profiler window after warm-up (the profiler inflates host time: where/why views):
    bubble_frac_profiled, bubble_<cause>_frac   device bubble time / device step wall time, in
                                       total and per cause (each of analysis/causes.py);
                                       NaN without GPU activity (a CPU run)
    bubble_steps                       decode steps the bubble figures cover
    device_busy_step_ms                median over those steps of the device busy time (union
                                       of kernels and copies): the step time with zero
                                       bubbles (kernel durations are not inflated by the
                                       profiler); NaN on CPU
    step_profiled_ms                   median wall time of those steps under the profiler
    launches_per_step                  CUDA launch calls (`*Launch*` runtime/driver events)
                                       inside a decode step span (NaN on CPU)
    draft_launches_per_step            launch calls inside `draft.seed` / `draft` spans
    kernels_per_step                   GPU activities (kernels, copies, memsets) that start
                                       inside a decode step's device window, median over the
                                       steps (NaN on CPU)
    kernels_per_layer                  GPU activities per decoder layer of the target forward:
                                       in each `verify` span (the target forward) of those
                                       steps, the length of the block of kernel names that
                                       repeats back to back once per layer (L - 1 or L times,
                                       L = the target's layers; analysis/kernels.py), median
                                       over the forwards where such a block is found; NaN on
                                       CPU, and where the layers do not launch one identical
                                       kernel sequence
    draft_ops_per_step                 aten ops dispatched inside `draft.seed` / `draft` spans
                                       (nested ops counted; the CPU stand-in for launches)
    host_syncs_per_step                synchronize calls and `aten::item` /
                                       `aten::_local_scalar_dense` inside decode step spans
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..analysis.bubbles import SYNC_CALLS, SYNC_OPS, analyze, union_intervals
from ..analysis.causes import CAUSES
from ..analysis.kernels import per_layer, per_window
from ..stages import STAGES
from ..analysis.trace_io import GPU_ACTIVITY_CATS, RUNTIME_CATS, load_trace

NAN = float("nan")
DRAFT_SPANS = ("draft.seed", "draft")


def stage_metrics(tl: pd.DataFrame, first_step: int, end_step: int | None = None) -> dict:
    """Per-stage time and sync spans per decode step, over the steps [first_step, end_step)."""
    tl = tl[(tl["step"] >= first_step) & (tl["step"] < (end_step if end_step is not None
                                                          else float("inf")))]
    dec_steps = tl.loc[tl["stage"].str.startswith("step[decode"), "step"].unique()
    if len(dec_steps) == 0:
        return {"sync_spans_per_step": NAN}
    tl = tl[tl["step"].isin(dec_steps) & tl["stage"].isin(STAGES)]
    gpu = tl["gpu_start_us"].notna()
    ms = np.where(gpu, tl["gpu_end_us"] - tl["gpu_start_us"],
                  tl["host_end_us"] - tl["host_start_us"]) / 1e3
    d = pd.DataFrame({"step": tl["step"], "stage": tl["stage"], "ms": ms})
    per = d.pivot_table(index="step", columns="stage", values="ms", aggfunc="sum", fill_value=0.0)
    per = per.reindex(dec_steps, fill_value=0.0)
    out = {f"stage_{s}_ms": float(per[s].median()) for s in STAGES if s in per.columns}
    dev = gpu & (tl["stream"] != "host")
    out["stage_sum_gpu_ms"] = (float(d[dev.to_numpy()].groupby("step")["ms"].sum()
                                     .reindex(dec_steps, fill_value=0.0).median())
                               if dev.any() else NAN)
    out["sync_spans_per_step"] = float((d["stage"] == "sync").sum() / len(dec_steps))
    return out


OTHER_STAGE = "other / between stages"


def stage_shares(tl: pd.DataFrame, first_step: int, end_step: int | None = None) -> pd.DataFrame:
    """Where a decode step's time goes, over the decode steps [first_step, end_step) of an
    event timeline: one row per stage plus `OTHER_STAGE`, columns `ms_per_decode_step` (mean
    over the steps) and `share_of_step`; the shares add up to 1 and the ms to the mean step.

    One clock: with GPU times, the device lanes on the GPU clock (a step runs from its first
    device stage's start to its last one's end; host stages run beside it and are not in the
    table), else every lane on the host clock (a CPU run: one thread runs everything in
    series; a step is its `step[decode ...]` span). Each instant of a step goes to the
    outermost stage span covering it (a span inside another of its lane, e.g. `draft.step`
    inside `draft`, is part of that one), split evenly where spans of several lanes overlap,
    and to `OTHER_STAGE` where none does (scheduling, Python between stages, waits).
    Empty when the range holds no decode step."""
    tl = tl[(tl["step"] >= first_step) & (tl["step"] < (end_step if end_step is not None
                                                          else float("inf")))]
    is_step = tl["stage"].str.startswith("step[decode")
    steps = tl.loc[is_step, "step"].unique()
    cols = ["ms_per_decode_step", "share_of_step"]
    if len(steps) == 0:
        return pd.DataFrame(columns=cols)
    gpu = bool(tl["gpu_start_us"].notna().any())
    clock = "gpu" if gpu else "host"
    st = tl[tl["step"].isin(steps) & tl["stage"].isin(STAGES)]
    if gpu:
        st = st[(st["stream"] != "host") & st["gpu_start_us"].notna()]
        by = st.groupby("step")
        dom = pd.DataFrame({"s": by["gpu_start_us"].min(), "e": by["gpu_end_us"].max()})
    else:
        sp = tl[is_step]
        dom = pd.DataFrame({"s": sp["host_start_us"].to_numpy(), "e": sp["host_end_us"].to_numpy()})
    s0 = st[f"{clock}_start_us"].to_numpy(float)
    s1 = st[f"{clock}_end_us"].to_numpy(float)
    names = st["stage"].to_numpy(object)
    lane = st["stream"].to_numpy(object)
    # outermost spans only: drop a span inside another span of its lane
    inner = np.zeros(len(st), bool)
    for ln in np.unique(lane):
        idx = np.flatnonzero(lane == ln)
        idx = idx[np.lexsort((-s1[idx], s0[idx]))]
        reach = np.maximum.accumulate(s1[idx])
        inner[idx[1:]] = s1[idx[1:]] <= reach[:-1]
    s0, s1, names = s0[~inner], s1[~inner], names[~inner]
    ds, de = union_intervals(dom["s"].to_numpy(float), dom["e"].to_numpy(float))
    cuts = np.unique(np.concatenate((s0, s1, ds, de)))
    a, b = cuts[:-1], cuts[1:]
    mid = 0.5 * (a + b)
    k = np.searchsorted(ds, mid, side="right") - 1
    in_dom = (k >= 0) & (mid < de[np.clip(k, 0, None)])
    cover = (s0[None, :] <= a[:, None]) & (s1[None, :] >= b[:, None]) & in_dom[:, None]
    n_cover = cover.sum(axis=1)
    seg = np.where(in_dom, b - a, 0.0)
    weight = np.divide(seg, n_cover, out=np.zeros_like(seg), where=n_cover > 0)
    per_span = weight @ cover
    total = float(seg.sum())
    ms = pd.Series(per_span, index=names).groupby(level=0).sum()
    ms = ms[ms > 0].sort_values(ascending=False)
    ms[OTHER_STAGE] = float(seg[n_cover == 0].sum())
    ms = ms / 1e3 / len(steps)
    return pd.DataFrame({"ms_per_decode_step": ms,
                         "share_of_step": ms / (total / 1e3 / len(steps)) if total > 0 else NAN},
                        columns=cols)


def meter_name(devices) -> str:
    """The bubble meter's `bubble_frac` as a header, axis or sentence names it, for cells run
    on `devices` (the `cfg.device` column): `meter` on a GPU; on CPU the meter stamps the host
    clock (there is no device to stamp, so it is not a device bubble): `meter, host clock`,
    or `meter; host clock on CPU cells` when both kinds are present."""
    cpu = {str(d).startswith("cpu") for d in devices if isinstance(d, str)}
    return ("meter, host clock" if cpu == {True} else
            "meter; host clock on CPU cells" if cpu == {True, False} else "meter")


def bubble_columns(steps: pd.DataFrame, has_device: bool) -> dict:
    """The bubble figures of the profiled decode steps `steps` (rows of `analyze(...).steps`):
    every `bubble_*` column of the results table is computed here and only here."""
    out = {"bubble_frac_profiled": NAN, **{f"bubble_{c}_frac": NAN for c in CAUSES},
           "bubble_steps": len(steps), "device_busy_step_ms": NAN,
           "step_profiled_ms": float(steps["dur_us"].median()) / 1e3 if len(steps) else NAN}
    wall = float(steps["dur_us"].sum()) if len(steps) else 0.0
    if has_device and wall > 0:
        out["bubble_frac_profiled"] = float(steps["bubble_us"].sum()) / wall
        for c in CAUSES:
            out[f"bubble_{c}_frac"] = float(steps[f"bubble_{c}_us"].sum()) / wall
        out["device_busy_step_ms"] = float(steps["busy_us"].median()) / 1e3
    return out


def trace_metrics(trace_path: str, skip_steps: int, layers: int | None = None) -> dict:
    """Bubble fractions and launch/sync/kernel counts of the decode steps after `skip_steps`;
    `layers`: the target's decoder layers (kernels_per_layer; NaN without)."""
    out = {**bubble_columns(pd.DataFrame(), False),
           "launches_per_step": NAN, "draft_launches_per_step": NAN, "kernels_per_step": NAN,
           "kernels_per_layer": NAN, "draft_ops_per_step": NAN, "host_syncs_per_step": NAN}
    tr = load_trace(trace_path)
    try:
        res = analyze(tr, skip_steps=skip_steps)
    except ValueError:          # the profiler window ended inside the warm-up
        return out
    st = res.steps[res.steps["name"].str.startswith("step[decode")]
    out.update(bubble_columns(st, res.summary.get("device") is not None))
    if st.empty:
        return out
    n = len(st)
    s0 = st["host_start_us"].to_numpy()
    s1 = s0 + st["host_dur_us"].to_numpy()
    ua = tr.cat_mask("user_annotation")
    draft = ua & tr.name_mask(lambda nm: nm in DRAFT_SPANS)
    inside = _in_windows(tr.ts[draft], s0, s1)
    d0, d1 = tr.ts[draft][inside], tr.end[draft][inside]
    launch = tr.cat_mask(*RUNTIME_CATS) & tr.name_mask(lambda nm: "Launch" in nm)
    syncs = tr.name_mask(lambda nm: nm in SYNC_CALLS or nm in SYNC_OPS)
    ops = tr.cat_mask("cpu_op")
    if launch.any():
        out["launches_per_step"] = _count_in(tr.ts[launch], s0, s1) / n
        out["draft_launches_per_step"] = _count_in(tr.ts[launch], d0, d1) / n
    out["draft_ops_per_step"] = _count_in(tr.ts[ops], d0, d1) / n
    if tr.cat_mask(*GPU_ACTIVITY_CATS).any():
        w0 = st["start_us"].to_numpy()
        w1 = w0 + st["dur_us"].to_numpy()
        out["kernels_per_step"] = float(np.median(per_window(tr, w0, w1)))
        blocks = per_layer(tr, w0, w1, layers) if layers else np.array([])
        if np.isfinite(blocks).any():
            out["kernels_per_layer"] = float(np.nanmedian(blocks))
    out["host_syncs_per_step"] = _count_in(tr.ts[syncs], s0, s1) / n
    return out


def _in_windows(t: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> np.ndarray:
    """Mask of instants t inside the union of windows [s0, s1] (windows may nest/overlap)."""
    starts, ends = union_intervals(s0, s1)
    if starts.size == 0:
        return np.zeros(t.size, bool)
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t <= ends[np.clip(i, 0, None)])


def _count_in(t: np.ndarray, s0: np.ndarray, s1: np.ndarray) -> int:
    return int(_in_windows(t, s0, s1).sum())
