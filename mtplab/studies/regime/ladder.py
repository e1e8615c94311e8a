"""The regime map: what each scheduling idea buys at each rung of a ladder of GPU time per
step (`mtplab bench --groups regime`, notebook 08_regime_map).

    t = regime_table(results)          # one row per rung and effect
    crossovers(t)                      # per effect: where it stops (or starts) paying
    plot_regime(t, path="regime.png")  # x = GPU / host time per step, y = the tok/s ratios

A rung is one (model, layers, batch size, prompt length) grid point. Per rung, each effect
compares two arms (`EFFECTS`: an arm against its baseline, both named by `arm_label`) with
studies/effects.py's rule: the median `meter_tok_per_s` ratio (decode tokens over the meter's
decode-step wall, so host time between iterations counts) against the repeats' spread. The
rung's position, one for all its effects, is its reference arm's (`REFERENCE`: target-only
under overlap + zero_bubble, the loop whose host never waits on the device; an effect's own
baseline where the rung has no such arm)

    x = GPU time per step / host time per step
      = the meter's device busy per decode step (wall - bubble)
        / the host's own time per decode step (the median step's iteration less its waits:
          the step profile's host_busy_p50_us_per_step, sweep/step_profile.py)

so x < 1: the host is the longer of the two (host-bound), x > 1: the GPU is. A crossover is
where, between two neighbouring rungs in x, an effect changes side (interpolated in log x,
`crossovers`): its ratio crosses 1 from beyond the noise to beyond it, or fades into the
noise: where speculation stops paying, or where a planted host delay stops costing.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pandas as pd

from ...draft_kinds import DRAFT_KINDS
from ...zero_bubble import ZB_SUBKNOBS
from ..effects import NO_VERDICT, arm_effects

VALUE = "meter_tok_per_s"
TARGET = "target"
REFERENCE = "target zb"            # the arm that places a rung on the x axis (module doc)
HOST_P50 = "host_busy_p50_us_per_step"
# (effect, arm, baseline): arm labels of `arm_label`
EFFECTS = (
    ("overlap (target)", "target on", "target off"),
    ("zero_bubble (target)", "target zb", "target on"),
    ("overlap + zero_bubble (target)", "target zb", "target off"),
    ("1 ms host delay (target, overlap + zb)", "target zb +1ms", "target zb"),
    ("overlap (frozen)", "frozen_kv_mtp on", "frozen_kv_mtp off"),
    ("zero_bubble (frozen)", "frozen_kv_mtp zb", "frozen_kv_mtp on"),
    ("overlap + zero_bubble (frozen)", "frozen_kv_mtp zb", "frozen_kv_mtp off"),
    *((f"{k} (frozen)", "frozen_kv_mtp zb", f"frozen_kv_mtp zb-{k}") for k in ZB_SUBKNOBS),
    ("fold_seed (frozen)", "frozen_kv_mtp zb", "frozen_kv_mtp zb unfolded"),
    ("zero_bubble (frozen, unfolded)", "frozen_kv_mtp zb unfolded", "frozen_kv_mtp on unfolded"),
    ("speculation: frozen_kv_mtp", "frozen_kv_mtp zb", "target zb"),
    ("speculation: eagle", "eagle zb", "target zb"),
)
SUBS = tuple(ZB_SUBKNOBS)
COLUMNS = ["rung", "effect", "arm", "baseline", "x", "gpu_us", "host_us", "bubble", "ratio",
           "noise", "verdict", "n", "n_base", "tok_s", "tok_s_base"]


def _on(v: Any) -> bool:
    return bool(v) and not (isinstance(v, float) and math.isnan(v))


def arm_label(r: dict) -> str:
    """A results row's arm: '<draft> <loop>[ unfolded][ +Nms]', the draft `target` for none;
    loop `off` (overlap off), `on` (overlap, the sub-knobs at their defaults), `zb` (all
    three on), `zb-<sub-knob>` (all but that one), else the sub-knobs spelled out."""
    draft = r.get("cfg.draft") or "none"
    on = {k: _on(r.get(f"cfg.{k}")) for k in SUBS}
    if draft == "none":                          # a worker sub-knob has nothing to act on:
        on.update({k: True for k, s in ZB_SUBKNOBS.items() if s.owner == "worker"})  # no choice
    off = [k for k in SUBS if not on[k]]
    default = [k for k, s in ZB_SUBKNOBS.items()          # off under plain overlap
               if not s.auto and (draft != "none" or s.owner != "worker")]
    if not _on(r.get("cfg.overlap")):
        loop = "off"
    elif not off:
        loop = "zb"
    elif off == default:
        loop = "on"
    elif len(off) == 1:
        loop = f"zb-{off[0]}"
    else:
        loop = "on " + " ".join(f"{k}={int(on[k])}" for k in SUBS)
    label = f"{TARGET if draft == 'none' else draft} {loop}"
    kind = DRAFT_KINDS.get(draft)
    if kind is not None and kind.seed_forward and not _on(r.get("cfg.fold_seed")):
        label += " unfolded"
    d = r.get("host_delay_us") or 0
    if d and d == d:
        label += f" +{d / 1000:g}ms"
    return label


def validation_pairs(effects=EFFECTS) -> list[tuple[str, str]]:
    """The (arm, baseline) pairs of the effects, each both ways: what the what-if predictor
    is checked on (studies/whatif/check.py validate, with `arm_label`)."""
    out = []
    for _, a, b in effects:
        out += [(a, b), (b, a)]
    return list(dict.fromkeys(out))


def rung_label(r: dict) -> str:
    model = str(r.get("cfg.model"))
    layers = r.get("cfg.layers")
    if layers is not None and layers == layers and not model.endswith(f"@{int(layers)}"):
        model += f"@{int(layers)}"            # a preset's resolved name carries its depth
    return f"{model} bs{int(r['batch_size'])} p{int(r['prompt_len_tokens'])}"


def host_p50(ok: pd.DataFrame, sweep_dir: Optional[str | Path] = None) -> pd.Series:
    """Each row's host_busy_p50_us_per_step, read from its run folder's host table where the
    results row has none (rows recorded before the column existed); `sweep_dir`: where the
    sweep's folder is now, when it was moved since (whatif_check.validate's rule)."""
    from ...sweep.step_profile import run_host_figures
    have = ok[HOST_P50] if HOST_P50 in ok else pd.Series(math.nan, index=ok.index)
    dirs = ok["run_dir"] if "run_dir" in ok else pd.Series(None, index=ok.index)
    if sweep_dir is not None:
        dirs = pd.Series([d if isinstance(d, str) and Path(d).is_dir() else
                          str(Path(sweep_dir) / "traces" / c)
                          for d, c in zip(dirs, ok["cell_id"])], index=ok.index)
    return pd.Series([v if v == v else run_host_figures(d).get(HOST_P50, math.nan)
                      if isinstance(d, str) else math.nan
                      for v, d in zip(have, dirs)], index=ok.index, dtype=float)


def regime_table(df: pd.DataFrame, effects=EFFECTS,
                 sweep_dir: Optional[str | Path] = None) -> pd.DataFrame:
    """One row per rung and effect present (module doc); `sweep_dir` as in `host_p50`."""
    ok = df[df["status"] == "ok"].copy() if "status" in df else df.copy()
    if ok.empty:
        return pd.DataFrame(columns=COLUMNS)
    recs = ok.to_dict("records")
    ok["arm"] = [arm_label(r) for r in recs]
    ok["rung"] = [rung_label(r) for r in recs]
    ok["gpu_us"] = ok["meter_wall_us_per_step"] - ok["bubble_us_per_step"]
    ok["host_us"] = host_p50(ok, sweep_dir)
    pairs = [(a, b) for _, a, b in effects]
    eff = arm_effects(ok, "arm", pairs, by=["rung"], value=VALUE)
    name = {(a, b): e for e, a, b in effects}
    rows = []
    for r in eff.to_dict("records"):
        ref = ok[(ok["rung"] == r["rung"]) & (ok["arm"] == REFERENCE)]
        if ref.empty:
            ref = ok[(ok["rung"] == r["rung"]) & (ok["arm"] == r["baseline"])]
        gpu, host = _med(ref["gpu_us"]), _med(ref["host_us"])
        rows.append({"rung": r["rung"], "effect": name[(r["arm"], r["baseline"])],
                     "arm": r["arm"], "baseline": r["baseline"],
                     "x": gpu / host if host and host == host else math.nan,
                     "gpu_us": gpu, "host_us": host, "bubble": r["bubble_base"],
                     "ratio": r["ratio"], "noise": r["noise"], "verdict": r["verdict"],
                     "n": r["n"], "n_base": r["n_base"], "tok_s": r["tok_s"],
                     "tok_s_base": r["tok_s_base"]})
    t = pd.DataFrame(rows, columns=COLUMNS)
    order = {e: i for i, (e, _, _) in enumerate(effects)}
    return t.sort_values(["effect", "x"], key=lambda c: c.map(order) if c.name == "effect"
                         else c).reset_index(drop=True)


def _med(xs) -> float:
    xs = pd.to_numeric(pd.Series(xs), errors="coerce").dropna()
    return float(xs.median()) if len(xs) else math.nan


SIDE = {"faster": 1, "slower": -1, "nothing": 0}    # a row's verdict (studies/effects.py)


def _side(ratio: float, noise: float) -> int:
    """+1: pays beyond the noise, -1: costs beyond it, 0: within it (a row of one repeat,
    against the noise floor; a row with a verdict takes its side from it)."""
    d = ratio - 1.0
    return 0 if not abs(d) > noise else (1 if d > 0 else -1)


def crossovers(t: pd.DataFrame) -> pd.DataFrame:
    """Per effect, the first change between rungs neighbouring in x (interpolated in log x),
    the rungs on either side, and in words where it pays:

        pays | costs beyond the noise on both sides   where the ratio crosses 1
        beyond the noise on one side only            where |ratio - 1| meets that side's noise
                                                     (the effect fades into the noise)

    A rung of one repeat is judged against the noise floor; the sentence counts them."""
    rows = []
    for effect, g in t.groupby("effect", sort=False):
        g = g.dropna(subset=["x", "ratio"]).sort_values("x")
        if g.empty:
            continue
        xs, rs, ns = g["x"].to_numpy(), g["ratio"].to_numpy(), g["noise"].to_numpy()
        sides = [SIDE.get(v, _side(r, n)) for r, n, v in zip(rs, ns, g["verdict"])]
        cross, lo, hi, kind = math.nan, None, None, ""
        for i in range(len(g) - 1):
            a, b = sides[i], sides[i + 1]
            if a == b:
                continue
            if a and b:                                  # pays on one side, costs on the other
                level, kind = 1.0, "crosses 1"
            else:                                        # into (or out of) the noise
                s = a or b
                level, kind = 1.0 + s * ns[i if a else i + 1], "fades into the noise"
                if not a:
                    kind = "comes out of the noise"
            da, db = rs[i] - level, rs[i + 1] - level
            f = min(1.0, max(0.0, da / (da - db))) if da != db else 0.0
            cross = float(np.exp(np.log(xs[i]) + f * (np.log(xs[i + 1]) - np.log(xs[i]))))
            lo, hi = g["rung"].iloc[i], g["rung"].iloc[i + 1]
            below, above = ("pays" if a > 0 else "costs" if a < 0 else "is within the noise",
                            "pays" if b > 0 else "costs" if b < 0 else "is within the noise")
            words = (f"{effect}: {kind} at x = {cross:.2f} (between {lo} and {hi}): it "
                     f"{below} below and {above} above")
            break
        else:
            what = {1: "pays", -1: "costs", 0: "is within the noise"}
            words = (f"{effect}: no crossover over x = {xs.min():.2f} .. {xs.max():.2f} "
                     f"(ratio {rs.min():.2f} .. {rs.max():.2f})"
                     + (f": it {what[sides[0]]} at every rung" if len(set(sides)) == 1 else ""))
        pays = [r for r, s in zip(g["rung"], sides) if s > 0]
        costs = [r for r, s in zip(g["rung"], sides) if s < 0]
        words += (f"; beyond the noise it pays at {', '.join(pays) or 'no rung'}"
                  + (f" and costs at {', '.join(costs)}" if costs else ""))
        if (g["verdict"] == NO_VERDICT).any():
            words += (f" ({(g['verdict'] == NO_VERDICT).sum()} rung(s) of one repeat, judged "
                      "against the noise floor)")
        rows.append({"effect": effect, "x_cross": cross, "below": lo, "above": hi,
                     "kind": kind, "sentence": words})
    return pd.DataFrame(rows, columns=["effect", "x_cross", "below", "above", "kind",
                                       "sentence"])


def plot_regime(t: pd.DataFrame, *, path: Optional[str | Path] = None, title: str = "",
                meter: str = "meter"):
    """x = GPU time / host time per step (log), y = the tok/s ratio of each effect (log),
    error bars the repeats' spread, the balance x = 1, and each effect's crossover
    (`crossovers`) marked X on its own curve in its colour; `meter` as sweep/metrics.py
    meter_name names it (on CPU cells the busy time is stage time)."""
    busy = "GPU" if meter == "meter" else "stage"
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from ...analysis.plots import save_figure

    fig, ax = plt.subplots(figsize=(9.5, 5.2), layout="constrained")
    cmap = plt.get_cmap("tab20")
    cross = crossovers(t).set_index("effect")["x_cross"] if len(t) else pd.Series(dtype=float)
    for i, (effect, g) in enumerate(t.groupby("effect", sort=False)):
        g = g.dropna(subset=["x", "ratio"]).sort_values("x")
        if g.empty:
            continue
        style = "-" if "speculation" in effect else "--" if "frozen" in effect else ":"
        color = cmap(i % 20)
        ax.errorbar(g["x"], g["ratio"], yerr=(g["noise"] * g["ratio"]).where(
            g["verdict"] != NO_VERDICT), fmt="o" + style, ms=4, capsize=2, lw=1.2,
            color=color, label=effect)
        xc = cross.get(effect, math.nan)
        if xc == xc:
            yc = float(np.exp(np.interp(np.log(xc), np.log(g["x"]), np.log(g["ratio"]))))
            ax.plot([xc], [yc], marker="X", ms=9, color=color, mec="black", mew=0.6,
                    zorder=5)
            ax.annotate(f"x={xc:.1f}", (xc, yc), textcoords="offset points", xytext=(5, 4),
                        fontsize=7, color=color)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axvline(1.0, color="0.4", lw=1.0, ls="--")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.tick_params(axis="y", which="minor", labelsize=7)
    ax.text(1.0, ax.get_ylim()[1], f" {busy} time = host time", va="top", fontsize=8,
            color="0.3")
    ax.set_xlabel(f"{busy} time per step ({meter}) / host time per step (the rung's "
                  f"{REFERENCE} arm; < 1 host-bound)")
    ax.set_ylabel(f"tok/s ratio vs baseline ({VALUE}, log)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_title(title or "regime map: what each idea buys, host-bound to GPU-bound (X: where "
                 "it crosses 1 or fades into the noise)", fontsize=10)
    if path is not None:
        save_figure(fig, path)
    return fig


def table_md(t: pd.DataFrame, meter: str = "meter") -> str:
    """The regime table as markdown, rungs in x order within each effect (x, GPU and host
    time: the rung's reference arm; bubble: the effect's baseline); `meter` names the meter
    (`meter, host clock` on CPU cells: sweep/metrics.py meter_name)."""
    busy = "GPU" if meter == "meter" else "stage"
    head = ["effect", "rung", f"x = {busy}/host", f"{busy} µs/step ({meter})",
            "host µs/step (p50)", "bubble (baseline)", "ratio", "noise", "verdict", "n"]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    def f(v, s):
        return "-" if v != v else format(v, s)

    for r in t.to_dict("records"):
        out.append("| " + " | ".join([
            r["effect"], r["rung"], f(r["x"], ".2f"), f(r["gpu_us"], ".0f"),
            f(r["host_us"], ".0f"), f(r["bubble"], ".1%"), f(r["ratio"], ".3f"),
            f"±{r['noise']:.1%}", str(r["verdict"]), f"{r['n']}/{r['n_base']}"]) + " |")
    return "\n".join(out)


def answer(t: pd.DataFrame, cross: pd.DataFrame) -> dict[str, Any]:
    """answer.json scalars of notebook 08: the crossover of each effect (x and the rungs on
    either side), the x range the map spans, and the sentences."""
    ans: dict[str, Any] = {"x_min": float(t["x"].min()) if len(t) else None,
                           "x_max": float(t["x"].max()) if len(t) else None}
    for r in cross.to_dict("records"):
        key = "".join(ch if ch.isalnum() else "_" for ch in r["effect"]).strip("_")
        ans[f"{key}.x_cross"] = r["x_cross"]
        ans[f"{key}.between"] = None if r["below"] is None else f"{r['below']} / {r['above']}"
    ans["crossovers"] = "\n".join(cross["sentence"])
    return ans
