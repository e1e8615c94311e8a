"""Study `spec_schedule`: which draft setting pays at which batch size, and what a batch-aware
schedule gains over the best static setting.

Grid: schedule.yaml (`mtplab bench --groups schedule`). Runner: runner.py (one process per
model: the break-even surface, the best schedule as YAML, its gain on a varying batch); it
leaves in its folder D/schedule/ the grid it ran (grid.yaml) and what it measured
(results.json). The dated report is written from that folder:

    mtplab bench --groups schedule --dir D
    mtplab report spec_schedule --from D/schedule --command "mtplab bench --groups schedule ..."
        -> docs/results/spec_schedule/<date>_<device>_<commit>.{json,md}   (--root DIR: DIR/...)

The results file keeps, per model, every repeat's decode tok/s per setting and batch size,
every workload round per setting, the schedule the runner chose and the gain's rounds (the
schedule's and the best static setting's, alternating); every ratio, noise, verdict, best
setting and the answer are computed from them (`render`), so `mtplab report spec_schedule`
regenerates the report. The runner prints the same per-model sections (`model_section`).
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Optional

from ...errors import ConfigError
from .. import reports as R

QUESTION = "spec_schedule"
TITLE = "Speculation schedule: which draft setting pays at which batch size"
WRITER = "mtplab bench --groups schedule --dir D, then mtplab report spec_schedule --from " \
         "D/schedule"
OFF = "off"                           # the target-only arm every ratio is over
RESULTS, GRID = "results.json", "grid.yaml"
GROUP_KEYS = {"arms": list, "batch_sizes": list, "repeats": int, "accept_rate": float,
              "min_gain": float, "max_running_requests": int, "surface": dict,
              "workload": dict}
SURFACE_KEYS = ("prompt_len", "output_len", "warmup")
WORKLOAD_KEYS = ("waves", "refill_at", "prompt_len", "output_len")
GAIN_KEYS = ("static_setting", "schedule_text", "static", "schedule", "ratios")


# -- the results doc -------------------------------------------------------------------------
def models_of(group: dict, res: dict) -> list[dict]:
    """Per model of the group (its label, in the grid's order), what the runner's results
    hold of it: device name, surface, workload rounds, the chosen schedule and the gain (an
    empty surface: not measured)."""
    out = []
    for label in group["models"]:
        r = res.get(label) or {}
        out.append({"model": label, "device_name": r.get("device", ""),
                    "surface": r.get("surface", {}), "workload": r.get("workload", {}),
                    "schedule": r.get("schedule"), "gain": r.get("gain")})
    return out


def results_doc(group: dict, res: dict, *, command: str, date: str,
                device: Optional[str] = None, note: str = "") -> dict:
    """A report's results from the runner's folder: `group` its grid.yaml (the effective
    group: models, arms, batch sizes, repeats ...), `res` its results.json. The stamp: the
    units' one commit of a clean tree and their device (`device`: its short name, default
    from the device's name)."""
    if not isinstance(res, dict) or not isinstance(group, dict) or \
            not isinstance(group.get("models"), list):
        raise ConfigError("the schedule group's results.json is not a mapping of model -> "
                          "results, or its grid.yaml lacks the list of models: run the group "
                          "again into a new --dir.")
    commits = sorted({c for r in res.values() if isinstance(r, dict)
                      for c in r.get("commits", [])})
    if len(commits) != 1 or not commits[0] or commits[0].endswith("-dirty"):
        raise ConfigError(f"the schedule group's units ran at commits {commits or ['unknown']}: "
                          "a report names one commit of a clean tree; run the group again into "
                          "a new --dir at one commit (MTP_GIT_COMMIT names the commit a copied "
                          "tree was made from).")
    models = models_of(group, res)
    names = sorted({m["device_name"] for m in models if m["device_name"]})
    doc = {"question": QUESTION, "date": date,
           "device": device or R.device_slug(names[0] if names else ""),
           "device_name": ", ".join(names), "commit": R.report_commit(commits[0]),
           "command": command, "software": "", "note": note,
           "group": {k: group[k] for k in GROUP_KEYS if k in group}, "models": models}
    check(doc)
    return doc


def report(sweep_dirs, *, command: str, date: str, device=None, root=None, note: str = ""):
    """Write the dated report of the schedule group's folder (`mtplab bench --groups schedule
    --dir D` leaves D/schedule/ holding RESULTS and GRID); returns the report's path."""
    from ...yamlfile import read_yaml
    dirs = [sweep_dirs] if isinstance(sweep_dirs, (str, Path)) else list(sweep_dirs)
    if len(dirs) != 1:
        raise ConfigError("a spec_schedule report is written from one run's folder: give "
                          "--from one folder (D/schedule).")
    d = Path(dirs[0])
    for name in (RESULTS, GRID):
        if not (d / name).is_file():
            raise ConfigError(f"{d / name} does not exist: --from takes the schedule group's "
                              "folder (mtplab bench --groups schedule --dir D writes "
                              "D/schedule/).")
    try:
        res = json.loads((d / RESULTS).read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{d / RESULTS} is not JSON ({e}): run the group again into a new "
                          "--dir.") from None
    group = read_yaml(d / GRID, f"the schedule group's {d / GRID}")
    doc = results_doc(group, res, command=command, date=date, device=device, note=note)
    return R.write(doc, render, root)


def check(doc: dict) -> None:
    """ConfigError naming the first field a results file lacks or holds in the wrong shape."""
    def bad(what: str):
        raise ConfigError(f"a {QUESTION} results file (date {doc.get('date')!r}, commit "
                          f"{doc.get('commit')!r}): {what}; it is written by `{WRITER}`, "
                          "write it again with that.")

    def numbers(xs: Any) -> bool:
        return (isinstance(xs, list) and len(xs) > 0 and
                all(isinstance(x, (int, float)) and x > 0 for x in xs))
    g = doc.get("group")
    if not isinstance(g, dict):
        bad("'group' is missing or not a mapping")
    for k, kind in GROUP_KEYS.items():
        if not isinstance(g.get(k), (int, float) if kind is float else kind):
            bad(f"group '{k}' is missing or not a {kind.__name__}")
    if OFF not in g["arms"]:
        bad(f"the group's arms {g['arms']} lack {OFF!r}, which every ratio is over")
    for part, keys in (("surface", SURFACE_KEYS), ("workload", WORKLOAD_KEYS)):
        if not set(keys) <= set(g[part]):
            bad(f"group '{part}' lacks one of {list(keys)}")
    if not isinstance(doc.get("models"), list):
        bad("'models' is missing or not a list")
    for i, m in enumerate(doc["models"]):
        if not isinstance(m, dict) or not {"model", "surface", "workload", "schedule",
                                           "gain"} <= set(m):
            bad(f"models[{i}] lacks one of model, surface, workload, schedule, gain")
        if not (isinstance(m["surface"], dict) and isinstance(m["workload"], dict) and
                all(isinstance(p, dict) for p in m["surface"].values()) and
                isinstance(m["schedule"], (str, type(None)))):
            bad(f"models[{i}]: surface is not setting -> bs -> tok/s, workload not setting -> "
                "tok/s, or schedule not text")
        for n, pts in m["surface"].items():
            if n not in g["arms"]:
                bad(f"models[{i}] surface: {n!r} is not one of the arms {g['arms']}")
            for b in g["batch_sizes"]:
                if not numbers(pts.get(str(b))):
                    bad(f"models[{i}] surface {n!r} bs {b}: not a list of tok/s, one per "
                        "repeat")
        for n, xs in m["workload"].items():
            if n not in m["surface"] or not numbers(xs):
                bad(f"models[{i}] workload {n!r}: not a list of tok/s of a measured setting")
        gain = m["gain"]
        if gain is not None:
            if not isinstance(gain, dict) or not all(k in gain for k in GAIN_KEYS):
                bad(f"models[{i}] gain lacks one of {list(GAIN_KEYS)}")
            if not (numbers(gain["static"]) and numbers(gain["schedule"]) and
                    numbers(gain["ratios"]) and
                    len(gain["static"]) == len(gain["schedule"]) == len(gain["ratios"])):
                bad(f"models[{i}] gain: static, schedule and ratios are not lists of one "
                    "value per round")


# -- figures computed from the doc -----------------------------------------------------------
def spread(xs: list[float]) -> float:
    """max / min - 1 over the repeats (NaN with fewer than two)."""
    return max(xs) / min(xs) - 1 if len(xs) > 1 else math.nan


def _noise(*spreads: float) -> float:
    return max([R.MIN_NOISE] + [s for s in spreads if s == s])


def arms(doc: dict, m: dict) -> list[str]:
    """The settings measured for a model, in the grid's order."""
    return [n for n in doc["group"]["arms"] if n in m["surface"]]


def surface(doc: dict, m: dict) -> list[dict]:
    """Per batch size and measured setting: the median tok/s, n, and the ratio over off
    (median / off's median) with its noise (the larger spread of the two, at least
    results.MIN_NOISE) and verdict (NaN ratio without an off arm)."""
    out = []
    for b in doc["group"]["batch_sizes"]:
        off = m["surface"].get(OFF, {}).get(str(b))
        for n in arms(doc, m):
            xs = m["surface"][n][str(b)]
            row = {"bs": b, "setting": n, "tok_s": statistics.median(xs), "n": len(xs),
                   "ratio": math.nan, "noise": math.nan, "verdict": ""}
            if off and n != OFF:
                row["ratio"] = statistics.median(xs) / statistics.median(off)
                row["noise"] = _noise(spread(xs), spread(off))
                row["verdict"] = R.verdict(row["ratio"], row["noise"], len(xs), len(off))
            out.append(row)
    return out


def best(doc: dict, m: dict) -> dict[int, str]:
    """Per batch size the setting of highest median tok/s."""
    rows = surface(doc, m)
    return {b: max((r for r in rows if r["bs"] == b), key=lambda r: r["tok_s"])["setting"]
            for b in doc["group"]["batch_sizes"]}


def gain(m: dict) -> Optional[dict]:
    """The schedule against the best static setting on the varying workload: the median of
    the alternating rounds' ratios, its noise (the larger spread of the two engines' rounds,
    at least results.MIN_NOISE) and verdict, and `same`: the schedule is one bucket of the
    static setting (two like engines: the ratio shows the noise); None where not measured."""
    g = m["gain"]
    if not g:
        return None
    r = statistics.median(g["ratios"])
    noise = _noise(spread(g["schedule"]), spread(g["static"]))
    buckets = g["schedule_text"].split(",")
    return {"ratio": r, "noise": noise, "static": g["static_setting"],
            "schedule": g["schedule_text"],
            "same": len(buckets) == 1 and buckets[0].split(":")[-1] == g["static_setting"],
            "verdict": R.verdict(r, noise, len(g["schedule"]), len(g["static"]))}


def spans(bs: list[int], keep: list[int]) -> str:
    """The batch sizes `keep` of the grid's `bs` as runs of neighbours: '1-8, 32'."""
    runs: list[list[int]] = []
    for i, b in enumerate(bs):
        if b in keep:
            if runs and bs.index(runs[-1][-1]) == i - 1:
                runs[-1].append(b)
            else:
                runs.append([b])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs)


def _model_answer(doc: dict, m: dict) -> str:
    if not m["surface"]:
        return f"{m['model']}: not measured"
    bs = doc["group"]["batch_sizes"]
    rows = [r for r in surface(doc, m) if r["verdict"]]
    said = []
    for v in R.VERDICTS:
        at = {n: [r["bs"] for r in rows if r["setting"] == n and r["verdict"] == v]
              for n in arms(doc, m)}
        each = [f"{n} at bs {spans(bs, at[n])}" for n in at if at[n]]
        if each:
            said.append(f"{v}: " + ", ".join(each))
    out = f"{m['model']}: over off, " + ("; ".join(said) if said else "no off arm measured")
    top = best(doc, m)
    out += "; best per bs " + ", ".join(
        f"{n} (bs {spans(bs, [b for b in bs if top[b] == n])})"
        for n in dict.fromkeys(top[b] for b in bs))
    g = gain(m)
    if m["schedule"] is None:
        out += "; no schedule (not every setting measured)"
    elif g is None:
        out += f"; the schedule `{m['schedule']}`, its gain not measured"
    elif g["same"]:
        out += (f"; the schedule `{g['schedule']}` is the best static setting {g['static']} "
                "itself (two such engines on the varying workload: "
                f"{R.ratio_text(g['ratio'], g['noise'], g['verdict'])})")
    else:
        out += (f"; the schedule `{g['schedule']}` over the best static setting {g['static']} "
                f"on the varying workload {R.ratio_text(g['ratio'], g['noise'], g['verdict'])}")
    return out


def answer(doc: dict) -> str:
    return ". ".join(_model_answer(doc, m) for m in doc["models"]) + "."


# -- the report ------------------------------------------------------------------------------
def _tok(xs: list[float]) -> str:
    """'2,983 (2,982-2,989)': the median and the range of the rounds."""
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}-{max(xs):,.0f})"


def _surface_table(doc: dict, m: dict) -> str:
    names = arms(doc, m)
    rows = surface(doc, m)
    top = best(doc, m)
    out = []
    for b in doc["group"]["batch_sizes"]:
        cells = []
        for r in (r for r in rows if r["bs"] == b):
            cell = f"{r['tok_s']:,.0f}"
            if r["verdict"]:
                cell += f" ({R.ratio_text(r['ratio'], r['noise'], r['verdict'])})"
            cells.append(cell)
        out.append([str(b), *cells, top[b]])
    wl = m["workload"]
    if wl:
        static = max(wl, key=lambda n: statistics.median(wl[n]))
        out.append(["workload", *[_tok(wl[n]) if n in wl else "-" for n in names], static])
    return R.md_table(["bs", *[f"{n} tok/s" + ("" if n == OFF else " (vs off)")
                               for n in names], "best"], out)


def model_section(doc: dict, m: dict, level: int = 2) -> list[str]:
    """One model's part of the report, under a heading of `level`: the surface (tok/s per bs
    and setting, each over off with its noise and verdict, the best setting), the schedule
    and its gain."""
    head = f"{'#' * level} {m['model']}" + (f" ({m['device_name']})" if m["device_name"] else "")
    if not m["surface"]:
        return [head, "", "- not measured"]
    g = doc["group"]
    out = [head, "", _surface_table(doc, m), ""]
    if m["schedule"] is None:
        return out + ["- schedule: none (not every setting measured)"]
    out.append(f"- schedule: `{m['schedule']}` (per batch size the setting of highest median "
               "tok/s, unless it beats the best static setting of the workload row there by no "
               f"more than min_gain {g['min_gain']:.0%}; equal neighbours merged)")
    gn, raw = gain(m), m["gain"]
    if gn is None:
        return out + ["- gain: not measured"]
    if gn["same"]:
        out.append(f"- the schedule is the best static setting `{gn['static']}` itself: the "
                   "gain below compares two such engines")
    rounds = ("alternating round(s)" if raw.get("order", "alternating") == "alternating" else
              "round(s) of one engine, then of the other (the device holds one engine of "
              "this model)")
    out.append(f"- gain on the varying workload over the best static setting `{gn['static']}`, "
               f"{len(raw['ratios'])} {rounds}: schedule {_tok(raw['schedule'])} "
               f"tok/s, static {_tok(raw['static'])}; per-round ratios "
               f"{', '.join(f'{x:.3f}' for x in raw['ratios'])}; median "
               f"{R.ratio_text(gn['ratio'], gn['noise'], gn['verdict'])}")
    return out


def workload_line(g: dict) -> str:
    s, w = g["surface"], g["workload"]
    return (f"- workload: simulated acceptance p = {g['accept_rate']} per draft position (a "
            f"setting of S steps accepts 1 + p + ... + p^S tokens per verify); one engine per "
            f"setting "
            f"(spec_schedule {{{g['max_running_requests']}: setting}}: `off` is the spec "
            f"worker's target-only step), its batch sizes {g['batch_sizes']} one after another "
            f"(settings not interleaved): a warm-up generate of {s['warmup']} tokens, then "
            f"{g['repeats']} timed generates of {s['output_len']} new tokens after "
            f"{s['prompt_len']}-token prompts, decode tok/s; the varying workload: waves of "
            f"{', '.join(map(str, w['waves']))} requests ({w['prompt_len']}-token prompts, "
            f"outputs uniform in {w['output_len'][0]}-{w['output_len'][1]} tokens), the next "
            f"wave once at most {w['refill_at']} are live, output tok/s from the first submit "
            f"to idle, {g['repeats']} rounds (median and range)")


def render(doc: dict) -> str:
    """The report: its stamp, the workload, the answer, then per model its section."""
    check(doc)
    parts = [R.header(doc, TITLE), workload_line(doc["group"]),
             "- noise: a ratio's noise is the larger spread (max / min - 1) of its two sides "
             f"over the repeats (the gain's: over the rounds), at least {R.MIN_NOISE:.0%}; a "
             "ratio is a median over off's median (the gain: the median of the rounds' "
             "schedule / static)", ""]
    parts += R.note_and_answer(doc, answer(doc))
    for m in doc["models"]:
        parts += ["", *model_section(doc, m)]
    return "\n".join(parts) + "\n"
