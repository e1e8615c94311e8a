"""The what-if predictor against measured runs (analysis/whatif.py): for every two arms of
one grid point that differ only in what the predictor replays (overlap, the zero-bubble
sub-knobs, fold_seed, a host delay planted after every step), the tok/s ratio it predicts
from the baseline's run beside the ratio measured, with the error.

    v = validate(results)            # a sweep's results table: cells with step_profile
    v[["where", "arm", "baseline", "whatif", "predicted", "ratio", "noise", "error", "judged"]]

    arm / baseline   the loop settings of each side (`knob_label`)
    whatif           the what-if that turns the baseline into the arm (whatif.knob_whatifs;
                     a planted delay d: host:loop+d)
    predicted        median over the baseline's repeats of the predicted ratio (each repeat's
                     run folder replayed)
    ratio, noise     measured: median meter_tok_per_s of the arm / the baseline's (decode
                     tokens over the meter's decode-step wall: host time between iterations
                     counts, as in the replay), and the repeats' spread (sweep/effects.py
                     arm_effects: the same rule as notebooks 01-04)
    direction        the knob the what-if flips and which way ("zero_bubble on"), or
                     "several knobs"; with `flips`, every arm of a grid point is compared
                     with each arm one knob away, both ways (`flip_between`), and
                     `by_direction` / `direction_md` give the error per direction
    error            predicted / ratio - 1
    self_error       the model's step time of the baseline run over the measured one - 1
    judged           "within 10%" or "off" where the measured effect exceeds the noise
                     (|ratio - 1| > noise); "effect within noise" where it does not; the
                     effects' NO_VERDICT with one repeat a side
    host_speed       how many times slower the arm's host ran than the baseline's (median
                     over the repeats; whatif.host_speed: their process_result times)
    error_at_speed   the error of the prediction replayed at the arm's host speed
                     (`host:all*F` on the baseline before the what-if, a planted delay kept
                     out of the scaling): what is left once the two cells' host speeds are
                     taken out. `judged` stays the goal's verdict; `judged_at_speed` the same
                     rule on this error
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pandas as pd

from ...analysis.whatif import (ALL, WhatIfError, host_speed, knob_whatifs, load_run,
                               predicted_ratio, replay, self_error)
from ...zero_bubble import ZB_SUBKNOBS
from ..effects import NO_VERDICT, arm_effects

VALUE = "meter_tok_per_s"          # throughput with every host delay counted (the predictor's)
GOAL = 0.10                        # |error| within 10% where the effect exceeds the noise
SEVERAL = "several knobs"          # the direction of a what-if of more than one knob
KNOB_COLUMNS = ("cfg.overlap", *(f"cfg.{k}" for k in ZB_SUBKNOBS), "cfg.fold_seed",
                "host_delay_us")
# settings that pick an arm, not a grid point (zero_bubble resolves to the sub-knobs)
ARM_SETTINGS = ("overlap", "zero_bubble", *ZB_SUBKNOBS, "fold_seed", "host_delay_us", "repeat")
SHORT = {"cfg.overlap": "ov", **{f"cfg.{k}": s.short for k, s in ZB_SUBKNOBS.items()},
         "cfg.fold_seed": "fold", "host_delay_us": "delay"}


def knob_label(row: dict) -> str:
    """'ov=1 async=1 dsl=0 pre=0 fold=1 delay=0': the loop settings of one results row."""
    return " ".join(f"{SHORT[c]}={_int(row.get(c))}" for c in KNOB_COLUMNS)


def _int(v: Any) -> int:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return 0
    return int(v)


def point_key(settings_json: str) -> str:
    """A cell's grid point: its written settings without those that pick an arm."""
    s = json.loads(settings_json)
    return json.dumps({k: v for k, v in s.items() if k not in ARM_SETTINGS}, sort_keys=True)


def whatif_between(base: dict, arm: dict) -> Optional[str]:
    """The what-if turning the baseline row's loop into the arm row's (None: not one the
    predictor replays)."""
    diff = {c.removeprefix("cfg."): (base.get(c), arm.get(c)) for c in KNOB_COLUMNS[:-1]
            if bool(_int(base.get(c))) != bool(_int(arm.get(c)))}
    parts = [knob_whatifs(diff)] if diff else []
    if None in parts:
        return None
    d = _int(arm.get("host_delay_us")) - _int(base.get("host_delay_us"))
    if d:
        parts.append(f"host:loop{'+' if d > 0 else '-'}{abs(d)}")
    return ",".join(parts) or None


def flip_between(base: dict, arm: dict) -> Optional[str]:
    """The one knob that turns the baseline row's loop into the arm row's, as a what-if: one
    knob column flipped (overlap, a sub-knob, fold_seed), `zero_bubble=on|off` (every
    sub-knob the row's draft can use from its default to on, or back), or a planted delay;
    None where the rows differ in more than one of these, or in none."""
    draft = base.get("cfg.draft") or "none"
    cols = [c for c in KNOB_COLUMNS[:-1] if not (
        draft == "none" and c.removeprefix("cfg.") in ZB_SUBKNOBS
        and ZB_SUBKNOBS[c.removeprefix("cfg.")].owner == "worker")]
    diff = [c for c in cols if bool(_int(base.get(c))) != bool(_int(arm.get(c)))]
    d = _int(arm.get("host_delay_us")) - _int(base.get("host_delay_us"))
    if d:
        return None if diff else f"host:loop{'+' if d > 0 else '-'}{abs(d)}"
    subs = [c for c in cols if c.removeprefix("cfg.") in ZB_SUBKNOBS]
    on = lambda r: all(bool(_int(r.get(c))) for c in subs)                   # noqa: E731
    default = lambda r: all(bool(_int(r.get(c))) == ZB_SUBKNOBS[c.removeprefix(  # noqa: E731
        "cfg.")].auto for c in subs)
    if diff and all(c in subs for c in diff):
        if on(arm) and default(base):
            return "zero_bubble=on"
        if on(base) and default(arm):
            return "zero_bubble=off"
    return whatif_between(base, arm) if len(diff) == 1 else None


def validate(df: pd.DataFrame, pairs: Optional[Sequence[tuple[str, str]]] = None,
             goal: float = GOAL, label: Callable[[dict], str] = knob_label,
             sweep_dir: Optional[str | Path] = None, flips: bool = False) -> pd.DataFrame:
    """The validation table (module doc) of a results table; `label` names a row's arm
    (default `knob_label`), `pairs`: (arm, baseline) labels to compare (default: every
    ordered pair of one grid point whose difference the predictor replays); `flips`: also
    every ordered pair of one grid point one knob apart (`flip_between`: from each arm to
    each knob it can flip, both directions), as that one knob; `sweep_dir`: where the
    sweep's folder is now, when it was moved since (a cell's run folder is then
    sweep_dir/traces/<cell_id>). `direction` names the knob a row flips and which way
    (`by_direction` sums the errors per direction)."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        return pd.DataFrame(columns=_COLUMNS)
    if sweep_dir is not None:
        moved = [str(Path(sweep_dir) / "traces" / c) for c in ok["cell_id"]]
        ok["run_dir"] = [d if isinstance(d, str) and Path(d).is_dir() else m
                         for d, m in zip(ok["run_dir"], moved)]
    ok["arm_key"] = [label(r) for r in ok.to_dict("records")]
    ok["point"] = [point_key(s) for s in ok["settings_json"]]
    models: dict[str, Any] = {}
    rows = []
    for point, g in ok.groupby("point", sort=False):
        labels = list(dict.fromkeys(g["arm_key"]))
        rep = {k: g[g["arm_key"] == k].iloc[0].to_dict() for k in labels}
        every = [(a, b) for b in labels for a in labels if a != b]
        want = pairs if pairs is not None else every
        todo = {(a, b): whatif_between(rep[b], rep[a]) for a, b in want
                if a in rep and b in rep}
        if flips:
            todo.update({(a, b): flip_between(rep[b], rep[a]) for a, b in every
                         if flip_between(rep[b], rep[a])})
        todo = [(a, b, w) for (a, b), w in todo.items() if w]
        if not todo:
            continue
        eff = arm_effects(g, "arm_key", [(a, b) for a, b, _ in todo], value=VALUE)
        where = _where(json.loads(point), g)
        for r, (a, b, w) in zip(eff.to_dict("records"), todo):
            runs = _pairs(g[g["arm_key"] == b], g[g["arm_key"] == a])
            pred, selfe, why = _predict([d for d, _, _ in runs], w, models)
            speed, pred_s = _predict_at_speed(runs, w, models)
            ratio = r["ratio"]
            err = pred / ratio - 1.0 if ratio and pred == pred else math.nan
            err_s = pred_s / ratio - 1.0 if ratio and pred_s == pred_s else math.nan
            rows.append({"where": where, "arm": a, "baseline": b, "whatif": w,
                         "direction": _direction(w),
                         "predicted": pred, "ratio": ratio, "noise": r["noise"], "error": err,
                         "self_error": selfe, "judged": _judge(r, err, goal), "n": r["n"],
                         "n_base": r["n_base"], "note": why, "host_speed": speed,
                         "error_at_speed": err_s, "judged_at_speed": _judge(r, err_s, goal)})
    return pd.DataFrame(rows, columns=_COLUMNS)


_COLUMNS = ["where", "arm", "baseline", "whatif", "direction", "predicted", "ratio", "noise",
            "error", "self_error", "judged", "n", "n_base", "note", "host_speed",
            "error_at_speed", "judged_at_speed"]


def _direction(whatif: str) -> str:
    """A row's direction: the knob it flips and which way ("overlap on", "zb_async_d2h off",
    "host delay +"), or "several knobs" for a what-if of more than one."""
    if "," in whatif:
        return SEVERAL
    if whatif.startswith("host:loop"):
        return f"host delay {whatif[len('host:loop')]}"
    return whatif.replace("=", " ")


def by_direction(v: pd.DataFrame, goal: float = GOAL) -> pd.DataFrame:
    """Per direction (knob and way): pairs compared, pairs judged (effect beyond the noise),
    within the goal, the median |error| and the largest error over the judged ones (over
    all pairs where none is judged), and the same error replayed at the arm's host speed."""
    cols = ["direction", "pairs", "judged", "within", "median_abs_error", "worst_error",
            "worst_where", "median_abs_error_at_speed"]
    rows = []
    for d, g in v.groupby("direction", sort=True):
        j = g[g["judged"].isin([f"within {goal:.0%}", "off"])]
        src = j if len(j) else g
        e = src["error"].dropna()
        worst = src.loc[e.abs().idxmax()] if len(e) else None
        rows.append({"direction": d, "pairs": len(g), "judged": len(j),
                     "within": int((j["judged"] != "off").sum()),
                     "median_abs_error": float(e.abs().median()) if len(e) else math.nan,
                     "worst_error": float(worst["error"]) if worst is not None else math.nan,
                     "worst_where": f"{worst['where']} from {worst['baseline']}"
                     if worst is not None else "",
                     "median_abs_error_at_speed": float(src["error_at_speed"].dropna().abs()
                                                        .median())
                     if src["error_at_speed"].notna().any() else math.nan})
    return pd.DataFrame(rows, columns=cols)


def direction_md(v: pd.DataFrame, goal: float = GOAL) -> str:
    """`by_direction` as markdown: the predictor's error per knob and way."""
    t = by_direction(v, goal)
    f = lambda x, spec: "-" if x != x else format(x, spec)                   # noqa: E731
    out = ["| direction | pairs | judged | within 10% | median abs error | largest error "
           "| where | median abs error at speed |", "|---" * 8 + "|"]
    for r in t.to_dict("records"):
        out.append(f"| {r['direction']} | {r['pairs']} | {r['judged']} | {r['within']} | "
                   f"{f(r['median_abs_error'], '.1%')} | {f(r['worst_error'], '+.1%')} | "
                   f"{r['worst_where']} | {f(r['median_abs_error_at_speed'], '.1%')} |")
    return "\n".join(out)


def _judge(effect: dict, err: float, goal: float) -> str:
    if effect["verdict"] == NO_VERDICT:
        return NO_VERDICT
    if not abs(effect["ratio"] - 1.0) > effect["noise"]:
        return "effect within noise"
    if err != err:
        return "not predicted"
    return f"within {goal:.0%}" if abs(err) <= goal else "off"


def _pairs(base: pd.DataFrame, arm: pd.DataFrame) -> list[tuple]:
    """(baseline run folder, the arm's run folder of the same repeat or None, the baseline's
    planted delay in µs) per baseline cell: a repeat's cells ran next to each other."""
    rep = lambda row: json.loads(row["settings_json"]).get("repeat")       # noqa: E731
    arm_by = {rep(r): r["run_dir"] for r in arm.to_dict("records")}
    return [(r["run_dir"], arm_by.get(rep(r)), _int(r.get("host_delay_us")))
            for r in base.to_dict("records")]


def _model(d: Any, cache: dict):
    """A run folder's model, loaded once (None for a cell without one)."""
    if not isinstance(d, str):
        return None
    m = cache.get(d)
    if m is None:
        m = cache[d] = load_run(Path(d))
    return m


def _base_us(d: str, m, cache: dict) -> float:
    """The run's replayed period, replayed once: every prediction from it divides by it."""
    k = ("replayed", d)
    if k not in cache:
        cache[k] = replay(m).period_us
    return cache[k]


def speed_whatif(f: float, delay_us: int = 0) -> str:
    """The what-if that puts a run on a host f times slower, its planted delay (a spin of
    fixed length) left as it is."""
    scale = f"host:{ALL}*{f:.6g}"
    return f"host:loop-{delay_us},{scale},host:loop+{delay_us}" if delay_us else scale


def _where(point: dict, g: pd.DataFrame) -> str:
    keep = ("model", "layers", "batch_size", "prompt_len_tokens", "draft")
    parts = [f"{'bs' if k == 'batch_size' else 'prompt' if k == 'prompt_len_tokens' else k}="
             f"{point[k]}" for k in keep if k in point and point[k] is not None]
    return " ".join(parts) or "all"


def _predict(dirs: list, whatif: str, cache: dict) -> tuple[float, float, str]:
    """Median predicted ratio and self-error over the baseline's run folders."""
    preds, selfs, why = [], [], ""
    for d in dirs:
        try:
            m = _model(d, cache)
            if m is None:
                continue
            base_us = _base_us(d, m, cache)
            preds.append(predicted_ratio(m, whatif, base_us))
            selfs.append(self_error(m, base_us))
        except WhatIfError as e:
            why = str(e)
    return _median(preds), _median(selfs), why


def _predict_at_speed(runs: list, whatif: str, cache: dict) -> tuple[float, float]:
    """Median host speed (arm / baseline) and predicted ratio with each baseline replayed at
    its repeat's arm host speed (NaN where no repeat has both runs and a process_result)."""
    speeds, preds = [], []
    for base_dir, arm_dir, delay in runs:
        try:
            base, arm = _model(base_dir, cache), _model(arm_dir, cache)
            if base is None or arm is None:
                continue
            f = host_speed(arm, base)
            if f != f:
                continue
            preds.append(predicted_ratio(base, f"{speed_whatif(f, delay)},{whatif}",
                                         _base_us(base_dir, base, cache)))
            speeds.append(f)
        except WhatIfError:
            continue
    return _median(speeds), _median(preds)


def _median(xs: list) -> float:
    return float(pd.Series(xs).median()) if xs else math.nan


def summary(v: pd.DataFrame, goal: float = GOAL) -> str:
    """One line: of the rows whose measured effect exceeds the noise, how many the predictor
    got within the goal, and the largest error."""
    judged = v[v["judged"].isin([f"within {goal:.0%}", "off"])]
    if judged.empty:
        return (f"no measured effect exceeds the noise in {len(v)} compared pairs; nothing to "
                "judge the predictor on.")
    within = (judged["judged"] != "off").sum()
    worst = judged.loc[judged["error"].abs().idxmax()]
    line = (f"{within} of {len(judged)} predicted ratios within {goal:.0%} of the measured "
            f"where the effect exceeds the noise (largest error {worst['error']:+.1%}: "
            f"{worst['whatif']} at {worst['where']}); {len(v) - len(judged)} pairs within the "
            "noise or unjudged.")
    at = judged[judged["judged_at_speed"].isin([f"within {goal:.0%}", "off"])] \
        if "judged_at_speed" in judged else judged.iloc[:0]
    if at.empty:
        return line
    within_s = (at["judged_at_speed"] != "off").sum()
    return (line + f" Replayed at the arm's host speed: {within_s} of {len(at)} within "
            f"{goal:.0%} (host speed, arm / baseline, {at['host_speed'].min():.2f}x .. "
            f"{at['host_speed'].max():.2f}x).")


def table_md(v: pd.DataFrame) -> str:
    """The validation table as markdown."""
    head = ["where", "arm", "baseline", "what-if", "predicted", "measured", "noise", "error",
            "self error", "judged", "host speed", "error at speed"]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    f = lambda x, spec: "-" if x != x else format(x, spec)                   # noqa: E731
    for r in v.to_dict("records"):
        out.append("| " + " | ".join([
            r["where"], r["arm"], r["baseline"], r["whatif"], f(r["predicted"], ".3f"),
            f(r["ratio"], ".3f"), f"±{r['noise']:.1%}", f(r["error"], "+.1%"),
            f(r["self_error"], "+.1%"), r["judged"], f(r.get("host_speed", math.nan), ".2f"),
            f(r.get("error_at_speed", math.nan), "+.1%")]) + " |")
    return "\n".join(out)
