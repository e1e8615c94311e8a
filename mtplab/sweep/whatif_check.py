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
    error            predicted / ratio - 1
    self_error       the model's step time of the baseline run over the measured one - 1
    judged           "within 10%" or "off" where the measured effect exceeds the noise
                     (|ratio - 1| > noise); "effect within noise" where it does not; the
                     effects' NO_VERDICT with one repeat a side
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import pandas as pd

from ..analysis.whatif import (WhatIfError, knob_whatifs, load_run, predicted_ratio,
                               self_error)
from ..zero_bubble import ZB_SUBKNOBS
from .effects import NO_VERDICT, arm_effects

VALUE = "meter_tok_per_s"          # throughput with every host delay counted (the predictor's)
GOAL = 0.10                        # |error| within 10% where the effect exceeds the noise
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


def validate(df: pd.DataFrame, pairs: Optional[Sequence[tuple[str, str]]] = None,
             goal: float = GOAL, label: Callable[[dict], str] = knob_label,
             sweep_dir: Optional[str | Path] = None) -> pd.DataFrame:
    """The validation table (module doc) of a results table; `label` names a row's arm
    (default `knob_label`), `pairs`: (arm, baseline) labels to compare (default: every
    ordered pair of one grid point whose difference the predictor replays); `sweep_dir`: where
    the sweep's folder is now, when it was moved since (a cell's run folder is then
    sweep_dir/traces/<cell_id>)."""
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
        want = pairs if pairs is not None else [(a, b) for b in labels for a in labels if a != b]
        todo = [(a, b, whatif_between(rep[b], rep[a])) for a, b in want
                if a in rep and b in rep]
        todo = [(a, b, w) for a, b, w in todo if w]
        if not todo:
            continue
        eff = arm_effects(g, "arm_key", [(a, b) for a, b, _ in todo], value=VALUE)
        where = _where(json.loads(point), g)
        for r, (a, b, w) in zip(eff.to_dict("records"), todo):
            base_dirs = g.loc[g["arm_key"] == b, "run_dir"].tolist()
            pred, selfe, why = _predict(base_dirs, w, models)
            ratio = r["ratio"]
            err = pred / ratio - 1.0 if ratio and pred == pred else math.nan
            if r["verdict"] == NO_VERDICT:
                judged = NO_VERDICT
            elif not abs(ratio - 1.0) > r["noise"]:
                judged = "effect within noise"
            elif err != err:
                judged = "not predicted"
            else:
                judged = f"within {goal:.0%}" if abs(err) <= goal else "off"
            rows.append({"where": where, "arm": a, "baseline": b, "whatif": w,
                         "predicted": pred, "ratio": ratio, "noise": r["noise"], "error": err,
                         "self_error": selfe, "judged": judged, "n": r["n"],
                         "n_base": r["n_base"], "note": why})
    return pd.DataFrame(rows, columns=_COLUMNS)


_COLUMNS = ["where", "arm", "baseline", "whatif", "predicted", "ratio", "noise", "error",
            "self_error", "judged", "n", "n_base", "note"]


def _where(point: dict, g: pd.DataFrame) -> str:
    keep = ("model", "layers", "batch_size", "prompt_len_tokens", "draft")
    parts = [f"{'bs' if k == 'batch_size' else 'prompt' if k == 'prompt_len_tokens' else k}="
             f"{point[k]}" for k in keep if k in point and point[k] is not None]
    return " ".join(parts) or "all"


def _predict(dirs: list, whatif: str, cache: dict) -> tuple[float, float, str]:
    """Median predicted ratio and self-error over the baseline's run folders."""
    preds, selfs, why = [], [], ""
    for d in dirs:
        if not isinstance(d, str):
            continue
        try:
            m = cache.get(d)
            if m is None:
                m = cache[d] = load_run(Path(d))
            preds.append(predicted_ratio(m, whatif))
            selfs.append(self_error(m))
        except WhatIfError as e:
            why = str(e)
    med = lambda xs: float(pd.Series(xs).median()) if xs else math.nan
    return med(preds), med(selfs), why


def summary(v: pd.DataFrame, goal: float = GOAL) -> str:
    """One line: of the rows whose measured effect exceeds the noise, how many the predictor
    got within the goal, and the largest error."""
    judged = v[v["judged"].isin([f"within {goal:.0%}", "off"])]
    if judged.empty:
        return (f"no measured effect exceeds the noise in {len(v)} compared pairs; nothing to "
                "judge the predictor on.")
    within = (judged["judged"] != "off").sum()
    worst = judged.loc[judged["error"].abs().idxmax()]
    return (f"{within} of {len(judged)} predicted ratios within {goal:.0%} of the measured "
            f"where the effect exceeds the noise (largest error {worst['error']:+.1%}: "
            f"{worst['whatif']} at {worst['where']}); {len(v) - len(judged)} pairs within the "
            "noise or unjudged.")


def table_md(v: pd.DataFrame) -> str:
    """The validation table as markdown."""
    head = ["where", "arm", "baseline", "what-if", "predicted", "measured", "noise", "error",
            "self error", "judged"]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    f = lambda x, spec: "-" if x != x else format(x, spec)
    for r in v.to_dict("records"):
        out.append("| " + " | ".join([
            r["where"], r["arm"], r["baseline"], r["whatif"], f(r["predicted"], ".3f"),
            f(r["ratio"], ".3f"), f"±{r['noise']:.1%}", f(r["error"], "+.1%"),
            f(r["self_error"], "+.1%"), r["judged"]]) + " |")
    return "\n".join(out)
