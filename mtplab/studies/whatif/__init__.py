"""Study `whatif`: does the what-if predictor get the measured ratios right?

Grid: the regime ladder (studies/regime/regime.yaml: every cell records its step profile).
Check: check.py (`validate`: each pair of arms differing in one knob, the ratio predicted from
the baseline's run beside the one measured, judged where the effect exceeds the noise).

    doc = results_doc([(results, sweep_dir), ...], command=..., date=...)   # one or more runs
    write(doc, render)     # docs/results/whatif/<date>_<device>_<commit>.{json,md}

A regime run writes its validation beside its results (sweep_dir/whatif_validation.csv,
studies/bench.py regime_report); the results file keeps those rows as the run wrote them
(replaying them again needs each baseline's step-profile run folder, which a report does not
keep) and, per rung, the cells that ran: the report, the error per direction (check.py
`by_direction`, each knob both ways) and the answer are computed from them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from .. import reports as R

QUESTION = "whatif"
TITLE = "What-if: does the predictor get the measured ratios right?"
VALIDATION = "whatif_validation.csv"
DRAFTS = {"target": "target-only", "frozen_kv_mtp": "Frozen-KV MTP", "eagle": "EAGLE"}
LOOPS = {"off": "overlap off", "on": "overlap only", "zb": "overlap + zero_bubble"}
FIELDS = ("rung", "where", "arm", "baseline", "whatif", "direction", "predicted", "ratio",
          "noise", "error", "self_error", "judged", "n", "n_base", "note", "host_speed",
          "error_at_speed", "judged_at_speed")




def rung_of(where: str) -> str:
    """A validation row's rung, as the regime ladder names it ('llama3-8b-like@16 bs8 p512'),
    from its `where` ('model=llama3-8b-like layers=16 bs=8 prompt=512 draft=none')."""
    kv = dict(part.split("=", 1) for part in where.split() if "=" in part)
    model = kv.get("model", "?") + (f"@{kv['layers']}" if "layers" in kv else "")
    return f"{model} bs{kv.get('bs', '?')} p{kv.get('prompt', '?')}"


def _rung_cells(ok: pd.DataFrame) -> list[dict]:
    """Per rung of a run's ok cells: cells, arms, the most repeats an arm ran, and how many
    arms ran fewer (a budget that ran out before their last repeat)."""
    from ..regime.ladder import arm_label, rung_label
    recs = ok.to_dict("records")
    cells = pd.DataFrame({"rung": [rung_label(r) for r in recs],
                          "arm": [arm_label(r) for r in recs]})
    out = []
    for rung, g in cells.groupby("rung", sort=False):
        per_arm = g.groupby("arm", sort=False).size()
        out.append({"rung": rung, "cells": len(g), "arms": len(per_arm),
                    "repeats": int(per_arm.max()),
                    "fewer": int((per_arm < per_arm.max()).sum())})
    return out


def results_doc(runs: Sequence[tuple[pd.DataFrame, str]], *, command: str, date: str,
                device: Optional[str] = None, note: str = "") -> dict:
    """A report's results from one or more regime runs, each (its results table, its folder
    holding VALIDATION): the stamp (the cells' device and commit: one commit of a clean tree
    over every run), the rungs' cells and every validation row."""
    from ...errors import ConfigError
    rows, rungs, oks = [], [], []
    for results, sweep_dir in runs:
        ok = R.ok_cells(results)
        oks.append(ok)
        path = Path(sweep_dir) / VALIDATION
        if not path.is_file():
            raise ConfigError(f"{path} does not exist: a regime run writes it (mtplab bench "
                              "--groups regime --dir D writes D/regime/); --from takes that "
                              "folder.")
        v = pd.read_csv(path)
        rungs += _rung_cells(ok)
        rows += [{"rung": rung_of(r["where"]), **{k: R.plain(r.get(k)) for k in FIELDS[1:]}}
                 for r in v.to_dict("records")]
    commit, names = R.cells_stamp(oks, "run again")
    return {"question": QUESTION, "date": date,
            "device": device or R.device_slug(names[0] if names else ""),
            "device_name": ", ".join(names), "commit": commit, "command": command,
            "software": "", "note": note, "rungs": rungs, "rows": rows}


def frame(doc: dict) -> pd.DataFrame:
    """The validation rows of a results doc (check.py's columns, and the rung); `verdict` the
    measured ratio's (results.verdict)."""
    v = pd.DataFrame(doc["rows"], columns=list(FIELDS))
    v = v.astype({k: float for k in ("predicted", "ratio", "noise", "error", "self_error",
                                     "host_speed", "error_at_speed")})
    v["verdict"] = [R.verdict(r, s, n, nb) for r, s, n, nb in
                    zip(v["ratio"], v["noise"], v["n"], v["n_base"])]
    return v


def in_words(label: str) -> str:
    """A regime arm label in words: 'frozen_kv_mtp on unfolded' -> 'a Frozen-KV MTP base
    with overlap only, the seed unfolded'."""
    draft, loop, *rest = label.split()
    what = LOOPS.get(loop, f"zero_bubble but {loop.removeprefix('zb-')}"
                     if loop.startswith("zb-") else loop)
    extra = [("the seed unfolded" if r == "unfolded" else f"a {r.lstrip('+')} host delay")
             for r in rest if r == "unfolded" or r.startswith("+")]
    return f"a {DRAFTS.get(draft, draft)} base with " + ", ".join([what, *extra])


def _judged(v: pd.DataFrame) -> pd.DataFrame:
    from .check import GOAL
    return v[v["judged"].isin([f"within {GOAL:.0%}", "off"])]


def answer(doc: dict) -> str:
    from .check import GOAL, SEVERAL
    v = frame(doc)
    j = _judged(v)
    per = "; ".join(f"{int((g['judged'] != 'off').sum())} of {len(g)} at {rung}"
                    for rung, g in j.groupby("rung", sort=False))
    out = (f"{int((j['judged'] != 'off').sum())} of {len(j)} predicted ratios within "
           f"{GOAL:.0%} of the measured where the measured effect exceeds its noise, both "
           f"ways ({per or 'none judged'})")
    misses = j[j["judged"] == "off"]
    if len(misses):
        out += "; off: " + ", ".join(f"{r['direction']} from `{r['baseline']}` at {r['rung']} "
                                     f"({r['error']:+.1%})" for r in misses.to_dict("records"))
    for rung, g in j[(j["ratio"] > 1.0) & (j["direction"] != SEVERAL)].groupby(
            "rung", sort=False):
        g = g.loc[g["ratio"].idxmax()]
        out += (f"; the largest one-knob gain at {rung}, {g['direction']} from "
                f"{in_words(g['baseline'])} (`{g['baseline']}`): predicted "
                f"{g['predicted']:.3f}x, measured "
                f"{R.ratio_text(g['ratio'], g['noise'], g['verdict'])} "
                f"(error {g['error']:+.1%})")
    short = [r for r in doc["rungs"] if r["fewer"]]
    if short:
        out += "; " + ", ".join(f"{r['rung']} ran one repeat fewer for {r['fewer']} of its "
                                f"{r['arms']} arms (the budget): no verdict on their pairs"
                                for r in short)
    return out + "."


def _cells_line(r: dict) -> str:
    line = (f"- cells: {r['cells']} ok, {r['arms']} arms, {r['repeats']} interleaved repeats "
            "each")
    if r["fewer"]:
        line += (f", except {r['fewer']} arms that ran {r['repeats'] - 1} (the sweep's "
                 "budget ran out before the rest started): their ratios have no spread, "
                 "so no verdict, and their predictions are not judged")
    return line + "."


def pair_table(v: pd.DataFrame) -> str:
    head = ["arm", "baseline", "what-if", "direction", "predicted", "measured (noise, verdict)",
            "error", "judged", "n", "self error", "host speed", "error at speed"]
    rows = [[r["arm"], r["baseline"], r["whatif"], r["direction"], R.num(r["predicted"], ".3f"),
             R.ratio_text(r["ratio"], r["noise"], r["verdict"]), R.num(r["error"], "+.1%"),
             r["judged"], f"{r['n']}/{r['n_base']}", R.num(r["self_error"], "+.1%"),
             R.num(r["host_speed"], ".2f"), R.num(r["error_at_speed"], "+.1%")]
            for r in v.to_dict("records")]
    return R.md_table(head, rows)


def render(doc: dict) -> str:
    """The report: its stamp, the answer, then per rung its cells, the summary, the error per
    direction (each knob both ways) and every pair."""
    from .check import GOAL, direction_md, summary
    v = frame(doc)
    parts = [R.header(doc, TITLE), ""]
    parts += R.note_and_answer(doc, answer(doc)) + [
              "",
              "How to read it. Each row compares two arms of one grid point that differ in "
              "what the predictor replays (overlap, a zero_bubble sub-knob or all of them, "
              "fold_seed, a host delay planted after every step): the predictor replays the "
              "baseline's recorded run (its step profile; analysis/whatif.py) under the what-if "
              "that turns it into the arm, and its *predicted* tok/s ratio stands beside the "
              "*measured* one (the median meter_tok_per_s of the arm over the baseline's, ± "
              "the noise: the larger of the two arms' spread over the interleaved repeats, at "
              "least 2%, and its verdict). *error* = predicted / measured - 1; *judged*: "
              f"within {GOAL:.0%} or off where the measured effect exceeds its noise, else "
              "\"effect within noise\" or no verdict (one repeat a side). Both directions: "
              "every arm is predicted toward each knob it can flip, on and off; the "
              "*direction* names the knob and the way. *self error*: the replay of the "
              "baseline's own run against its measured step time; *host speed*: how many "
              "times slower the arm's host ran than the baseline's; *error at speed*: the "
              "error once the baseline is replayed at the arm's host speed. Arms are named "
              "as the regime ladder names them: the draft (`target`: none), then `off` "
              "(overlap off), `on` (overlap, zero_bubble's sub-knobs at their defaults), `zb` "
              "(overlap + zero_bubble), `zb-<sub-knob>` (all but that one), `unfolded` "
              "(fold_seed off), `+1ms` (a 1 ms host delay).", "",
              f"These rows are the validation the run itself wrote (`{VALIDATION}` of its "
              "sweep folder, studies/bench.py): replaying them again needs each baseline's "
              "step-profile run folder, which is not kept beside this report."]
    cells = {r["rung"]: r for r in doc["rungs"]}
    for rung, g in v.groupby("rung", sort=False):
        parts += ["", f"## {rung}", ""]
        if rung in cells:
            parts += [_cells_line(cells[rung])]
        parts += [f"- {summary(g)}", "",
                  "### The error per direction (each knob, each way)", "",
                  direction_md(g), "", "### Every pair", "", pair_table(g)]
    return "\n".join(parts) + "\n"


def report(sweep_dirs, *, command: str, date: str, device=None, root=None, note: str = ""):
    """Write the dated report of one or more regime runs' folders (each holding
    results.parquet and VALIDATION); returns the report's path."""
    from ...errors import ConfigError
    from ...sweep.results import RESULTS_PARQUET
    dirs = [Path(sweep_dirs)] if isinstance(sweep_dirs, (str, Path)) else \
        [Path(d) for d in sweep_dirs]
    runs = []
    for d in dirs:
        if not (d / RESULTS_PARQUET).is_file():
            raise ConfigError(f"{d / RESULTS_PARQUET} does not exist: a report is written from "
                              "a run's folder.")
        runs.append((pd.read_parquet(d / RESULTS_PARQUET), str(d)))
    doc = results_doc(runs, command=command, date=date, device=device, note=note)
    return R.write(doc, render, root)
