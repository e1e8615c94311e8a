"""Study `peers`: mtplab beside SGLang (and transformers) on the same workload.

Runner: side_by_side.py (`python -m benchmarks.bench_peer_sglang`): SGLang's offline engine and
mtplab's, each in a worker process of its own (peer_worker.py), on one GPU, driven with the
same prompts, batch, simulated acceptance and knobs (peer_plan.py), repeats interleaved. Its
resumable results.json holds every finished cell; `--out-dir DIR` hands them to `results_doc`
and writes the report with `reports.write(doc, render)`:

    docs/results/peers/<date>_<device>_<commit>.{json,md}

The results file keeps per cell each engine's tok/s of every repeat, the mtplab / SGLang ratio
of every repeat (both arms of a repeat ran back to back), TTFT, TPOT, step time, accept
length, and of each engine's profiled trace the bubble, its causes and the run-ahead (the
analyser's, `mtplab analyze`); the ratio's median, noise and verdict and the answer are
computed by `render`, so `mtplab report peers` regenerates the report. hf_peer.py sets mtplab
beside transformers (greedy and assisted generation) on the same weights.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

from ...errors import ConfigError
from .. import reports as R

QUESTION = "peers"
TITLE = "Peers: mtplab beside SGLang on the same workload"
WRITER = "python -m benchmarks.bench_peer_sglang --out RUN --out-dir DIR"
SIDES = ("mtplab", "sglang")
NAMES = {"mtplab": "mtplab", "sglang": "SGLang"}
ARM = ("tok_s_repeats", "ttft_ms", "tpot_p50_ms", "step_ms", "decode_steps", "accept_len")
TRACE = ("bubble_frac", "steps", "top", "run_ahead_frac", "launch_lead_p10_us",
         "launch_lead_p50_us", "launch_lead_p90_us", "run_ahead_steps", "note")
CELL = ("cell", "shape", "draft", "overlap", "bs", "status", "failed_side", "message")




def cell_record(rec: dict) -> dict:
    """One cell of the results file from the harness's record of it (side_by_side.measure_cell
    and its status): the settings, each engine's figures (ARM), the ratio of every repeat, and
    of each engine's profiled trace the analyser's figures (TRACE) and the meter's bubble."""
    out = {k: rec.get(k) for k in CELL}
    if rec.get("status") == "ok":
        out["ratio_repeats"] = list(rec["ratio"]["repeats"])
        for side in SIDES:
            out[side] = {k: rec[side].get(k) for k in ARM}
        prof = rec.get("profile") or {}
        out["profile"] = {side: {**{k: prof[side].get(k) for k in TRACE
                                    if prof[side].get(k) is not None},
                                 "meter_bubble_frac": (prof[side].get("meter") or {})
                                 .get("bubble_frac")}
                          for side in SIDES if side in prof}
    return R.plain(out)


def results_doc(records: list[dict], *, workload: dict, command: str, software: str = "",
                note: str = "") -> dict:
    """A report's results from the harness's cell records (grid order): the stamp from the
    cells (the newest cell's date, the GPU SGLang named, the one clean commit every cell ran
    at: ConfigError otherwise), the workload and the cells (`cell_record`)."""
    if not any(r.get("status") == "ok" for r in records):
        raise ConfigError("no cell of this grid finished: a peers report is written from the "
                          "cells that ran; run the grid first.")
    commits = {r.get("git_commit") for r in records}
    if len(commits) != 1:
        raise ConfigError(f"the cells ran at commits {sorted(map(str, commits))}: a report "
                          "names one commit; run the grid again at one commit (a new --out).")
    commit = R.report_commit(commits.pop())
    names = [str(e.get("device")) for r in records for e in (r.get("engines") or {}).values()
             if R.device_slug(str(e.get("device") or "")) != "cpu"]
    name = names[0] if names else ""
    engines = {k: v for r in records for k, v in (r.get("engines") or {}).items()}
    software = software or "; ".join(
        f"{k} " + ", ".join(f"{p} {v}" for p, v in sorted(e.items())
                            if p not in ("engine", "device"))
        for k, e in sorted(engines.items()))
    return {"question": QUESTION, "date": max(str(r["date"])[:10] for r in records),
            "device": R.device_slug(name), "device_name": name,
            "commit": commit,
            "command": command, "software": software, "note": note,
            "workload": dict(workload), "cells": [cell_record(r) for r in records]}


# -- the figures, computed from the doc ---------------------------------------------------------
def check(doc: dict) -> None:
    """ConfigError naming what a results file lacks (render's input)."""
    def bad(what):
        raise ConfigError(f"peers results {doc.get('date')}_{doc.get('device')}_"
                          f"{doc.get('commit')}: {what}; write them again with `{WRITER}`.")
    missing = [k for k in ("question", "date", "device", "commit", "command", "workload",
                           "cells") if k not in doc]
    if missing:
        bad(f"no {', '.join(missing)}")
    if not isinstance(doc["cells"], list) or not doc["cells"]:
        bad("no cells")
    for c in doc["cells"]:
        if not isinstance(c, dict) or not {"cell", "status"} <= set(c):
            bad("each cell needs its cell id and status")
        if c["status"] != "ok":
            continue
        ok = _numbers(c.get("ratio_repeats")) and all(
            isinstance(c.get(s), dict) and _numbers(c[s].get("tok_s_repeats")) for s in SIDES)
        if not ok:
            bad(f"cell {c['cell']}: an ok cell needs ratio_repeats and each engine's "
                "tok_s_repeats (lists of positive numbers)")


def _numbers(xs: Any) -> bool:
    return (isinstance(xs, list) and bool(xs)
            and all(isinstance(x, (int, float)) and x > 0 for x in xs))


def rel_spread(xs: list[float]) -> float:
    """(max - min) / median over the repeats (NaN with fewer than two)."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else math.nan


def ratio(c: dict) -> dict:
    """mtplab / SGLang tok/s of an ok cell: the median of the repeats' ratios (each repeat ran
    both engines back to back), its noise (the larger relative spread of the two engines'
    tok/s over the repeats, at least reports.MIN_NOISE) and the verdict (pays: mtplab is
    faster)."""
    r = statistics.median(c["ratio_repeats"])
    spreads = [rel_spread(c[s]["tok_s_repeats"]) for s in SIDES]
    noise = max([R.MIN_NOISE] + [s for s in spreads if s == s])
    n = len(c["ratio_repeats"])
    return {"ratio": r, "noise": noise, "n": n, "verdict": R.verdict(r, noise, n, n)}


def tok_s(c: dict, side: str) -> float:
    return statistics.median(c[side]["tok_s_repeats"])


def _ok(doc: dict) -> list[dict]:
    return [c for c in doc["cells"] if c["status"] == "ok"]


def answer(doc: dict) -> str:
    ok = _ok(doc)
    rs = [ratio(c) for c in ok]
    counts = {v: sum(r["verdict"] == v for r in rs) for v in R.VERDICTS}
    lo, hi = min(rs, key=lambda r: r["ratio"]), max(rs, key=lambda r: r["ratio"])
    out = (f"mtplab decodes at {lo['ratio']:.2f}x to {hi['ratio']:.2f}x SGLang's tok/s over "
           f"{len(ok)} cells (lowest {R.ratio_text(lo['ratio'], lo['noise'], lo['verdict'])}, "
           f"highest {R.ratio_text(hi['ratio'], hi['noise'], hi['verdict'])}): faster in "
           f"{counts[R.PAYS]}, slower in {counts[R.COSTS]}, within the noise in "
           f"{counts[R.NOISE]}")
    if counts[R.ONE_REPEAT]:
        out += f", one repeat (no verdict) in {counts[R.ONE_REPEAT]}"
    failed = len(doc["cells"]) - len(ok)
    if failed:
        out += f"; {failed} cells did not run"
    for side in SIDES:
        fr = [c["profile"][side]["run_ahead_frac"] for c in ok
              if c.get("profile", {}).get(side, {}).get("run_ahead_frac") is not None]
        if fr:
            out += (f"; {NAMES[side]}'s traces run ahead on {min(fr):.0%} to {max(fr):.0%} "
                    "of their steps")
    return out + "."


def _f(x: Optional[float], spec: str) -> str:
    return R.num(x, spec)


def _top(p: dict) -> str:
    if p.get("bubble_frac") is None:
        return "-"
    return ", ".join(f"{k} {v:.0%}" for k, v in p.get("top") or []) or "none"


def _run_ahead(p: dict) -> str:
    """'97% (+12 / +40 / +95 µs)': the run-ahead fraction and the launch lead p10 / p50 / p90;
    the trace's note, or '-', without one."""
    if p.get("run_ahead_frac") is None:
        return p.get("note") or "-"
    return (f"{p['run_ahead_frac']:.0%} ({_f(p.get('launch_lead_p10_us'), '+.0f')} / "
            f"{_f(p.get('launch_lead_p50_us'), '+.0f')} / "
            f"{_f(p.get('launch_lead_p90_us'), '+.0f')} µs)")


HEAD = ["shape", "draft", "overlap", "bs", "tok/s mtplab", "tok/s SGLang",
        "mtplab / SGLang (noise, verdict)", "TPOT p50 ms m / S", "step ms m / S",
        "accept len m / S", "bubble mtplab meter / trace", "bubble SGLang trace",
        "top causes mtplab", "top causes SGLang", "run-ahead mtplab (lead p10 / p50 / p90)",
        "run-ahead SGLang (lead p10 / p50 / p90)"]


def _row(c: dict) -> list[str]:
    head = [c["shape"], c["draft"], c["overlap"], str(c["bs"])]
    if c["status"] != "ok":
        who = {"sglang": "SGLang", "mtplab": "mtplab"}.get(c.get("failed_side"), "the harness")
        return head + [f"{who} cannot run this cell: {c.get('message')}"] + [""] * 11
    m, s, r = c["mtplab"], c["sglang"], ratio(c)
    pm, ps = c.get("profile", {}).get("mtplab", {}), c.get("profile", {}).get("sglang", {})
    return head + [
        _f(tok_s(c, "mtplab"), ".0f"), _f(tok_s(c, "sglang"), ".0f"),
        R.ratio_text(r["ratio"], r["noise"], r["verdict"]),
        f"{_f(m.get('tpot_p50_ms'), '.2f')} / {_f(s.get('tpot_p50_ms'), '.2f')}",
        f"{_f(m.get('step_ms'), '.2f')} / {_f(s.get('step_ms'), '.2f')}",
        f"{_f(m.get('accept_len'), '.2f')} / {_f(s.get('accept_len'), '.2f')}",
        f"{_f(pm.get('meter_bubble_frac'), '.1%')} / {_f(pm.get('bubble_frac'), '.1%')}",
        _f(ps.get("bubble_frac"), ".1%"), _top(pm), _top(ps), _run_ahead(pm), _run_ahead(ps)]


def render(doc: dict) -> str:
    """The report: its stamp, the workload, the answer, one row per cell."""
    check(doc)
    w = doc["workload"]
    parts = [R.header(doc, TITLE),
             f"- workload: per cell bs prompts of {w['prompt_len']} random token ids submitted "
             f"at once, {w['new_tokens']} new tokens each (ignore_eos), simulated acceptance "
             f"{w['accept_len']} (spec cells), random weights of one config in both engines; "
             f"{w['repeats']} repeats, the engines' order alternating; a profiled run of "
             f"{w['profile_steps']} steps per engine and cell (method: docs/peers.md)", ""]
    parts += R.note_and_answer(doc, answer(doc)) + [
        "",
        "How to read it: *mtplab / SGLang* is the median over the repeats of mtplab's tok/s "
        "over SGLang's in the same repeat, its noise the larger relative spread (max - min) / "
        "median of the two engines' tok/s, at least 2%, and the verdict mtplab's (pays: "
        "faster). tok/s, TPOT and step: medians over the repeats. Bubble, causes and "
        "run-ahead come from each engine's profiled trace read by mtplab's analyser (`mtplab "
        "analyze TRACE`; mtplab's bubble also from its meter): *run-ahead* is the share of "
        "steps whose next launch was issued before the step's GPU work ended, the *launch "
        "lead* the end of a step's GPU work less the next step's first launch (> 0: the host "
        "runs ahead).", "",
        R.md_table(HEAD, [_row(c) for c in doc["cells"]])]
    return "\n".join(parts) + "\n"
