"""What each arm of a sweep buys against its baseline, with the repeats' spread as the noise
(the answers of notebooks 01, 02 and 04).

    cells = repeated_cells(base, arms, axes, repeats=3, probe={"profile": True})
    df = run_sweep(cells, out / "sweep")
    eff = arm_effects(df, "arm", [("overlap", "off"), ("zero-bubble", "overlap")],
                      by=["batch_size"])
    print("\\n".join(eff["sentence"]))        # one sentence per arm and grid point
    plot_effects(eff, path=out / "effects.png")
    answer.update(effect_answer(eff))

Repeats (`repeated_cells`): round r runs every grid point and arm before round r + 1, so the
arms interleave (A B C, A B C, as `mtplab bench` does) and a drift of the machine lands on
every arm alike. Round 0 alone carries the `probe` settings (the profiler; CUDA's sync debug
mode): its cells give the where/why views (profiled bubble causes, launches, sync sites,
timelines), the later rounds are timed runs without them. The profiler never runs during the
timed generate (sweep/measure.py), so every round's tok/s counts; a probe that does slow the
timed generate (`debug_syncs`) is left out of the tok/s figures by the notebook.

Per arm and baseline at one grid point (the `by` columns), over ok rows:
    n, n_base               repeats of each
    tok_s, tok_s_base       median `value` (default decode tok/s)
    ratio                   tok_s / tok_s_base
    noise                   the repeats' spread, as a fraction: the larger of the two arms'
                            (max - min) / median, at least `min_noise` (2%); one repeat
                            measures no spread, so then it is `min_noise` alone
    bubble, bubble_base     median bubble fraction of the bubble meter (the headline
                            `bubble_frac`, unprofiled)
    meter                   `meter`, or on CPU cells `meter, host clock` (metrics.meter_name:
                            there the meter stamps the host clock; sentences and figures say so)
    bubble_pts              100 * (bubble - bubble_base): negative = fewer idle points
    bubble_noise_pts        the same spread rule in points, at least `min_bubble_noise_pts`
    busy_us, busy_us_base   device busy time per decode step by the meter (step wall time
                            minus bubble), median
    verdict                 (`ratio_verdict`, also `mtplab bench`'s tables)
                            "faster" or "slower" when |ratio - 1| > noise, else "nothing";
                            NO_VERDICT when either side ran one repeat (no spread measured:
                            the floor alone would judge the arm, so nothing is judged)
    clocks                  of the two arms' cells without a planted host delay, the decode
                            tok/s on the host clock over the meter's farthest from 1
                            (`clock_ratios`; GPU cells only); beyond CLOCKS_LIMIT either way
                            the sentence calls the ratio suspect: the host's steps and the
                            GPU's disagree, as when the host reads results the GPU has not
                            written yet
    sentence                the numbers in one sentence; for "nothing" also why, from the
                            numbers: the bubble did not move, or it moved and the device busy
                            time took its place, or the baseline had little bubble to remove;
                            for NO_VERDICT the numbers and "no verdict: one repeat"
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from ..sweep.metrics import meter_name

MIN_NOISE = 0.02              # a tok/s ratio within 2% of 1 is never called a gain
MIN_BUBBLE_NOISE_PTS = 1.0    # nor a bubble change under 1 point
LOW_BUBBLE = 0.05             # a baseline bubble under 5%: little idle time left to remove
WIDE_NOISE = 0.10             # rounds that disagree by more than 10% cannot tell a change
SHORT = {"batch_size": "bs", "cfg.cuda_graphs": "cuda_graphs"}
NO_VERDICT = "no verdict: one repeat"     # a verdict needs the spread of two rounds a side
CLOCKS_LIMIT = 1.25          # host-clock decode tok/s vs the meter's: agree within this (both
                             # read the same decode steps; 1.00-1.10x in every sound GPU cell)


def repeated_cells(base: dict[str, Any], arms: list[dict[str, Any]], axes: dict[str, list],
                   repeats: int = 1, probe: dict[str, Any] | None = None) -> list:
    """The cells of base x axes x arms, `repeats` rounds of them, round 0 with `probe` added
    (see the module doc). Each round's cells differ by the workload's `repeat` index."""
    from ..sweep.grid import grid_from_dict

    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}.")
    cells = []
    for r in range(repeats):
        settings = {**base, **((probe or {}) if r == 0 else {}), "repeat": r}
        cells += grid_from_dict({"base": settings, "arms": arms, "grid": axes}).cells()
    return cells


def _spread(xs: pd.Series) -> float:
    xs = xs.dropna()
    if len(xs) < 2:
        return 0.0
    med = float(xs.median())
    return float(xs.max() - xs.min()) / abs(med) if med else 0.0


def ratio_verdict(values: Sequence[float], base: Sequence[float],
                  min_noise: float = MIN_NOISE) -> tuple[str, float]:
    """(verdict, noise) of the median of `values` over the median of `base`, repeats of one
    arm and its baseline: noise is the larger spread ((max - min) / median) of the two, at
    least `min_noise`; the verdict "faster" / "slower" when the ratio is beyond 1 ± noise,
    "nothing" within it, NO_VERDICT when either side ran one repeat (no spread measured)."""
    a, b = pd.Series(values, dtype=float).dropna(), pd.Series(base, dtype=float).dropna()
    noise = max(min_noise, _spread(a), _spread(b))
    if min(len(a), len(b)) < 2:
        return NO_VERDICT, noise
    d = float(a.median()) / float(b.median()) - 1.0 if float(b.median()) else math.nan
    return ("nothing" if not abs(d) > noise else "faster" if d > 0 else "slower"), noise


def _spread_pts(xs: pd.Series) -> float:
    xs = xs.dropna()
    return 100.0 * float(xs.max() - xs.min()) if len(xs) >= 2 else 0.0


def _med(rows: pd.DataFrame, col: str) -> float:
    if col not in rows:
        return math.nan
    xs = pd.to_numeric(rows[col], errors="coerce").dropna()
    return float(xs.median()) if len(xs) else math.nan


def clock_ratios(rows: pd.DataFrame) -> pd.Series:
    """Per ok row run on a GPU without a planted host delay: decode tok/s on the host clock
    over the meter's (the meter counts the delay, the host clock's steps do not: those rows
    differ by design). A CPU row has no GPU whose results the host could read early (its
    meter stamps the host clock too): left out. Empty where a column is missing."""
    if "decode_tok_per_s" not in rows or "meter_tok_per_s" not in rows:
        return pd.Series(dtype=float)
    ok = rows[rows["status"] == "ok"] if "status" in rows else rows
    if "cfg.device" in ok:
        ok = ok[~ok["cfg.device"].astype(str).str.startswith("cpu")]
    if "host_delay_us" in ok:
        ok = ok[~(pd.to_numeric(ok["host_delay_us"], errors="coerce").fillna(0) > 0)]
    r = pd.to_numeric(ok["decode_tok_per_s"], errors="coerce") / \
        pd.to_numeric(ok["meter_tok_per_s"], errors="coerce")
    return r[r > 0]


def _farthest(r: pd.Series) -> float:
    """The ratio farthest from 1 (either way), NaN if none."""
    return float(r.loc[(r.apply(math.log)).abs().idxmax()]) if len(r) else math.nan


def suspect(ratio: float, limit: float = CLOCKS_LIMIT) -> bool:
    return ratio == ratio and not 1.0 / limit <= ratio <= limit


def where_label(point: dict[str, Any]) -> str:
    """'bs 8, cuda_graphs=True' for a grid point ('all' for none)."""
    parts = []
    for k, v in point.items():
        name = SHORT.get(k, k.removeprefix("cfg."))
        parts.append(f"bs {v}" if name == "bs" else f"{name}={v}")
    return ", ".join(parts) or "all"


def arm_effects(df: pd.DataFrame, arm: str, pairs: Sequence[tuple[str, str]], *,
                by: Sequence[str] = (), value: str = "decode_tok_per_s",
                bubble: str = "bubble_frac", extra: Sequence[str] = (),
                min_noise: float = MIN_NOISE,
                min_bubble_noise_pts: float = MIN_BUBBLE_NOISE_PTS) -> pd.DataFrame:
    """One row per grid point (`by`) and (arm, baseline) pair of `pairs`, values of the `arm`
    column: what the arm buys (see the module doc). `extra` columns get their medians for both
    sides (`<col>` and `<col>_base`)."""
    ok = df[df["status"] == "ok"] if "status" in df else df
    by = list(by)
    groups = ok.groupby(by, sort=False) if by else [((), ok)]
    rows = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        point = dict(zip(by, key))
        for a, b in pairs:
            ra, rb = g[g[arm] == a], g[g[arm] == b]
            if ra.empty or rb.empty:
                continue
            t, tb = _med(ra, value), _med(rb, value)
            row: dict[str, Any] = {**point, "where": where_label(point), "arm": a, "baseline": b,
                                   "n": int(ra[value].notna().sum()),
                                   "n_base": int(rb[value].notna().sum()),
                                   "tok_s": t, "tok_s_base": tb,
                                   "ratio": t / tb if tb else math.nan,
                                   "noise": max(min_noise, _spread(ra[value]), _spread(rb[value])),
                                   "bubble": _med(ra, bubble), "bubble_base": _med(rb, bubble)}
            row["meter"] = meter_name(g["cfg.device"]) if "cfg.device" in g else "meter"
            row["bubble_pts"] = 100.0 * (row["bubble"] - row["bubble_base"])
            row["bubble_noise_pts"] = max(
                min_bubble_noise_pts,
                *(_spread_pts(r[bubble]) if bubble in r else 0.0 for r in (ra, rb)))
            for side, r in (("", ra), ("_base", rb)):
                if "meter_wall_us_per_step" in r and "bubble_us_per_step" in r:
                    busy = r["meter_wall_us_per_step"] - r["bubble_us_per_step"]
                    row[f"busy_us{side}"] = _med(busy.to_frame("b"), "b")
                else:
                    row[f"busy_us{side}"] = math.nan
            for c in extra:
                row[c], row[f"{c}_base"] = _med(ra, c), _med(rb, c)
            row["clocks"] = _farthest(clock_ratios(pd.concat([ra, rb])))
            row["verdict"] = ratio_verdict(pd.to_numeric(ra[value], errors="coerce"),
                                           pd.to_numeric(rb[value], errors="coerce"),
                                           min_noise)[0]
            row["sentence"] = sentence(row, value)
            rows.append(row)
    cols = [*by, "where", "arm", "baseline", "verdict", "ratio", "noise", "tok_s", "tok_s_base",
            "n", "n_base", "bubble", "bubble_base", "meter", "bubble_pts", "bubble_noise_pts",
            "busy_us",
            "busy_us_base", *[c for x in extra for c in (x, f"{x}_base")], "clocks", "sentence"]
    return pd.DataFrame(rows, columns=cols)


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:.1f}%"


def sentence(r: dict[str, Any], value: str = "decode_tok_per_s") -> str:
    """The row's answer in words, with its numbers (see arm_effects)."""
    unit = "decode tok/s" if value == "decode_tok_per_s" else value
    reps = f"n={r['n']}/{r['n_base']}"
    spread = (f"noise ±{r['noise']:.1%}" if max(r["n"], r["n_base"]) > 1
              else f"one repeat: no spread measured, noise floor ±{r['noise']:.1%}")
    tok = f"{r['ratio']:.3f}x {unit} ({r['tok_s']:.4g} vs {r['tok_s_base']:.4g}; {spread}, {reps})"
    what = "bubble" if r.get("meter", "meter") == "meter" else f"bubble ({r['meter']})"
    bub = (f"{what} {_pct(r['bubble_base'])} -> {_pct(r['bubble'])} "
           f"({r['bubble_pts']:+.1f} pts, noise ±{r['bubble_noise_pts']:.1f})")
    head = f"{r['where']}: {r['arm']} vs {r['baseline']}"
    if r["verdict"] == NO_VERDICT:
        text = f"{head}: {NO_VERDICT} ({tok}; {bub}); run repeats >= 2 for a verdict."
    elif r["verdict"] == "faster":
        text = f"{head} buys {tok}; {bub}."
    elif r["verdict"] == "slower":
        text = f"{head} costs: {tok}; {bub}."
    else:
        text = f"{head} buys nothing: {tok} is within the noise; {bub}: {_why(r)}."
    c = r.get("clocks", math.nan)
    if suspect(c):
        text += (f" Suspect: in these cells decode tok/s on the host clock is {c:.2f}x the "
                 f"meter's (they agree within {CLOCKS_LIMIT}x when the host waits for the "
                 "GPU), as when the host reads results the GPU has not written yet.")
    return text


def _why(r: dict[str, Any]) -> str:
    """Why an arm whose tok/s did not move buys nothing, from its numbers."""
    why = []
    # on CPU the meter reads the host clock: its busy time is time inside stages, not a device's
    gpu = r.get("meter", "meter") == "meter"
    work, idle = ("device", "device is idle") if gpu else \
        ("stage", "step is outside every stage (host clock)")
    busy, busy_b = r.get("busy_us", math.nan), r.get("busy_us_base", math.nan)
    busy_txt = ("" if busy != busy or busy_b != busy_b
                else f" ({work} busy per decode step {busy_b:.0f} -> {busy:.0f} us)")
    if r["noise"] > WIDE_NOISE:
        why.append(f"the rounds disagree by up to {r['noise']:.0%}, too widely to tell a "
                   "change (more rounds or longer generates would narrow that)")
    if r["bubble_base"] == r["bubble_base"] and r["bubble_base"] < LOW_BUBBLE:
        why.append(f"the baseline's {idle} only {_pct(r['bubble_base'])} of the step, "
                   "so there is little idle time to remove")
    if r["bubble_pts"] != r["bubble_pts"]:
        why.append("no meter bubble to compare")
    elif abs(r["bubble_pts"]) <= r["bubble_noise_pts"]:
        why.append("the idle share of the step did not change either" + busy_txt)
    elif r["bubble_pts"] < 0 and busy == busy and busy_b == busy_b and busy > busy_b:
        why.append(f"it removes {-r['bubble_pts']:.1f} idle points, but {work} work took their "
                   "place, so the step is no shorter" + busy_txt)
    elif r["bubble_pts"] < 0:
        why.append(f"it removes {-r['bubble_pts']:.1f} idle points, a change too small to show "
                   "in tok/s beyond the noise" + busy_txt)
    else:
        why.append(f"the idle share grew by {r['bubble_pts']:.1f} points" + busy_txt)
    return "; ".join(why)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", s).strip("_")


def effect_answer(eff: pd.DataFrame) -> dict[str, Any]:
    """Scalars for answer.json (a notebook sweep's `nb.<key>` columns): per row
    `<where>.<arm>_vs_<baseline>.{tok_s_ratio, noise, bubble_pts, buys}`, and `summary`, the
    sentences joined."""
    ans: dict[str, Any] = {}
    for r in eff.to_dict("records"):
        where = _slug(r["where"].replace("bs ", "bs"))
        k = f"{where}.{_slug(r['arm'])}_vs_{_slug(r['baseline'])}"
        ans[f"{k}.tok_s_ratio"] = r["ratio"]
        ans[f"{k}.noise"] = r["noise"]
        ans[f"{k}.bubble_pts"] = r["bubble_pts"]
        ans[f"{k}.buys"] = r["verdict"]
    ans["summary"] = "\n".join(eff["sentence"])
    return ans


def plot_effects(eff: pd.DataFrame, *, path: str | Path | None = None, title: str = ""):
    """Two panels per grid point: the tok/s change vs the baseline (%, error bar = noise, the
    grey band the noise floor) and the meter bubble change (points, error bar = its noise);
    one bar colour per (arm vs baseline). Returns the figure (saved when `path` is given)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from ..analysis.plots import save_figure

    pairs = list(dict.fromkeys(f"{a} vs {b}" for a, b in zip(eff["arm"], eff["baseline"])))
    wheres = list(dict.fromkeys(eff["where"]))
    fig, axs = plt.subplots(1, 2, figsize=(max(9.0, 1.6 * len(wheres) * 2 + 3), 3.6),
                            layout="constrained")
    width = 0.8 / max(1, len(pairs))
    x = np.arange(len(wheres))
    for i, p in enumerate(pairs):
        sel = eff[[f"{a} vs {b}" == p for a, b in zip(eff["arm"], eff["baseline"])]]
        pos = [wheres.index(w) for w in sel["where"]]
        off = x[pos] + (i - (len(pairs) - 1) / 2) * width
        measured = sel["verdict"] != NO_VERDICT       # one repeat: no noise to draw
        bars = axs[0].bar(off, 100 * (sel["ratio"] - 1), width,
                          yerr=(100 * sel["noise"]).where(measured), capsize=3, label=p)
        axs[0].bar_label(bars, [f"{x:.2f}x" + {"nothing": " (=)", NO_VERDICT: " (?)"}.get(v, "")
                                for x, v in zip(sel["ratio"], sel["verdict"])],
                         fontsize=6, padding=2)
        axs[1].bar(off, sel["bubble_pts"], width,
                   yerr=sel["bubble_noise_pts"].where(measured), capsize=3, label=p)
    axs[0].axhspan(-100 * MIN_NOISE, 100 * MIN_NOISE, color="0.85", zorder=0)
    meter = "; ".join(dict.fromkeys(eff["meter"])) if "meter" in eff else "meter"
    for ax, ylabel in zip(axs, ("decode tok/s vs baseline (%)",
                                f"bubble ({meter}) vs baseline (points)")):
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(x, wheres, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
    axs[0].set_title("tok/s gain\n(=): within the noise, (?): one repeat, no verdict",
                     fontsize=9)
    axs[1].set_title("bubble change\n< 0: less idle", fontsize=9)
    axs[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    one = (eff["verdict"] == NO_VERDICT).all()
    what = (f"one repeat: no noise measured, no verdict; grey band: the ±{MIN_NOISE:.0%} floor"
            if one else f"error bars: the rounds' spread, at least the ±{MIN_NOISE:.0%} floor "
            "(grey band); none on one-repeat bars")
    fig.suptitle(f"{title}{' ' if title else ''}({what})", fontsize=10)
    if path is not None:
        save_figure(fig, path)
    return fig
