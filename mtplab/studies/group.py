"""The dated report of a `mtplab bench` group: each arm against the group's first arm at every
grid point, decode tok/s ratio with its noise and verdict (the studies whose question one bench
group answers: drafts, overlap, fold_seed, page_topk, ...).

    doc = results_doc(question, results, sweep_dir=DIR/<group>, command=..., date=...)
    render(doc)       # the Markdown report (results.py names, writes and indexes it)

The results file keeps one row per ok cell: its grid point, arm, repeat, decode tok/s and the
meter's bubble fraction; the report computes every ratio from them (studies/effects.py, the
median over the interleaved repeats against their spread).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from . import QUESTIONS
from . import reports as R

VALUE, BUBBLE = "decode_tok_per_s", "bubble_frac"
WORDS = {"faster": R.PAYS, "slower": R.COSTS, "nothing": R.NOISE}


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def results_doc(question: str, results: pd.DataFrame, *, sweep_dir: str, command: str,
                date: str, device: Optional[str] = None, note: str = "") -> dict:
    """A report's results from a bench group's folder (`mtplab bench --dir D` writes
    D/<group>/results.parquet and the grid it ran, grid.yaml): the stamp (the cells' device
    and commit: one commit, a clean tree) and one row per ok cell."""
    import yaml

    from ..errors import ConfigError
    from .bench import REPEAT, _cells, arm_label
    grid = Path(sweep_dir) / "grid.yaml"
    if not grid.is_file():
        raise ConfigError(f"{grid} does not exist: --from takes a bench group's folder "
                          "(mtplab bench --dir D writes D/<group>/).")
    doc = yaml.safe_load(grid.read_text())
    ok = R.ok_cells(results)
    commit, names = R.cells_stamp([ok], "run the group again")
    _, arms, axes, cells, points = _cells(results, doc)
    rows = []
    for (point, i), recs in cells.items():
        for r in recs:
            if r["status"] == "ok":
                rows.append({"point": dict(zip(axes, map(_plain, point))),
                             "arm": arm_label(arms[i]), "repeat": _plain(r.get(REPEAT)),
                             VALUE: _plain(r.get(VALUE)), BUBBLE: _plain(r.get(BUBBLE))})
    return {"question": question, "group": Path(sweep_dir).name, "date": date,
            "device": device or R.device_slug(names[0] if names else ""),
            "device_name": ", ".join(names), "commit": commit, "command": command,
            "software": "", "note": note, "arms": [arm_label(a) for a in arms],
            "rows": rows}


def _where(point: dict) -> str:
    return ", ".join(f"bs {v}" if k == "batch_size" else f"{k.removeprefix('cfg.')}={v}"
                     for k, v in point.items()) or "all"


def effects(doc: dict) -> pd.DataFrame:
    """Each arm against the first arm at each grid point (studies/effects.py arm_effects),
    with `words`: the verdict in the reports' words."""
    from .effects import NO_VERDICT, arm_effects
    df = pd.DataFrame([{"point": _where(r["point"]), "arm": r["arm"], VALUE: r[VALUE],
                        BUBBLE: r[BUBBLE]} for r in doc["rows"]])
    if df.empty:
        return pd.DataFrame(columns=["where", "arm", "baseline", "ratio", "noise", "words"])
    arms = doc["arms"]
    eff = arm_effects(df, "arm", [(a, arms[0]) for a in arms[1:]], by=["point"], value=VALUE)
    eff["where"] = eff["point"]
    eff["words"] = eff["verdict"].map({**WORDS, NO_VERDICT: R.ONE_REPEAT})
    return eff


def answer(eff: pd.DataFrame, base: str) -> str:
    if eff.empty:
        return "no arm ran beside its baseline."
    parts = []
    for arm, g in eff.groupby("arm", sort=False):
        lo, hi = g.loc[g["ratio"].idxmin()], g.loc[g["ratio"].idxmax()]
        span = (R.ratio_text(lo["ratio"], lo["noise"], lo["words"]) + f" at {lo['where']}"
                if len(g) == 1 else
                f"{R.ratio_text(lo['ratio'], lo['noise'], lo['words'])} at {lo['where']} .. "
                f"{R.ratio_text(hi['ratio'], hi['noise'], hi['words'])} at {hi['where']}")
        parts.append(f"{arm} vs {base}: {span}")
    return "; ".join(parts) + "."


def render(doc: dict) -> str:
    eff = effects(doc)
    base = doc["arms"][0] if doc["arms"] else "-"
    title = f"{doc['question']}: {QUESTIONS.get(doc['question'], doc['group'])}"
    parts = [R.header(doc, title), f"- bench group: `{doc['group']}`", ""]
    if doc.get("note"):
        parts += [doc["note"], ""]
    rows = [[r["where"], r["arm"], R.ratio_text(r["ratio"], r["noise"], r["words"]),
             f"{R.num(r['tok_s'], '.4g')} / {R.num(r['tok_s_base'], '.4g')}",
             f"{R.num(r['bubble_base'], '.1%')} -> {R.num(r['bubble'], '.1%')}",
             f"{r['n']}/{r['n_base']}"] for r in eff.to_dict("records")]
    parts += [f"{R.ANSWER} {answer(eff, base)}", "",
              f"Each arm against `{base}` at the same grid point: the median decode tok/s over "
              "the interleaved repeats, the ratio ± the noise (the larger of the two arms' "
              "spread, at least 2%) and the verdict; the bubble is the meter's fraction of "
              "the decode step (baseline -> arm).", "",
              R.md_table(["grid point", "arm", "ratio vs baseline", "decode tok/s (arm / base)",
                          "bubble (base -> arm)", "n"], rows)]
    return "\n".join(parts) + "\n"
