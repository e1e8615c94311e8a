"""Bubble plots (matplotlib, Agg backend): the per-step timeline, bubble fraction per config,
histograms.

`plot_timeline` draws one lane per host thread that launched GPU work (its stage spans coloured
with `STAGE_COLORS`, step spans outlined, synchronize calls in the `sync` colour) and one lane
per GPU stream (stage-named `gpu_user_annotation` spans as a coloured band, kernels / memcpy /
memset as dark boxes), and marks every device bubble with a band across the GPU lanes in the
colour of its cause (`causes.py`), each cause drawn named in the legend, and each step's
launch lead (bubbles.py "Run-ahead") as a bar from the next step's forward launch to the
step's last GPU work, green when the host ran ahead, red when the GPU waited. Lanes are named by
role (`lanes.py`: `host`, and `forward` / `schedule` / `copy` on mtplab's streams, `compute`
/ `copy` / `nccl` / `side` on any other program's), with the stream id. A CPU-only trace has
no GPU lanes and no bubbles: its lanes are the host threads that carry stage spans or ops, its
ops drawn as grey boxes (`host op`). The x axis is the time from the start of the first step
drawn, in µs, ms or s by its span, as plain numbers (`time_axis`); the legend stands right of
the plot, in as many columns as keep it no taller (`fit_legend`); the title gives the bubble
figure of `mtplab analyze` (`timeline_title`). `plot_event_timeline` draws the same kind of
lanes from an mtplab event timeline (timeline.parquet). Every function returns the Figure and,
given `path`, saves it atomically as PNG / SVG / PDF by extension.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence, Union

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from ..atomic import atomic_path  # noqa: E402
from .bubbles import SYNC_CALLS, SYNC_OPS, Analysis, analyze_run, stage_of  # noqa: E402
from .causes import CAUSE_COLORS, CAUSES, cause_group  # noqa: E402
from .lanes import host_labels, stream_labels  # noqa: E402
from ..stages import STAGE_COLORS  # noqa: E402
from .trace_io import GPU_ACTIVITY_CATS, RUNTIME_CATS, Trace, load_trace  # noqa: E402

PathLike = Union[str, "os.PathLike[str]"]
ACTIVITY_COLORS = {"kernel": "#303030", "gpu_memcpy": "#4b4b9a", "gpu_memset": "#7a7a30"}
LEAD_COLORS = {"> 0 (ahead)": "#2ca02c", "<= 0 (GPU waited)": "#d62728"}
ALARM_COLOR = "#ff00ff"          # an acceptance alarm's stretch (event timeline)
HOST_OP_COLOR = "#404040"       # a CPU trace's ops (cpu_op) on its host lanes


def save_figure(fig: Figure, path: PathLike, dpi: int = 120) -> Path:
    """Save `fig` atomically; the format follows the extension (.png, .svg, .pdf)."""
    p = Path(path)
    fmt = p.suffix.lstrip(".").lower()
    if fmt not in ("png", "svg", "pdf"):
        raise ValueError(f"cannot save a plot as {p.name!r}: use a .png, .svg or .pdf file name")
    with atomic_path(p) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")
    return p


def plot_timeline(trace: Union[Trace, PathLike], result: Analysis | None = None, *,
                  steps: tuple[int, int] | None = None, path: PathLike | None = None,
                  width: float = 14.0, lanes: Sequence[str] | None = None,
                  stages: Sequence[str] | None = None, causes: Sequence[str] | None = None,
                  min_gap_us: float = 0.0) -> Figure:
    """The bubble timeline of steps `steps=(a, b)` (inclusive step numbers; default: all).

    Filters (notebook 05's widgets): `lanes` draws only these lane labels and `stages` only
    these stage spans (`timeline_choices` lists both), `causes` only the bubbles of these
    cause groups and `min_gap_us` only bubbles at least that long; the time axis and the
    title's figures stay those of the steps drawn.

    `result` is `analyze_run(trace)` (computed when not given: the warm-up rule of `mtplab
    analyze`, so the title's bubble figure is the one it prints). A CPU-only trace gives the host
    lanes alone (no bubbles). Raises ValueError when the step range selects nothing.
    """
    tr = trace if isinstance(trace, Trace) else load_trace(trace)
    res = result if result is not None else analyze_run(tr)
    device = res.summary.get("device")
    st = res.steps
    if steps is not None:
        a, b = steps
        st = st[(st["step"] >= a) & (st["step"] <= b)]
    if st.empty:
        raise ValueError(f"no analysed step in range {steps} (steps available: "
                         f"{res.steps['step'].min()}..{res.steps['step'].max()})")
    t0 = float(st["start_us"].iloc[0])
    t1 = float((st["start_us"] + st["dur_us"]).iloc[-1])
    t1 = t1 if t1 > t0 else t0 + 1.0
    in_win = (tr.ts < t1) & (tr.end > t0)
    act = tr.cat_mask(*GPU_ACTIVITY_CATS) & (tr.device == device)
    hosts, streams = _lane_labels(tr, device)
    if lanes is not None:
        hosts = {k: v for k, v in hosts.items() if v in lanes}
        streams = {k: v for k, v in streams.items() if v in lanes}
    lanes = list(hosts.values()) + list(streams.values())
    fig, ax = plt.subplots(figsize=(width, 1.0 + 0.6 * len(lanes)))
    eps = (t1 - t0) / (width * 400)  # about a quarter pixel: closer boxes are drawn as one
    y = {lane: len(lanes) - 1 - i for i, lane in enumerate(lanes)}  # first lane on top
    seen: set[str] = set()
    ua, rt = tr.cat_mask("user_annotation"), tr.cat_mask(*RUNTIME_CATS, "cpu_op")
    syncs = tr.name_mask(lambda n: n in SYNC_CALLS or n in SYNC_OPS)
    ops = tr.cat_mask("cpu_op") if device is None else np.zeros(len(tr), bool)
    for (pid, tid), label in hosts.items():
        lane_y = y[label]
        on = in_win & (tr.pid == pid) & (tr.tid == tid)
        _spans(ax, tr, on & ua, t0, lane_y + 0.05, eps, seen, stages)
        op_sel = np.flatnonzero(on & ops)       # a CPU trace: the thread's ops are its work
        if op_sel.size:
            ax.broken_barh(_boxes(tr.ts[op_sel] - t0, tr.dur[op_sel], eps), (lane_y - 0.4, 0.4),
                           facecolors=HOST_OP_COLOR)
            seen.add("cpu_op")
        steps_sel = np.flatnonzero(on & ua & tr.name_mask(lambda n: n.startswith("step[")
                                                          or n.startswith("ProfilerStep#")))
        ax.broken_barh(_boxes(tr.ts[steps_sel] - t0, tr.dur[steps_sel], 0.0), (lane_y - 0.45, 0.9),
                       facecolors="none", edgecolors="black", linewidth=0.6)
        sync_sel = np.flatnonzero(on & rt & syncs)
        if sync_sel.size:
            ax.broken_barh(_boxes(tr.ts[sync_sel] - t0, tr.dur[sync_sel], eps), (lane_y - 0.4, 0.4),
                           facecolors=STAGE_COLORS["sync"])
            seen.add("sync")
    gua = tr.cat_mask("gpu_user_annotation") & (tr.device == device) & in_win
    for s, label in streams.items():
        lane_y = y[label]
        _spans(ax, tr, gua & (tr.stream == s), t0, lane_y + 0.05, eps, seen, stages)
        for cat, color in ACTIVITY_COLORS.items():
            sel = np.flatnonzero(in_win & act & (tr.stream == s) & tr.cat_mask(cat))
            if sel.size:
                ax.broken_barh(_boxes(tr.ts[sel] - t0, np.maximum(tr.dur[sel], eps), eps),
                               (lane_y - 0.4, 0.4), facecolors=color)
                seen.add(cat)
    gaps = res.device_gaps
    gaps = gaps[(gaps["end_us"] > t0) & (gaps["start_us"] < t1) & (gaps["gap_us"] >= min_gap_us)]
    causes_drawn = []
    if streams and len(gaps):
        top = y[next(iter(streams.values()))] + 0.5
        lo = y[list(streams.values())[-1]] - 0.5
        group = cause_group(gaps["cause"])
        for c in (CAUSES if causes is None else [c for c in CAUSES if c in causes]):
            # one colour per cause, under the activity boxes
            g = gaps[group == c]
            if len(g):
                ax.broken_barh(_boxes(g["start_us"].to_numpy() - t0, g["gap_us"].to_numpy(), eps),
                               (lo, top - lo), facecolors=CAUSE_COLORS[c], alpha=0.3,
                               edgecolors="none", zorder=0.5)
                causes_drawn.append(c)
    leads_drawn = _launch_leads(ax, st, t0, len(lanes) - 0.55)
    every = max(1, -(-len(st) // 25))  # at most 25 step marks
    for row in st.iloc[::every].itertuples():
        ax.axvline(row.start_us - t0, color="black", linestyle=":", linewidth=0.6)
        ax.text(row.start_us - t0, len(lanes) - 0.45, f" {row.step}", fontsize=7, va="bottom")
    ax.set_yticks([y[lane] for lane in lanes], lanes)
    ax.set_ylim(-0.6, len(lanes) - 0.2)
    ax.set_xlim(0, t1 - t0)
    unit = time_axis(ax, t1 - t0)
    shown = [f">= {min_gap_us:g} µs"] if min_gap_us > 0 else []
    if causes is not None:
        shown.append("causes " + ", ".join(c for c in CAUSES if c in causes))
    ax.set_xlabel(f"{unit} from the start of step {int(st['step'].iloc[0])}"
                  + (f"; bubbles drawn: {', '.join(shown)}" if shown else ""))
    ax.set_title(f"{Path(tr.path).name}: {timeline_title(res, st)}", fontsize=9)
    handles = [Patch(color=STAGE_COLORS[s], label=s) for s in STAGE_COLORS if s in seen]
    handles += [Patch(color=c, label=k) for k, c in ACTIVITY_COLORS.items() if k in seen]
    handles += [Patch(color=HOST_OP_COLOR, label="host op")] if "cpu_op" in seen else []
    handles += [Patch(facecolor=CAUSE_COLORS[c], alpha=0.3, label=f"bubble: {c}")
                for c in causes_drawn]
    handles += [Patch(color=LEAD_COLORS[k], label=f"launch lead {k}") for k in leads_drawn]
    fit_legend(ax, handles)
    if path is not None:
        save_figure(fig, path)
    return fig


def _launch_leads(ax, st: pd.DataFrame, t0: float, y: float) -> list[str]:
    """Each step's launch lead as a bar at height `y` from the next step's forward launch to
    the step's last GPU work (the window end), green when the host ran ahead (> 0), red when
    the GPU waited; its value written beside it. -> the kinds drawn."""
    drawn = []
    for row in st.itertuples():
        lead = row.launch_lead_us
        if not np.isfinite(lead):
            continue
        end = row.start_us + row.dur_us - t0
        kind = "> 0 (ahead)" if lead > 0 else "<= 0 (GPU waited)"
        ax.plot([end - lead, end], [y, y], color=LEAD_COLORS[kind], linewidth=2.5,
                solid_capstyle="butt", zorder=3)
        ax.text(min(end, end - lead), y + 0.05, f"{lead:+.0f} µs", fontsize=6,
                color=LEAD_COLORS[kind], va="bottom")
        if kind not in drawn:
            drawn.append(kind)
    return drawn


def time_axis(ax, span_us: float) -> str:
    """Label the x axis (µs data) in the unit its span calls for -- µs below 2 ms, ms below
    2 s, else s -- as plain numbers (no offset, no 1eN multiplier); returns the unit."""
    unit, scale = (("µs", 1.0) if span_us < 2e3 else ("ms", 1e3) if span_us < 2e6
                   else ("s", 1e6))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v / scale:g}"))
    return unit


def fit_legend(ax, handles: list, fontsize: float = 7):
    """The legend right of `ax`, in as few columns as keep it no taller than the axes
    (None when there is nothing to list)."""
    if not handles:
        return None
    renderer = ax.figure.canvas.get_renderer()
    height = ax.get_window_extent(renderer).height
    for ncol in range(1, len(handles) + 1):
        leg = ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                        fontsize=fontsize, ncol=ncol, borderaxespad=0.3)
        if leg.get_window_extent(renderer).height <= height:
            break
    return leg


def _lane_labels(tr: Trace, device: int | None) -> tuple[dict, dict]:
    """({(pid, tid): label} of the host lanes, {stream: label} of the GPU lanes), top down."""
    act = tr.cat_mask(*GPU_ACTIVITY_CATS) & (tr.device == device)
    threads = _launch_threads(tr, act) if device is not None else _span_threads(tr)
    return host_labels(tr, threads), stream_labels(tr, device) if device is not None else {}


def timeline_choices(tr: Trace, res: Analysis) -> tuple[list[str], list[str]]:
    """(lane labels, stage names present) of `plot_timeline`'s drawing of `tr`, top down and
    in stage order: the options of its `lanes` and `stages` filters."""
    hosts, streams = _lane_labels(tr, res.summary.get("device"))
    named = tr.cat_mask("user_annotation", "gpu_user_annotation")
    present = {stage_of(tr.names[c]) for c in np.unique(tr.name[named]).tolist()}
    return [*hosts.values(), *streams.values()], [s for s in STAGE_COLORS if s in present]


def timeline_title(res: Analysis, st: pd.DataFrame) -> str:
    """What a timeline of the steps `st` (rows of `res.steps`) shows: the steps drawn and the
    bubble figure of `mtplab analyze` for the run (the same warm-up rule), and that of the
    steps drawn when they are not all of them."""
    sm = res.summary
    a, b = int(st["step"].iloc[0]), int(st["step"].iloc[-1])
    shown = f"{f'step {a}' if a == b else f'steps {a}–{b}'} of {len(res.steps)}"
    skipped = f" (first {sm['skip_steps']} skipped as warm-up)" if sm["skip_steps"] else ""
    if sm.get("device") is None:
        return (f"{shown}, host lanes only (CPU trace: host spans and ops; no GPU lanes, so "
                "no device bubbles)")
    run = f"bubble {sm['bubble_frac']:.1%} of device wall time{skipped}, coloured by cause"
    if sm.get("run_ahead_steps"):
        run += f"; run-ahead {sm['run_ahead_frac']:.0%} (launch lead p50 " \
               f"{sm['launch_lead_p50_us']:+.0f} µs)"
    if len(st) == len(res.steps):
        return f"{shown}: {run}"
    here = st["bubble_us"].sum() / max(st["dur_us"].sum(), 1e-12)
    return f"{shown}: bubble {here:.1%} in these; all {len(res.steps)}: {run}"


def _launch_threads(tr: Trace, act: np.ndarray) -> list[tuple[int, int]]:
    """(pid, tid) of host threads whose launch calls produced the activity in `act`, by tid."""
    corr = np.unique(tr.correlation[act & (tr.correlation >= 0)])
    rt = tr.cat_mask(*RUNTIME_CATS) & np.isin(tr.correlation, corr)
    pairs = {(int(p), int(t)) for p, t in zip(tr.pid[rt], tr.tid[rt])}
    return sorted(pairs, key=lambda pt: (pt[1], pt[0]))


def _span_threads(tr: Trace) -> list[tuple[int, int]]:
    """(pid, tid) of host threads holding stage or step spans or ops (the lanes of a CPU
    trace)."""
    named = tr.cat_mask("user_annotation") & tr.name_mask(
        lambda n: stage_of(n) is not None or n.startswith("step[") or n.startswith("ProfilerStep#"))
    named |= tr.cat_mask("cpu_op")
    pairs = {(int(p), int(t)) for p, t in zip(tr.pid[named], tr.tid[named])}
    return sorted(pairs, key=lambda pt: (pt[1], pt[0]))


def _boxes(start: np.ndarray, dur: np.ndarray, eps: float) -> list[tuple[float, float]]:
    """(x, width) boxes, merging boxes closer than `eps` (sub-pixel detail is not drawable)."""
    if start.size == 0:
        return []
    o = np.argsort(start, kind="stable")
    s, e = start[o], start[o] + dur[o]
    run = np.maximum.accumulate(e)
    new = np.ones(s.size, bool)
    new[1:] = s[1:] > run[:-1] + eps
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return list(zip(s[first].tolist(), (run[last] - s[first]).tolist()))


def _spans(ax, tr: Trace, mask: np.ndarray, t0: float, bottom: float, eps: float,
           seen: set[str], only: Sequence[str] | None = None) -> None:
    """Draw stage-named spans of `mask` (of the stages `only`, default all) in the band
    [bottom, bottom + 0.4], innermost on top."""
    idx = np.flatnonzero(mask)
    stage_by_code = np.array([stage_of(n) for n in tr.names], dtype=object)
    stages = stage_by_code[tr.name[idx]]
    by_stage: dict[str, np.ndarray] = {}
    for stage in set(stages.tolist()) - {None} - (set() if only is None else
                                                   set(STAGE_COLORS) - set(only)):
        by_stage[stage] = idx[stages == stage]
        seen.add(stage)
    # stages whose typical span is longer are drawn first, so nested (shorter) ones end up on top
    for stage in sorted(by_stage, key=lambda st: -float(np.median(tr.dur[by_stage[st]]))):
        sel = by_stage[stage]
        ax.broken_barh(_boxes(tr.ts[sel] - t0, tr.dur[sel], eps), (bottom, 0.4),
                       facecolors=STAGE_COLORS[stage], alpha=0.9)


def plot_bubble_fraction(df: pd.DataFrame, by: Union[str, Sequence[str]] = "config", *,
                         value: str = "bubble_frac", path: PathLike | None = None) -> Figure:
    """Bar chart of the mean of `value` per configuration (`by` columns), with ±1 std error bars.

    `df` is typically per-step rows (the `steps` table of several runs, concatenated with a
    configuration column) or one row per run.
    """
    cols = [by] if isinstance(by, str) else list(by)
    missing = [c for c in cols + [value] if c not in df.columns]
    if missing:
        raise ValueError(f"plot_bubble_fraction: columns {missing} are not in the table "
                         f"(columns: {list(df.columns)})")
    g = df.groupby(cols, sort=False)[value].agg(["mean", "std", "count"])
    labels = [", ".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in g.index]
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(g) + 2), 3.5))
    ax.bar(labels, g["mean"], yerr=g["std"].fillna(0.0), color="#1f77b4", capsize=3)
    ax.set_ylabel(value)
    ax.set_xlabel(", ".join(cols))
    ax.set_title(f"{value} by {', '.join(cols)} (mean ± std)", fontsize=9)
    ax.tick_params(axis="x", labelrotation=30)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_step_times(steps: pd.DataFrame, *, bins: int = 50, path: PathLike | None = None) -> Figure:
    """Histogram of step wall times (`dur_us`)."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(steps["dur_us"].to_numpy(), bins=bins, color="#1f77b4")
    ax.set_xlabel("step wall time dur_us (µs)")
    ax.set_ylabel("steps")
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_gap_lengths(gaps: pd.DataFrame, *, bins: int = 50, path: PathLike | None = None) -> Figure:
    """Histogram of device bubble lengths (`gap_us`), stacked by cause."""
    if "scope" in gaps.columns:
        gaps = gaps[gaps["scope"] == "device"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    group = cause_group(gaps["cause"])
    data = [gaps["gap_us"][group == c].to_numpy() for c in CAUSES]
    ax.hist(data, bins=bins, stacked=True, label=list(CAUSES),
            color=[CAUSE_COLORS[c] for c in CAUSES])
    ax.set_xlabel("bubble length gap_us (µs)")
    ax.set_ylabel("bubbles")
    ax.legend(fontsize=7)
    if path is not None:
        save_figure(fig, path)
    return fig


def plot_event_timeline(df: pd.DataFrame, *, steps: tuple[int, int] | None = None,
                        clock: str = "auto", path: PathLike | None = None,
                        width: float = 14.0, title: str | None = None,
                        unit: str | None = None,
                        alarms: Sequence[Sequence[int]] = ()) -> Figure:
    """Lanes from an mtplab event timeline (timeline.parquet; no profiler needed): one lane per
    `stream` label (`host`, `forward`, ...), stage spans coloured with `STAGE_COLORS`, step
    spans outlined and numbered at their start; the x `unit` (µs, ms, s; None: by the window's
    length; give one to compare figures). `clock`: `gpu` (CUDA event times), `host`
    (perf_counter) or `auto` (gpu when the timeline has GPU times, else host — a CPU run).
    Lanes are the y tick labels; the legend lists the stages drawn; the title names the steps
    shown (prefixed by `title`). `alarms`: [first, last] step stretches of an acceptance alarm
    (a run folder's health.json, `Engine.finish`), shaded across every lane and named in the
    legend."""
    if df.empty:
        raise ValueError("the event timeline is empty: nothing to draw")
    if clock == "auto":
        clock = "gpu" if df["gpu_start_us"].notna().any() else "host"
    n_all = df["step"].nunique()
    if steps is not None:
        df = df[(df["step"] >= steps[0]) & (df["step"] <= steps[1])]
        if df.empty:
            raise ValueError(f"steps {steps[0]}:{steps[1]} select nothing in the timeline")
    s0, s1 = (df[f"{clock}_start_us"], df[f"{clock}_end_us"])
    is_step = df["stage"].str.startswith("step[")
    # GPU times exist only for device-side lanes; host-lane spans use the host clock.
    if clock == "gpu":
        s0 = s0.where(df["stream"] != "host", np.nan)
    t0 = float(np.nanmin(s0))
    span = float(np.nanmax(s1.where(s0.notna()))) - t0
    if unit is None:
        unit = "µs" if span < 2e3 else "ms" if span < 2e6 else "s"
    scale = {"µs": 1.0, "ms": 1e3, "s": 1e6}[unit]
    s0, s1, t0 = s0 / scale, s1 / scale, t0 / scale
    lanes = sorted(df["stream"].unique(), key=lambda s: (s != "host", s))
    fig, ax = plt.subplots(figsize=(width, 1.2 + 0.7 * len(lanes)))
    drawn: set[str] = set()
    for y, lane in enumerate(lanes):
        sel = (df["stream"] == lane) & s0.notna()
        for stage in df.loc[sel & ~is_step, "stage"].unique():
            m = sel & ~is_step & (df["stage"] == stage)
            boxes = list(zip(s0[m] - t0, s1[m] - s0[m]))
            ax.broken_barh(boxes, (y - 0.35, 0.7), color=STAGE_COLORS.get(stage, "#cccccc"))
            drawn.add(stage)
        m = sel & is_step
        ax.broken_barh(list(zip(s0[m] - t0, s1[m] - s0[m])), (y - 0.45, 0.9),
                       facecolor="none", edgecolor="black", linewidth=0.6)
    marks = s0[is_step].groupby(df.loc[is_step, "step"]).min().dropna()
    if marks.empty:     # no step spans on the lanes drawn: each step's first span
        marks = s0.groupby(df["step"]).min().dropna()
    every = max(1, -(-len(marks) // 25))  # at most 25 step marks
    for step, start in marks.iloc[::every].items():
        ax.axvline(start - t0, color="black", linestyle=":", linewidth=0.6)
        ax.text(start - t0, -0.5, f" {step}", fontsize=7, va="bottom")
    ends = s1.groupby(df["step"]).max().dropna()
    alarmed = False
    for a, b in alarms:
        lo, hi = marks[(marks.index >= a) & (marks.index <= b)], ends[ends.index <= b]
        if len(lo) and len(hi):
            ax.axvspan(float(lo.min()) - t0, float(hi.max()) - t0, color=ALARM_COLOR, alpha=0.15,
                       zorder=0)
            alarmed = True
    ax.set_yticks(range(len(lanes)), labels=list(lanes))
    ax.set_xlim(0, span / scale)
    ax.set_ylim(len(lanes) - 0.5, -0.8)      # first lane on top, room for the step numbers
    ax.set_xlabel(f"{unit} ({clock} clock) from the start of step {int(df['step'].min())}")
    shown = (f"steps {int(df['step'].min())}–{int(df['step'].max())} of {n_all} "
             "(dotted lines: step starts)")
    ax.set_title(f"{title}: {shown}" if title else shown, fontsize=9)
    legend = [s for s in STAGE_COLORS if s in drawn] + sorted(drawn - set(STAGE_COLORS))
    handles = [Patch(color=STAGE_COLORS.get(s, "#cccccc"), label=s) for s in legend]
    if alarmed:
        handles.append(Patch(color=ALARM_COLOR, alpha=0.15, label="acceptance alarm"))
    fig.tight_layout()
    fit_legend(ax, handles)
    if path is not None:
        save_figure(fig, path)
    return fig
