"""Per-step GPU bubble analysis of a Kineto trace.

Definitions (all times are float microseconds exactly as the trace records them; nothing is
rounded, so no idle time is invented by rounding — HTA rounds ts up and end down and over-reports):

Activity and busy time
    GPU activity = events of category `kernel`, `gpu_memcpy`, `gpu_memset` on one device
    (`cuda_sync` and `gpu_user_annotation` are not work). Busy time is the length of the
    union of activity intervals — per stream, and per device (across streams: overlap between
    streams is counted once, never summed). A trace holding several GPUs is analysed one device
    at a time (`device=`; default: the device with the most activity time).

Device gaps (bubbles)
    A bubble is a maximal gap in the device-level union: no activity on any stream. It is never
    split. Time before the first activity of the first step is not a bubble.

Steps
    Step spans are host `user_annotation` ranges, in this order of preference: names starting
    with `step[` (mtplab `step[decode bs=B]` / `step[prefill bs=B]`; SGLang model-runner spans
    `step[DRAFT_LOOP ...]`, `step[TARGET_VERIFY ...]`, `step[DRAFT_EXTEND ...]`, one per
    forward, grouped into decode iterations where the trace holds a draft span followed by a
    verify (or a verify followed by a draft extend): a draft loop, its verify and any draft
    extend after it are one step named
    `step[decode bs=B: DRAFT_LOOP+TARGET_VERIFY]`, `step_source` says so; otherwise each
    forward is one row), else
    `ProfilerStep#N` (plain PyTorch, vLLM), else fixed windows of `window_us` (the summary's
    `step_source` says which). Nested step spans count once (the outermost).
    Each GPU activity belongs to the step whose span contains its launch call (runtime/driver
    event with the same correlation; graph-replayed kernels share their `cudaGraphLaunch`'s
    correlation), or, with no launch call in the trace, its own start. Under overlap scheduling
    the GPU runs step k while the host already prepares k+1, so step windows live on the device
    timeline: step k's window is `(b[k-1], b[k]]` where `b[k]` is the end of step k's last GPU
    activity (running maximum over steps) and the first step starts at its first activity.
    `start_us`/`dur_us` are that window; `host_start_us`/`host_dur_us` are the host span. A
    bubble belongs to the step in which it ends — the step whose work it delayed — even when it
    began in the step before; windows end at activity ends, so a bubble always lies in one
    window and `busy_us + bubble_us == dur_us`. `bubble_frac = bubble_us / dur_us`.
    Fixed windows are cut every `window_us`, each cut moved back to the start of the bubble it
    would split. `skip_steps=N` drops the first N steps (warm-up, capture) from the tables and
    the summary; step numbers are kept.

Run-ahead (the host's launch lead; mtplab/health.py)
    `launch_lead_us` of step k = the end of step k's last GPU activity (launched inside its
    span; where the spans are SGLang forwards, also after it and before step k+1's span: an
    SGLang 0.5.17 trace spans only its verify forwards, and the draft forwards it launches
    between them belong to the step they follow) - the earliest launch call of step k+1's
    forward work: inside step k+1's span and outside its input preparation (`schedule` /
    `prepare` / `process_result` spans, mtplab's HOST_PREP_STAGES), the point the bubble meter
    marks (`mark_launch`, just after `prepare`). Input copies `prepare` issues before a host
    sync do not keep the GPU busy, so they are not the launch. Host and device times are one
    clock in a Kineto trace. > 0: the host issued step k+1's forward before the GPU ran out of
    step k's work (run-ahead); <= 0: the GPU waited. NaN for the last step, a step with no
    launched activity or no forward launch in the next, and without step spans (fixed windows).
    The summary's `run_ahead_frac` is the share of the kept steps with a lead that is > 0,
    `launch_lead_p10_us` / `_p50_us` / `_p90_us` its percentiles, `run_ahead_steps` their count.
    Where an SGLang trace's forward spans are grouped into decode steps, the lead runs from one
    step's GPU end to the next step's first forward launch.

Causes (exactly one per bubble, the first that applies; "overlaps" means with positive length)
    `sync`, `host_prep`, `launch`, `host:<stage>` / `host:python` / `host:untraced`, `other`:
    defined once, with their colours, in `causes.py` (`CAUSE_TABLE`). In short: a host block
    overlapping the bubble, then a host-prep span overlapping it, then work already issued
    before it began, then work issued late (the issuing thread's innermost stage span at the
    bubble's start, else `python` when it was inside other host events, else `untraced`: the
    thread ran code the profiler does not record), and `other` only for work whose launch call
    is not in the trace.
    The priority is literal: a host block or host-prep span overlapping a bubble wins even when
    the work that ends the bubble was already issued. Host spans count only from the processes
    whose launch calls drive the analysed device (merged multi-rank traces stay separate).
    Plus `before` / `after`: the stage of the activity that ended just before / began just after
    the bubble — the innermost stage-named `gpu_user_annotation` on that activity's stream, else
    the innermost stage-named host span around its launch call, else `unknown` (attribution
    impossible; never guessed). SGLang `step[VERIFY|DRAFT|DRAFT_EXTEND|EXTEND ...]` spans map to
    `verify` / `draft` / `draft_extend` / `prefill`.

Streams (cross-check with HTA's idle-time breakdown)
    Per stream: `busy_us` = length of the stream's union inside the analysed steps' span;
    `idle_us` = sum of the gaps of the stream's union that end in an analysed step (with all
    activity inside steps: the gaps between its first and last activity). Each stream gap is
    classified like HTA's `get_idle_time_breakdown`: `host_wait` when the launch call of the
    next activity started after the gap began; else `kernel_wait`
    when the gap is shorter than `consecutive_kernel_delay_us` (default 30 µs — HTA's docstring
    says ns but compares trace µs); else `other`. HTA measures each gap from the previous
    activity's end; here from the running maximum of ends (the same unless activities on one
    stream overlap). Stream gaps are also rows of `gaps` (`scope == "stream"`) with their step,
    cause and stages.

Tables (`Analysis`): `steps` (step, name, start_us, dur_us, busy_us, bubble_us, bubble_frac,
n_gaps, `bubble_<cause>_us` for each of `CAUSES` (`host` sums every `host:*` label),
host_start_us, host_dur_us); `gaps` (step,
start_us, end_us, gap_us, cause, before, after, scope "device"|"stream", stream (-1 for device),
idle_category); `streams` (stream, busy_us, idle_us, idle_{host_wait,kernel_wait,other}_us,
n_activities); `summary` (wall_us, busy_us, bubble_us, bubble_frac, n_steps, n_gaps, the cause
split, `bubble_by_cause_us` (every cause, `host:<stage>` ones apart), step_source, device,
skip_steps, consecutive_kernel_delay_us, notes). Times are absolute trace µs (`ts` units).

No device activity (a CPU-only profile): steps are the host step spans (without any, fixed
windows over the host's ops, cut in the gaps between them), `busy_us` is the host's time inside
profiled ops (`cpu_op`, union over the threads), `bubble_us` is 0, `bubble_frac` is NaN and the
summary's `notes` say what such a trace can and cannot show (`CPU_TRACE_NOTE`); nothing is
invented.
"""
from __future__ import annotations

import heapq
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import orjson
import pandas as pd

from ..atomic import atomic_path, atomic_write_bytes
from ..health import launch_leads, run_ahead
from ..stages import HOST_PREP_STAGES, STAGES
from .causes import (CAUSES, HOST_PREP, HOST_PYTHON, HOST_UNTRACED, LAUNCH, OTHER, SYNC,
                     cause_group)
from .trace_io import (CONSECUTIVE_KERNEL_DELAY_US, DEFAULT_WINDOW_US, GPU_ACTIVITY_CATS,
                       RUNTIME_CATS, WARMUP_STEPS, Trace, load_trace)

PathLike = Union[str, "os.PathLike[str]"]

IDLE_CATEGORIES = ("host_wait", "kernel_wait", "other")
UNKNOWN = "unknown"
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
    "hipStreamSynchronize", "hipDeviceSynchronize", "hipEventSynchronize",
})
SYNC_OPS = frozenset({"aten::item", "aten::_local_scalar_dense"})
_SGLANG_STEP = re.compile(r"^step\[(?P<mode>[A-Z][A-Z0-9_]*)\b")
# SGLang 0.5.23 `step[DRAFT|VERIFY|EXTEND|DECODE|DRAFT_LOOP ...]` and 0.5.17
# `step[{ForwardMode.name} bs=N]`; DECODE is a target decode, a one-node verify (stages.py).
_SGLANG_MODE_STAGE = {"VERIFY": "verify", "TARGET_VERIFY": "verify", "DECODE": "verify",
                      "DRAFT": "draft", "DRAFT_LOOP": "draft", "DRAFT_EXTEND": "draft_extend",
                      "DRAFT_EXTEND_V2": "draft_extend", "EXTEND": "prefill", "PREFILL": "prefill",
                      "MIXED": "prefill", "SPLIT_PREFILL": "prefill"}
_STAGE_SET = frozenset(STAGES)
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
CPU_TRACE_NOTE = (
    "no GPU activity (kernel/gpu_memcpy/gpu_memset) in the trace: a CPU trace shows the host "
    "alone -- its steps, the ops of each thread (busy = time inside profiled ops) and the host "
    "time outside every op (Python, untraced code); it cannot show GPU work, device bubbles or "
    "their causes (bubble 0): profile on a GPU for those")

STEP_COLUMNS = ["step", "name", "start_us", "dur_us", "busy_us", "bubble_us", "bubble_frac",
                "n_gaps", *(f"bubble_{c}_us" for c in CAUSES), "host_start_us", "host_dur_us",
                "launch_lead_us"]
GAP_COLUMNS = ["step", "start_us", "end_us", "gap_us", "cause", "before", "after", "scope",
               "stream", "idle_category"]
STREAM_COLUMNS = ["stream", "busy_us", "idle_us", "idle_host_wait_us", "idle_kernel_wait_us",
                  "idle_other_us", "n_activities"]


def stage_of(name: str) -> str | None:
    """The stage a span name denotes (mtplab vocabulary or SGLang forward spans), else None."""
    if name in _STAGE_SET:
        return name
    m = _SGLANG_STEP.match(name)
    return _SGLANG_MODE_STAGE.get(m.group("mode")) if m else None


@dataclass
class Analysis:
    """Result of `analyze`: tables (see the module docstring for every definition) and a summary."""

    steps: pd.DataFrame
    gaps: pd.DataFrame        # device bubbles (scope "device") and stream gaps (scope "stream")
    streams: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def device_gaps(self) -> pd.DataFrame:
        """The bubbles: rows of `gaps` with scope "device"."""
        return self.gaps[self.gaps["scope"] == "device"].reset_index(drop=True)

    def step_gaps(self, step: int, *, causes: Any = None, min_gap_us: float = 0.0) -> pd.DataFrame:
        """The bubbles of one step at least `min_gap_us` long (of the cause groups `causes`,
        default all), in time order, with `at_us`: µs from the step's start."""
        g = self.device_gaps
        g = g[(g["step"] == step) & (g["gap_us"] >= min_gap_us)]
        if causes is not None:
            g = g[cause_group(g["cause"]).isin(list(causes))]
        start = self.steps.loc[self.steps["step"] == step, "start_us"]
        at = g["start_us"] - (float(start.iloc[0]) if len(start) else np.nan)
        return g.assign(at_us=at)[["at_us", "gap_us", "cause", "before", "after"]] \
            .reset_index(drop=True)


# --------------------------------------------------------------------------- interval helpers

def union_intervals(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals into sorted disjoint (start, end) arrays (touching intervals merge)."""
    if start.size == 0:
        return start.copy(), end.copy()
    o = np.lexsort((end, start))
    s, e = start[o], end[o]
    run = np.maximum.accumulate(e)
    new = np.empty(s.size, bool)
    new[0] = True
    new[1:] = s[1:] > run[:-1]
    idx = np.flatnonzero(new)
    last = np.append(idx[1:] - 1, s.size - 1)
    return s[idx], run[last]


def _overlaps(us: np.ndarray, ue: np.ndarray, g0: np.ndarray, g1: np.ndarray) -> np.ndarray:
    """For each (g0, g1): does the disjoint sorted union (us, ue) intersect it with positive
    length?"""
    if us.size == 0:
        return np.zeros(g0.shape, bool)
    k = np.searchsorted(us, g1, side="left") - 1  # last interval starting before g1
    ok = k >= 0
    return ok & (ue[np.clip(k, 0, None)] > g0)


def _within(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """For each time in `t`: does it lie in the disjoint sorted union (us, ue), [start,
    end)? NaN times do not."""
    if us.size == 0:
        return np.zeros(np.shape(t), bool)
    k = np.searchsorted(us, t, side="right") - 1
    return (k >= 0) & (t < ue[np.clip(k, 0, None)])


def _busy_until(us: np.ndarray, ue: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Busy time of the union (us, ue) in (-inf, t], vectorised over t."""
    if us.size == 0:
        return np.zeros(np.shape(t))
    cum = np.concatenate(([0.0], np.cumsum(ue - us)))
    k = np.searchsorted(us, t, side="right")  # intervals starting at or before t
    j = np.clip(k - 1, 0, None)
    part = np.where(k > 0, np.minimum(t, ue[j]) - us[j], 0.0)
    return cum[np.clip(k - 1, 0, None)] * (k > 0) + np.maximum(part, 0.0)


def _gaps(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Gaps of the union of intervals sorted by start: (g0, g1, idx_before, idx_after).

    `idx_after` is the activity starting at g1 (first in order), `idx_before` the one whose end is
    g0 (the latest one reaching the running maximum).
    """
    if s.size < 2:
        z = np.zeros(0)
        return z, z, z.astype(np.int64), z.astype(np.int64)
    run = np.maximum.accumulate(e)
    idx = np.arange(s.size)
    arg_run = np.maximum.accumulate(np.where(e >= run, idx, 0))
    after = np.flatnonzero(s[1:] > run[:-1]) + 1
    return run[after - 1], s[after], arg_run[after - 1], after


class _StageTimeline:
    """Piecewise-constant innermost stage over time for one lane (shortest enclosing span wins)."""

    def __init__(self, ts: np.ndarray, end: np.ndarray, stages: list[str]):
        points = np.unique(np.concatenate((ts, end)))
        order = np.argsort(ts, kind="stable")
        heap: list[tuple[float, float, int]] = []
        labels: list[str | None] = []
        j = 0
        for t in points:
            while j < order.size and ts[order[j]] <= t:
                k = order[j]
                heapq.heappush(heap, (end[k] - ts[k], end[k], k))
                j += 1
            while heap and heap[0][1] <= t:  # ended at or before t (lazy: only the top matters)
                heapq.heappop(heap)
            labels.append(stages[heap[0][2]] if heap else None)
        self.points = points
        self.labels = np.array(labels + [None], dtype=object)  # [-1] → None before the first

    def at(self, t: np.ndarray) -> np.ndarray:
        """Stage (or None) at each time in `t`."""
        return self.labels[np.searchsorted(self.points, t, side="right") - 1]


# --------------------------------------------------------------------------- the analysis

@dataclass
class _Ctx:
    """Arrays shared by the analysis steps (internal)."""

    s: np.ndarray           # activity start, sorted
    e: np.ndarray           # activity end
    stream: np.ndarray
    launch_ts: np.ndarray   # launch-call start per activity, NaN when unknown
    launch_row: np.ndarray  # row of the launch call in the trace, -1 when unknown
    host: np.ndarray         # mask of host events of the processes that drive this device
    sync_u: tuple[np.ndarray, np.ndarray]
    prep_u: tuple[np.ndarray, np.ndarray]
    gpu_tl: dict[int, _StageTimeline]
    host_tl: dict[tuple[int, int], _StageTimeline]
    trace: Trace
    input_u: tuple[np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0))   # mtplab's host-prep
                                                                          #   spans (union)
    host_busy: dict = field(default_factory=dict)   # (pid, tid) -> union of its host events

    def thread_busy(self, pid: int, tid: int) -> tuple[np.ndarray, np.ndarray]:
        """Union of every host event of one thread (computed once per thread)."""
        key = (pid, tid)
        if key not in self.host_busy:
            tr = self.trace
            m = np.flatnonzero(self.host & (tr.pid == pid) & (tr.tid == tid))
            self.host_busy[key] = union_intervals(tr.ts[m], tr.end[m])
        return self.host_busy[key]


def analyze(trace: Union[Trace, PathLike], *, skip_steps: int = 0,
            consecutive_kernel_delay_us: float = CONSECUTIVE_KERNEL_DELAY_US,
            device: int | None = None, window_us: float = DEFAULT_WINDOW_US) -> Analysis:
    """Find per-step device bubbles, their causes and per-stream idle time (module docstring).

    Args:
        trace: a loaded `Trace` or the path of a `.json` / `.json.gz` Kineto trace.
        skip_steps: leave out the first N steps (warm-up, graph capture); steps keep their numbers.
        consecutive_kernel_delay_us: HTA's kernel-wait threshold for stream gaps, µs (default 30).
        device: GPU index to analyse (default: the one with the most activity time).
        window_us: window length when the trace has neither step spans nor ProfilerStep#N.
    """
    if skip_steps < 0:
        raise ValueError(f"skip_steps must be >= 0, got {skip_steps}")
    tr = trace if isinstance(trace, Trace) else load_trace(trace)
    notes: list[str] = []
    act = tr.cat_mask(*GPU_ACTIVITY_CATS)
    devices = np.unique(tr.device[act])
    if device is None and devices.size:
        totals = [tr.dur[act & (tr.device == d)].sum() for d in devices]
        device = int(devices[int(np.argmax(totals))])
        if devices.size > 1:
            notes.append(f"trace has GPU activity on devices {devices.tolist()}; analysed device "
                         f"{device} (pass device= for another)")
    elif device is not None and device not in devices:
        raise ValueError(f"device {device} has no GPU activity in this trace "
                         f"(devices with activity: {devices.tolist()})")
    if device is not None:
        act &= tr.device == device
    ctx = _context(tr, act, device)
    steps_src, step_name, host_ts, host_end = _step_spans(tr, ctx.host)
    if ctx.s.size == 0:
        notes.append(CPU_TRACE_NOTE)
        ops = ctx.host & tr.cat_mask("cpu_op")
        ous, oue = union_intervals(tr.ts[ops], tr.end[ops])
        if steps_src == "windows":
            if ous.size:
                b_lo, bounds, step_name = _window_bounds(ous, oue, window_us)
                host_ts = np.concatenate(([b_lo], bounds[:-1]))
                host_end = bounds
                steps_src = f"fixed windows of {window_us:g} us (no step spans, no ProfilerStep#N)"
            else:
                step_name = ["trace"]
                host_ts, host_end = np.array([tr.ts.min()]), np.array([tr.end.max()])
                steps_src = "whole trace (no step spans, no ProfilerStep#N)"
        _check_skip(skip_steps, len(step_name), steps_src)
        return _cpu_only(step_name, host_ts, host_end, (ous, oue), skip_steps, steps_src, notes)
    if steps_src == "windows":
        b_lo, bounds, step_name = _window_bounds(ctx.s, ctx.e, window_us)
        host_ts = np.full(bounds.size, np.nan)
        host_end = host_ts
        leads = host_ts
        steps_src = f"fixed windows of {window_us:g} us (no step spans, no ProfilerStep#N)"
    else:
        forward_spans = all(_SGLANG_STEP.match(n) for n in step_name)
        b_lo, bounds, leads = _step_bounds(ctx, host_ts, host_end, notes, forward_spans)
    _check_skip(skip_steps, bounds.size, steps_src)
    starts = np.concatenate(([b_lo], bounds[:-1]))
    keep_from = starts[skip_steps]
    gaps = _gap_table(ctx, b_lo, bounds, consecutive_kernel_delay_us)
    gaps = gaps[gaps["step"] >= skip_steps].reset_index(drop=True)
    steps = _step_table(ctx, step_name, starts, bounds, host_ts, host_end, gaps, skip_steps,
                        leads)
    streams = _stream_table(ctx, gaps, keep_from, bounds[-1])
    summary = _summary(steps, gaps, steps_src, device, skip_steps, consecutive_kernel_delay_us,
                       notes)
    return Analysis(steps=steps, gaps=gaps, streams=streams, summary=summary)


def analyze_run(trace: Union[Trace, PathLike], skip_steps: int | None = None, **kw) -> Analysis:
    """`analyze` with the warm-up rule of `mtplab analyze`, `mtplab plot`, the demo and the
    notebooks: `skip_steps=None` leaves out the first WARMUP_STEPS steps when the trace has
    more than WARMUP_STEPS + 1, else none."""
    tr = trace if isinstance(trace, Trace) else load_trace(trace)
    if skip_steps is not None:
        return analyze(tr, skip_steps=skip_steps, **kw)
    res = analyze(tr, **kw)
    if res.summary["n_steps"] > WARMUP_STEPS + 1:
        res = analyze(tr, skip_steps=WARMUP_STEPS, **kw)
    return res


def _check_skip(skip: int, n: int, source: str) -> None:
    if skip >= n:
        raise ValueError(f"skip_steps={skip} leaves no step: the trace has {n} ({source})")


def _context(tr: Trace, act: np.ndarray, device: int | None) -> _Ctx:
    idx = np.flatnonzero(act)
    o = idx[np.lexsort((tr.end[idx], tr.ts[idx]))]
    s, e = tr.ts[o], tr.end[o]
    # launch calls by correlation: earliest runtime/driver event carrying it
    rt = np.flatnonzero(tr.cat_mask(*RUNTIME_CATS) & (tr.correlation >= 0))
    rt = rt[np.lexsort((tr.ts[rt], tr.correlation[rt]))]
    rt_corr = tr.correlation[rt]
    first = np.ones(rt.size, bool)
    first[1:] = rt_corr[1:] != rt_corr[:-1]
    rt, rt_corr = rt[first], rt_corr[first]
    corr = tr.correlation[o]
    k = np.searchsorted(rt_corr, corr)
    found = (k < rt.size) & (corr >= 0)
    found[found] = rt_corr[k[found]] == corr[found]
    lane = np.where(found, rt[np.clip(k, 0, max(rt.size - 1, 0))] if rt.size else -1, -1)
    launch_ts = np.where(lane >= 0, tr.ts[np.clip(lane, 0, None)], np.nan)
    host = ~tr.cat_mask(*GPU_ACTIVITY_CATS, "gpu_user_annotation", "cuda_sync")
    pids = np.unique(tr.pid[lane[lane >= 0]])
    if pids.size:  # merged multi-process traces: only the processes driving this device
        host &= np.isin(tr.pid, pids)
    sync = host & (tr.name_mask(lambda n: n in SYNC_CALLS or n in SYNC_OPS)
                   | (tr.cat_mask("user_annotation") & tr.name_mask(lambda n: n == "sync")))
    prep = host & tr.cat_mask("user_annotation") & tr.name_mask(
        lambda n: n in HOST_PREP_STAGES or n.startswith("scheduler."))
    # mtplab's own input preparation only: SGLang's `scheduler.run_batch` wraps its forwards
    inputs = host & tr.cat_mask("user_annotation") & tr.name_mask(
        lambda n: n in HOST_PREP_STAGES)
    return _Ctx(s=s, e=e, stream=tr.stream[o], launch_ts=launch_ts, launch_row=lane, host=host,
                sync_u=union_intervals(tr.ts[sync], tr.end[sync]),
                prep_u=union_intervals(tr.ts[prep], tr.end[prep]),
                gpu_tl=_timelines(tr, tr.cat_mask("gpu_user_annotation") &
                                  ((tr.device == device) if device is not None else True),
                                  key=lambda i: int(tr.stream[i])),
                host_tl=_timelines(tr, host & tr.cat_mask("user_annotation"),
                                   key=lambda i: (int(tr.pid[i]), int(tr.tid[i]))),
                trace=tr, input_u=union_intervals(tr.ts[inputs], tr.end[inputs]))


def _timelines(tr: Trace, mask: np.ndarray, key) -> dict:
    """Stage timelines per lane from the stage-named spans selected by `mask`."""
    stage_by_code = [stage_of(n) for n in tr.names]
    idx = np.flatnonzero(mask)
    idx = idx[[stage_by_code[c] is not None for c in tr.name[idx]]] if idx.size else idx
    lanes: dict[Any, list[int]] = {}
    for i in idx.tolist():
        lanes.setdefault(key(i), []).append(i)
    return {k: _StageTimeline(tr.ts[v], tr.end[v], [stage_by_code[c] for c in tr.name[v]])
            for k, v in lanes.items()}


def _step_spans(tr: Trace, host: np.ndarray) -> tuple[str, list[str], np.ndarray, np.ndarray]:
    """(source, names, host start, host end) of the outermost step spans, sorted by start."""
    ua = host & tr.cat_mask("user_annotation")
    for source, pred in (("step spans", lambda n: n.startswith("step[")),
                         ("ProfilerStep#N", lambda n: bool(_PROFILER_STEP.match(n)))):
        idx = np.flatnonzero(ua & tr.name_mask(pred))
        if idx.size:
            idx = idx[np.lexsort((-tr.end[idx], tr.ts[idx]))]
            ts, end = tr.ts[idx], tr.end[idx]
            outer = np.ones(idx.size, bool)
            if idx.size > 1:
                outer[1:] = ts[1:] >= np.maximum.accumulate(end)[:-1]
            idx = idx[outer]
            names, ts, end = [tr.name_of(i) for i in idx], tr.ts[idx], tr.end[idx]
            if source == "step spans":
                grouped = _sglang_decode_steps(names, ts, end)
                if grouped is not None:
                    return grouped
            return source, names, ts, end
    return "windows", [], np.zeros(0), np.zeros(0)


_DRAFT_MODES = frozenset({"DRAFT", "DRAFT_LOOP"})
_VERIFY_MODES = frozenset({"VERIFY", "TARGET_VERIFY"})
_BS = re.compile(r"\bbs=(\d+)")


def _sglang_decode_steps(names: list[str], ts: np.ndarray, end: np.ndarray
                         ) -> tuple[str, list[str], np.ndarray, np.ndarray] | None:
    """SGLang's forward spans grouped into decode iterations, or None when the trace holds no
    draft span followed by a verify and no verify followed by a draft extend (then each
    forward stays a step; 0.5.17 runs its draft forwards in a CUDA graph without a span).

    A decode step opens at a draft span (`DRAFT` / `DRAFT_LOOP`; consecutive ones are one
    draft loop) and takes the verify that follows and any `DRAFT_EXTEND*` after that verify;
    a verify with no draft before it (the draft fell before the profiler's window) is a step
    of its own, as is every other forward (prefill `EXTEND`, a target-only `DECODE`). A step
    is named `step[decode bs=B: DRAFT_LOOP+TARGET_VERIFY]` (its forwards; B the verify's
    batch), its host span from its first forward's start to its last one's end."""
    modes = [m.group("mode") if (m := _SGLANG_STEP.match(n)) else None for n in names]
    pairs = any((a in _DRAFT_MODES and b in _VERIFY_MODES)
                or (a in _VERIFY_MODES and b is not None and b.startswith("DRAFT_EXTEND"))
                for a, b in zip(modes, modes[1:]))
    if not pairs:
        return None
    groups: list[list[int]] = []
    state = None         # the open group's phase: "draft", "verify", or None (no open group)
    for i, m in enumerate(modes):
        if m in _DRAFT_MODES:
            if state != "draft":
                groups.append([])
            state = "draft"
        elif m in _VERIFY_MODES:
            if state != "draft":
                groups.append([])
            state = "verify"
        elif m is not None and m.startswith("DRAFT_EXTEND") and state == "verify":
            pass
        else:
            groups.append([])
            state = None
        groups[-1].append(i)
    out_names, g0, g1 = [], [], []
    for g in groups:
        gm = [modes[i] for i in g]
        if not any(m in _DRAFT_MODES or m in _VERIFY_MODES for m in gm):
            out_names.append(names[g[0]])
        else:
            bs = next((b.group(1) for i in g if modes[i] in _VERIFY_MODES
                       and (b := _BS.search(names[i]))), None) \
                or next((b.group(1) for i in g if (b := _BS.search(names[i]))), "?")
            out_names.append(f"step[decode bs={bs}: {'+'.join(dict.fromkeys(gm))}]")
        g0.append(float(ts[g[0]]))
        g1.append(float(np.max(end[g])))
    return ("SGLang forward spans grouped into decode steps (a draft loop, its verify and "
            "any draft extend after it: one step)", out_names, np.array(g0), np.array(g1))


def _step_bounds(ctx: _Ctx, host_ts: np.ndarray, host_end: np.ndarray, notes: list[str],
                 forward_spans: bool = False) -> tuple[float, np.ndarray, np.ndarray]:
    """Device-timeline step windows: (start of the first, end boundary of each step, the
    launch lead of each step: module doc "Run-ahead"). `forward_spans`: the spans are one
    forward each (SGLang's), so work launched between two spans is the earlier step's."""
    key = np.where(np.isnan(ctx.launch_ts), ctx.s, ctx.launch_ts)
    k = np.searchsorted(host_ts, key, side="right") - 1
    inside = (k >= 0) & (key <= host_end[np.clip(k, 0, None)])
    n = host_ts.size
    last_end = np.full(n, -np.inf)
    np.maximum.at(last_end, k[inside], ctx.e[inside])
    if not inside.any():
        notes.append("no GPU activity was launched inside a step span: step windows are empty")
        return float(ctx.s[0]), np.full(n, float(ctx.s[0])), np.full(n, np.nan)
    first_launch = np.full(n, np.inf)
    launched = inside & ~np.isnan(ctx.launch_ts) & ~_within(*ctx.input_u, ctx.launch_ts)
    np.minimum.at(first_launch, k[launched], ctx.launch_ts[launched])
    nxt = np.append(first_launch[1:], np.inf)
    work_end = last_end
    if forward_spans:          # k >= 0: launched after span k began, before span k+1 did
        work_end = np.full(n, -np.inf)
        np.maximum.at(work_end, k[k >= 0], ctx.e[k >= 0])
    leads = np.where(np.isfinite(last_end) & np.isfinite(nxt), launch_leads(work_end, nxt),
                     np.nan)
    first_step = int(k[inside].min())
    b_lo = float(ctx.s[inside & (k == first_step)].min())
    bounds = np.maximum.accumulate(np.maximum(last_end, b_lo))
    outside = int((~inside).sum())
    if outside:
        notes.append(f"{outside} GPU activities were launched outside every step span; they count "
                     "as busy time of the window they run in")
    return b_lo, bounds, leads


def _window_bounds(s: np.ndarray, e: np.ndarray, window_us: float
                   ) -> tuple[float, np.ndarray, list[str]]:
    """Fixed windows over the busy intervals (s, e) (sorted by start): (start, window ends,
    names); a cut that would split an idle gap moves back to the gap's start."""
    if not window_us > 0:
        raise ValueError(f"window_us must be > 0, got {window_us}")
    t0, t1 = float(s[0]), float(e.max())
    cuts = t0 + window_us * np.arange(1, int(np.ceil((t1 - t0) / window_us)))
    g0, g1, _, _ = _gaps(s, e)
    j = np.searchsorted(g0, cuts, side="right") - 1  # gap starting at or before the cut
    in_gap = (j >= 0) & (cuts < g1[np.clip(j, 0, None)]) if g0.size else np.zeros(cuts.size, bool)
    cuts = np.where(in_gap, g0[np.clip(j, 0, None)] if g0.size else cuts, cuts)
    bounds = np.append(np.maximum.accumulate(cuts) if cuts.size else cuts, t1)
    return t0, bounds, [f"window[{i}]" for i in range(bounds.size)]


def _stages(ctx: _Ctx, idx: np.ndarray) -> list[str]:
    """Innermost stage of activities `idx`: GPU-lane annotation, else host span around the
    launch."""
    out = np.full(idx.size, None, dtype=object)
    mid = 0.5 * (ctx.s[idx] + ctx.e[idx])
    streams = ctx.stream[idx]
    for sid, tl in ctx.gpu_tl.items():
        m = streams == sid
        if m.any():
            out[m] = tl.at(mid[m])
    rows = ctx.launch_row[idx]
    todo = np.flatnonzero((out == None) & (rows >= 0))  # noqa: E711 (elementwise)
    if todo.size:
        r = rows[todo]
        pid, tid, ts = ctx.trace.pid[r], ctx.trace.tid[r], ctx.trace.ts[r]
        for (p, t), tl in ctx.host_tl.items():
            m = (pid == p) & (tid == t)
            if m.any():
                out[todo[m]] = tl.at(ts[m])
    out[out == None] = UNKNOWN  # noqa: E711
    return out.tolist()


def _classify(ctx: _Ctx, g0: np.ndarray, g1: np.ndarray, after: np.ndarray,
              s: np.ndarray, launch_ts: np.ndarray, launch_row: np.ndarray) -> np.ndarray:
    """Cause of each gap: the first of causes.py's table that applies.

    `s`, `launch_ts`, `launch_row` are the (sorted) activity starts, launch times and launch
    rows the `after` indices refer to; every activity starting exactly at g1 counts as work
    ending the gap (the host thread is the one that launched the activity at `after`).
    """
    sync = _overlaps(*ctx.sync_u, g0, g1)
    prep = _overlaps(*ctx.prep_u, g0, g1)
    hi = np.searchsorted(s, g1, side="right")
    if g0.size:  # earliest launch among the activities in [after, hi) (NaN-aware, vectorised)
        bounds = np.column_stack((after, hi)).ravel()
        first_launch = np.fmin.reduceat(np.append(launch_ts, np.nan), bounds)[::2]
        launched = first_launch <= g0
    else:
        launched = np.zeros(0, bool)
    late = ~(sync | prep | launched) & (launch_row[after] >= 0)
    host = np.full(g0.size, None, dtype=object)
    if late.any():
        idx = np.flatnonzero(late)
        rows = launch_row[after[idx]]
        pid, tid = ctx.trace.pid[rows], ctx.trace.tid[rows]
        for p, t in set(zip(pid.tolist(), tid.tolist())):
            m = (pid == p) & (tid == t)
            at = g0[idx[m]]
            tl = ctx.host_tl.get((p, t))
            stage = tl.at(at) if tl is not None else np.full(at.size, None, dtype=object)
            us, ue = ctx.thread_busy(p, t)
            k = np.searchsorted(us, at, side="right") - 1
            busy = (k >= 0) & (ue[np.clip(k, 0, None)] > at) if us.size else np.zeros(at.size, bool)
            host[idx[m]] = [f"host:{st}" if st is not None else
                            f"host:{HOST_PYTHON}" if b else f"host:{HOST_UNTRACED}"
                            for st, b in zip(stage, busy)]
    out = np.full(g0.size, OTHER, dtype=object)
    has_host = host != None  # noqa: E711 (elementwise)
    out[has_host] = host[has_host]
    masks = {LAUNCH: launched, HOST_PREP: prep, SYNC: sync}
    for name in reversed(CAUSES):        # the table's lowest priority first: the first wins
        if name in masks:
            out[masks[name]] = name
    return out


def _gap_table(ctx: _Ctx, b_lo: float, bounds: np.ndarray, delay_us: float) -> pd.DataFrame:
    rows = []
    # device scope
    g0, g1, before, after = _gaps(ctx.s, ctx.e)
    rows.append(_gap_rows(ctx, g0, g1, before, after, np.arange(ctx.s.size), "device", -1,
                          b_lo, bounds, delay_us))
    # stream scope
    for sid in np.unique(ctx.stream).tolist():
        sel = np.flatnonzero(ctx.stream == sid)  # already sorted by start
        h0, h1, hb, ha = _gaps(ctx.s[sel], ctx.e[sel])
        rows.append(_gap_rows(ctx, h0, h1, hb, ha, sel, "stream", sid, b_lo, bounds, delay_us))
    df = pd.concat(rows, ignore_index=True)
    df = df.astype({c: "str" for c in ("cause", "before", "after", "scope", "idle_category")})
    return df.sort_values(["scope", "stream", "start_us"], kind="stable").reset_index(drop=True)


def _gap_rows(ctx: _Ctx, g0, g1, before, after, sel, scope: str, stream: int, b_lo: float,
              bounds: np.ndarray, delay_us: float) -> pd.DataFrame:
    """Rows for gaps of the union of activities `sel` (indices into ctx, sorted by start)."""
    step = np.searchsorted(bounds, g1, side="left")
    ok = (g1 > b_lo) & (step < bounds.size)
    g0, g1, before, after, step = g0[ok], g1[ok], before[ok], after[ok], step[ok]
    cause = _classify(ctx, g0, g1, after, ctx.s[sel], ctx.launch_ts[sel], ctx.launch_row[sel])
    nxt_launch = ctx.launch_ts[sel][after]
    gap = g1 - g0
    cat = np.select([nxt_launch > g0, gap < delay_us], ["host_wait", "kernel_wait"], "other")
    return pd.DataFrame({
        "step": step.astype(np.int64), "start_us": g0, "end_us": g1, "gap_us": gap,
        "cause": cause.tolist(),
        "before": _stages(ctx, sel[before]), "after": _stages(ctx, sel[after]),
        "scope": [scope] * g0.size, "stream": np.full(g0.size, stream, np.int64),
        "idle_category": cat.tolist()},
        columns=GAP_COLUMNS)


def _step_table(ctx: _Ctx, names: list[str], starts: np.ndarray, bounds: np.ndarray,
                host_ts: np.ndarray, host_end: np.ndarray, gaps: pd.DataFrame,
                skip: int, leads: np.ndarray) -> pd.DataFrame:
    us, ue = union_intervals(ctx.s, ctx.e)
    busy = _busy_until(us, ue, bounds) - _busy_until(us, ue, starts)
    dg = gaps[gaps["scope"] == "device"]
    n = bounds.size
    st, gl = dg["step"].to_numpy(), dg["gap_us"].to_numpy()
    cause = cause_group(dg["cause"]).to_numpy() if len(dg) else np.zeros(0, dtype=object)
    per = {c: np.bincount(st[cause == c], weights=gl[cause == c], minlength=n)[:n] for c in CAUSES}
    bubble = np.bincount(st, weights=gl, minlength=n)[:n]
    dur = bounds - starts
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(dur > 0, bubble / np.where(dur > 0, dur, 1.0), np.nan)
    df = pd.DataFrame({
        "step": np.arange(n, dtype=np.int64), "name": names, "start_us": starts, "dur_us": dur,
        "busy_us": busy, "bubble_us": bubble, "bubble_frac": frac,
        "n_gaps": np.bincount(st, minlength=n)[:n].astype(np.int64),
        **{f"bubble_{c}_us": per[c] for c in CAUSES},
        "host_start_us": host_ts, "host_dur_us": host_end - host_ts,
        "launch_lead_us": leads}, columns=STEP_COLUMNS)
    return df[df["step"] >= skip].reset_index(drop=True)


def _stream_table(ctx: _Ctx, gaps: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """Per-stream busy time in [t0, t1] and the stream gaps (already restricted to kept steps)."""
    sg = gaps[gaps["scope"] == "stream"]
    rows = []
    for sid in np.unique(ctx.stream).tolist():
        sel = ctx.stream == sid
        us, ue = union_intervals(ctx.s[sel], ctx.e[sel])
        busy = float(_busy_until(us, ue, np.array([t1]))[0]
                     - _busy_until(us, ue, np.array([t0]))[0])
        mine = sg[sg["stream"] == sid]
        idle = {c: float(mine["gap_us"][mine["idle_category"] == c].sum()) for c in IDLE_CATEGORIES}
        rows.append({"stream": sid, "busy_us": busy, "idle_us": float(mine["gap_us"].sum()),
                     **{f"idle_{c}_us": v for c, v in idle.items()},
                     "n_activities": int((sel & (ctx.s >= t0) & (ctx.s <= t1)).sum())})
    return pd.DataFrame(rows, columns=STREAM_COLUMNS)


def _summary(steps: pd.DataFrame, gaps: pd.DataFrame, source: str, device: int | None,
             skip: int, delay_us: float, notes: list[str]) -> dict[str, Any]:
    wall = float(steps["dur_us"].sum())
    bubble = float(steps["bubble_us"].sum())
    out: dict[str, Any] = {
        "wall_us": wall, "busy_us": float(steps["busy_us"].sum()), "bubble_us": bubble,
        "bubble_frac": bubble / wall if wall > 0 else float("nan"), "n_steps": int(len(steps)),
        "n_gaps": int((gaps["scope"] == "device").sum()) if len(gaps) else 0,
        **{f"bubble_{c}_us": float(steps[f"bubble_{c}_us"].sum()) for c in CAUSES},
        "bubble_by_cause_us": _by_cause(steps, gaps),
        **run_ahead(steps["launch_lead_us"]),
        "step_source": source, "device": device, "skip_steps": skip,
        "consecutive_kernel_delay_us": delay_us, "notes": notes,
    }
    return out


def _by_cause(steps: pd.DataFrame, gaps: pd.DataFrame) -> dict[str, float]:
    """Device bubble time per cause (host:<stage> apart) over the kept steps, largest first."""
    if not len(gaps):
        return {}
    dg = gaps[(gaps["scope"] == "device") & gaps["step"].isin(steps["step"])]
    by = dg.groupby("cause")["gap_us"].sum().sort_values(ascending=False)
    return {str(k): float(v) for k, v in by.items()}


def _cpu_only(names: list[str], host_ts: np.ndarray, host_end: np.ndarray,
              ops: tuple[np.ndarray, np.ndarray], skip: int, source: str,
              notes: list[str]) -> Analysis:
    """Steps of a trace without GPU activity: host windows, `busy_us` the host's time inside
    profiled ops (`ops`: their union over the analysed threads), no bubble."""
    n = len(names)
    zeros = np.zeros(n)
    busy = _busy_until(*ops, host_end) - _busy_until(*ops, host_ts)
    steps = pd.DataFrame({
        "step": np.arange(n, dtype=np.int64), "name": names, "start_us": host_ts,
        "dur_us": host_end - host_ts, "busy_us": busy, "bubble_us": zeros,
        "bubble_frac": np.full(n, np.nan), "n_gaps": np.zeros(n, np.int64),
        **{f"bubble_{c}_us": zeros for c in CAUSES},
        "host_start_us": host_ts, "host_dur_us": host_end - host_ts,
        "launch_lead_us": np.full(n, np.nan)}, columns=STEP_COLUMNS)
    steps = steps[steps["step"] >= skip].reset_index(drop=True)
    gaps = pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
        GAP_COLUMNS, ["int64", "float64", "float64", "float64", "str", "str", "str", "str",
                      "int64", "str"])})
    streams = pd.DataFrame(columns=STREAM_COLUMNS)
    summary = _summary(steps, gaps, source, None, skip, CONSECUTIVE_KERNEL_DELAY_US, notes)
    summary["bubble_frac"] = float("nan")
    return Analysis(steps=steps, gaps=gaps, streams=streams, summary=summary)


# --------------------------------------------------------------------------- output

def write_analysis(result: Analysis, out_dir: PathLike) -> dict[str, Path]:
    """Write steps.parquet, gaps.parquet, streams.parquet and summary.json atomically into
    out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in ("steps", "gaps", "streams"):
        p = out / f"{name}.parquet"
        with atomic_path(p) as tmp:
            getattr(result, name).to_parquet(tmp, index=False)
        paths[name] = p
    paths["summary"] = atomic_write_bytes(out / "summary.json", summary_json(result.summary))
    return paths


def summary_json(summary: dict[str, Any]) -> bytes:
    """The summary as indented JSON bytes (NaN written as null)."""
    return orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n"
