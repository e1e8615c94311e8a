"""Figures of a sweep's results table (used by the notebooks; matplotlib).

    df = load_results("traces/sweeps/x")              # folder or results.parquet
    bars(df, x="batch_size", value="tok_per_s", hue=["cfg.overlap"])
    heatmap(df, x="cfg.page_size", y="cfg.topk", value="accept_len")
    timelines(df, label_cols=["cfg.overlap"])         # one figure per row, one time scale
    standard_figures(df, out_dir=...)                 # the report of notebook 06
    meter_labels(df[cols], df["cfg.device"])          # a notebook's table, the meter named
    out = notebook_out("traces/notebooks/00")         # a notebook's out_dir, from the repo root
    write_answer(out_dir, {...})                      # a notebook's answer -> answer.json

Every function draws the rows with status ok only. Bubble timelines: the Kineto trace on a
GPU (`plot_timeline`), the event timeline's host spans otherwise (`plot_event_timeline`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib.colors as mcolors

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..atomic import atomic_write_json, strict_json
from ..analysis.bubbles import analyze
from ..analysis.plots import plot_event_timeline, plot_timeline, save_figure
from ..sweep.metrics import meter_name
from ..sweep.results import text, varying
from ..sweep.runner import RESULTS_PARQUET

Cols = str | Sequence[str] | None
STANDARD_METRICS = ("tok_per_s", "tpot_p50_ms", "itl_p99_ms", "decode_step_time_p50_ms",
                    "accept_len", "bubble_frac")
REPO_ROOT = Path(__file__).resolve().parents[2]


# Notebook tables show every column, unwrapped (pandas' defaults elide the middle columns of
# a wide table and wrap its text form at 80 characters).
TABLE_DISPLAY = {"display.max_columns": None, "display.width": None,
                 "display.max_colwidth": 120}


def notebook_out(out_dir: str | Path) -> Path:
    """A notebook's output folder, created: an absolute `out_dir` as given, a relative one
    under the repository root of this checkout whatever the working directory (papermill runs
    a kernel in the caller's folder unless given --cwd), or under the working directory when
    mtplab is installed outside a checkout. Every notebook opens with it, so it also sets
    pandas' display options for the notebook's tables (TABLE_DISPLAY)."""
    for key, value in TABLE_DISPLAY.items():
        pd.set_option(key, value)
    p = Path(out_dir).expanduser()
    if not p.is_absolute():
        root = REPO_ROOT if (REPO_ROOT / "pyproject.toml").is_file() else Path.cwd()
        p = root / p
    p.mkdir(parents=True, exist_ok=True)
    return p


def load_results(path: str | Path) -> pd.DataFrame:
    p = Path(path)
    return pd.read_parquet(p / RESULTS_PARQUET if p.is_dir() else p)


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def label(df: pd.DataFrame, cols: Cols) -> pd.Series:
    """'overlap=True, page_size=16' per row (the cfg. prefix dropped)."""
    cols = _list(cols)
    if not cols:
        return pd.Series(["all"] * len(df), index=df.index)
    return df[cols].astype(str).apply(
        lambda r: ", ".join(f"{c.removeprefix('cfg.')}={v}" for c, v in r.items()), axis=1)


def _list(cols: Cols) -> list[str]:
    return [] if cols is None else [cols] if isinstance(cols, str) else list(cols)


def bars(df: pd.DataFrame, x: str, value: str, hue: Cols = None, *,
         ax: Axes | None = None, empty_note: str = "") -> Axes:
    """Grouped bars: mean of `value` per `x`, one bar colour per `hue` combination. Bars and
    colours keep the rows' order (the first arm, usually the baseline, comes first); the
    legend's title names the hue settings and its entries list their values. A chart with
    no bar to draw (every mean 0 or missing) says so in the plot, with `empty_note` (why)."""
    hue = _list(hue)
    ok = ok_rows(df)
    ok = ok.assign(_hue=ok[hue].map(text).agg(", ".join, axis=1) if hue else "all")
    table = ok.pivot_table(index=x, columns="_hue", values=value, aggfunc="mean",
                           dropna=False, sort=False)
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(table) + 2), 3.2), layout="constrained")
    table.plot.bar(ax=ax, rot=0, legend=table.shape[1] > 1)
    ax.set_xlabel(x.removeprefix("cfg."))
    ax.set_ylabel(value if value != "bubble_frac" or "cfg.device" not in ok else
                  f"bubble_frac ({meter_name(ok['cfg.device'])})")
    if table.shape[1] > 1:
        ax.legend(fontsize=7, title=", ".join(c.removeprefix("cfg.") for c in hue),
                  title_fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(f"{ax.get_ylabel()} by {x.removeprefix('cfg.')}", fontsize=9)
    vals = table.to_numpy(dtype=float)
    if not (np.isfinite(vals) & (vals != 0)).any():
        what = "0" if np.isfinite(vals).any() else "not measured"
        ax.text(0.5, 0.5, f"no bar to draw: {value} is {what} in every cell"
                + (f"\n{empty_note}" if empty_note else ""), transform=ax.transAxes,
                ha="center", va="center", fontsize=8, wrap=True)
    return ax


def heatmap(df: pd.DataFrame, x: str, y: str, value: str, *, ax: Axes | None = None,
            fmt: str = "{:.3g}", cmap: str = "viridis") -> Axes:
    """Mean of `value` on the (x, y) grid, each cell annotated (blank where NaN)."""
    table = ok_rows(df).pivot_table(index=y, columns=x, values=value, aggfunc="mean",
                                    dropna=False)
    if ax is None:
        _, ax = plt.subplots(figsize=(1.1 * table.shape[1] + 2.5, 0.8 * table.shape[0] + 1.8),
                             layout="constrained")
    data = table.to_numpy(dtype=float)
    im = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, aspect="auto")
    ax.figure.colorbar(im, ax=ax, label=value)   # first: it widens a flat norm (one value)
    face = im.to_rgba(np.nan_to_num(data))        # each cell's RGBA as drawn
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns])
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index])
    ax.set_xlabel(x.removeprefix("cfg."))
    ax.set_ylabel(y.removeprefix("cfg."))
    for (i, j), v in np.ndenumerate(data):
        if not math.isnan(v):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=8,
                    color=label_color(face[i, j]))
    ax.set_title(value, fontsize=9)
    return ax


def label_color(rgba) -> str:
    """Black on light cells, white on dark ones (WCAG relative luminance of the cell colour)."""
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
               for c in mcolors.to_rgb(rgba))
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.179 else "white"


def timelines(df: pd.DataFrame, label_cols: Cols = None, *, n_steps: int = 4,
              out_dir: str | Path | None = None) -> list[Figure]:
    """One bubble timeline per ok row, `n_steps` measured decode steps each, all on one x
    scale (the longest window), so the arms can be compared by eye. Saved as
    `<out_dir>/timeline_<cell_id>.png` when out_dir is given."""
    ok = ok_rows(df)
    names = label(ok, label_cols)
    figs = [_timeline(row, n_steps) for row in ok.itertuples(index=False)]
    width = max((f.axes[0].get_xlim()[1] for f in figs), default=1.0)
    for fig, name, cid in zip(figs, names, ok["cell_id"]):
        ax = fig.axes[0]
        ax.set_xlim(0, width)
        ax.set_title(f"{name}  ({cid})", fontsize=9)
        if out_dir is not None:
            save_figure(fig, Path(out_dir) / f"timeline_{cid}.png")
    return figs


def _timeline(row, n_steps: int) -> Figure:
    trace = getattr(row, "trace_path", None)
    if isinstance(trace, str) and trace:
        skip = int(row.trace_skip_steps)
        res = analyze(trace, skip_steps=skip)
        if res.summary.get("device") is not None:
            dec = res.steps[res.steps["name"].str.startswith("step[decode")]["step"]
            a = int(dec.iloc[min(1, len(dec) - 1)])
            return plot_timeline(trace, res, steps=(a, a + n_steps - 1))
    tl = pd.read_parquet(row.timeline_path)
    first = int(row.timeline_first_step)
    dec = sorted(tl.loc[(tl["step"] >= first) & tl["stage"].str.startswith("step[decode"),
                        "step"].unique())
    a = int(dec[min(1, len(dec) - 1)])
    return plot_event_timeline(tl, steps=(a, a + n_steps - 1), unit="ms")   # one x scale


def standard_figures(df: pd.DataFrame, out_dir: str | Path | None = None,
                     metrics: Sequence[str] = STANDARD_METRICS) -> dict[str, Figure]:
    """For each metric with data: bars over the first varying setting (batch_size when it
    varies), one colour per combination of the other varying settings."""
    axes = varying(df)
    x = "batch_size" if "batch_size" in axes else (axes[0] if axes else "batch_size")
    hue = [c for c in axes if c != x]
    ok = ok_rows(df)
    figs = {}
    for m in metrics:
        if m not in ok.columns or ok[m].isna().all():
            continue
        ax = bars(ok, x, m, hue)
        figs[m] = ax.figure
        if out_dir is not None:
            save_figure(ax.figure, Path(out_dir) / f"{m}.png")
    return figs


METER_COLUMNS = ("bubble_frac", "bubble_us_per_step")       # the bubble meter's figures


def meter_labels(table: pd.DataFrame, devices) -> pd.DataFrame:
    """`table` (a notebook's view of result rows) with the bubble meter's columns named as
    every header names them, for cells run on `devices` (their `cfg.device` column):
    `bubble_frac (meter, host clock)` on CPU, `bubble_frac (meter)` on a GPU
    (metrics.meter_name)."""
    name = meter_name(devices)
    return table.rename(columns={c: f"{c} ({name})" for c in METER_COLUMNS
                                 if c in table.columns})


def write_answer(out_dir: str | Path, answer: dict) -> Path:
    """Print a notebook's answer and write it to `<out_dir>/answer.json` (a notebook sweep
    turns its scalars into `nb.<key>` columns). The file is strict JSON: a missing value
    (NaN, infinity, pandas NA) is null, numpy scalars are plain numbers."""
    clean = strict_json(answer, _plain)
    for k, v in clean.items():
        print(f"{k}: {v}")
    return atomic_write_json(Path(out_dir) / "answer.json", clean)


def _plain(v):
    """numpy scalars as Python ones, pandas' missing values as None."""
    if isinstance(v, np.generic):
        return v.item()
    return None if v is pd.NA or v is pd.NaT else v
