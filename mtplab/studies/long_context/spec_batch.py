"""Question `long_context_spec`: at 8k and 32k, what does speculation buy over target-only at
each batch size, and from which batch size does it stop paying?

Runner: benchmarks/bench_spec_batch.py --out-dir DIR (spec_batch_runner.py here) writes
`DIR/long_context_spec/<YYYY-MM-DD>_<device>_<commit>.{json,md}`; a second run at the same
stamp (another context) adds its cells to that report. One engine per (context, arm): its
largest batch's prompts are prefilled once, then the batch shrinks level by level (the
requests' lengths are staggered) and each level's decode steps are timed, so one prefill
serves every batch size. The results file keeps, per cell, the p50 step of each window of
steady steps and the tokens per step; every speedup, noise and crossover below is computed
from them, so `mtplab report long_context_spec` regenerates the report byte for byte.

    speedup(bs) = (spec tokens per step / spec step) / (bs / target step)    at one context
    crossover   the smallest measured bs from which no larger measured bs pays (verdict of
                studies/reports.py: above 1 beyond the noise)
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

from ...errors import ConfigError
from .. import reports as R

QUESTION = "long_context_spec"
KIND = "spec_batch"
TITLE = "Long-context speculation: the spec speedup over target-only by batch size"
WRITER = "python -m benchmarks.bench_spec_batch --out-dir DIR"
TARGET = "target"
MAGICDEC = ("MagicDec (ICLR'25, arXiv 2408.11049) reports up to 2x from speculation at bs "
            "32-256 with 32k contexts (LLaMA-2-7B-32K; 1.84x for LLaMA-3.1-8B; 8 A100s, "
            "sparse-KV drafts), because there the KV read dominates the step")
CELL_KEYS = ("ctx", "arm", "bs", "status")
DOC_KEYS = ("model", "batches", "contexts", "windows", "steps_per_level", "cells", "engines")


# -- figures computed from the doc -----------------------------------------------------------
def ctx_text(ctx: int) -> str:
    """8192 -> '8k'; a context that is no whole number of k tokens as it is."""
    return f"{ctx // 1024}k" if ctx >= 1024 and ctx % 1024 == 0 else str(ctx)


def spread(xs) -> float:
    xs = [x for x in xs if x is not None]
    return max(xs) / min(xs) - 1 if len(xs) > 1 and min(xs) > 0 else math.nan


def _noise(*s: float) -> float:
    return max([R.MIN_NOISE] + [x for x in s if x == x])


def _ok(doc: dict, ctx: int, arm: str, bs: int) -> Optional[dict]:
    for c in doc["cells"]:
        if c["ctx"] == ctx and c["arm"] == arm and c["bs"] == bs and c["status"] == "ok" \
                and [x for x in c["ms"] if x is not None]:
            return c
    return None


def arms(doc: dict) -> list[str]:
    """The speculative arms, in the order the run measured them."""
    return list(dict.fromkeys(c["arm"] for c in doc["cells"] if c["arm"] != TARGET))


def speedup(doc: dict, ctx: int, arm: str, bs: int) -> Optional[dict]:
    """The speedup of `arm` over target-only at (ctx, bs), its noise and verdict; None when
    either cell did not run."""
    s, t = _ok(doc, ctx, arm, bs), _ok(doc, ctx, TARGET, bs)
    if s is None or t is None:
        return None
    sm, tm = [x for x in s["ms"] if x is not None], [x for x in t["ms"] if x is not None]
    spec_tok_s = s["tokens_per_step"] / statistics.median(sm)
    target_tok_s = bs / statistics.median(tm)
    r = spec_tok_s / target_tok_s
    noise = _noise(spread(sm), spread(tm))
    return {"ratio": r, "noise": noise, "n": len(sm), "n_base": len(tm),
            "verdict": R.verdict(r, noise, len(sm), len(tm)),
            "spec_ms": statistics.median(sm), "target_ms": statistics.median(tm),
            "accept": s["tokens_per_step"] / bs}


def crossover(points: list[tuple[int, str]]) -> Optional[int]:
    """(bs, verdict) pairs of one (context, arm): the smallest bs from which no measured bs
    pays (None: it pays at the largest measured bs, or nothing measured)."""
    pts = sorted(points)
    if not pts or pts[-1][1] == R.PAYS:
        return None
    cross = pts[-1][0]
    for bs, v in reversed(pts):
        if v == R.PAYS:
            break
        cross = bs
    return cross


def crossings(doc: dict) -> list[dict]:
    """Per (context, arm): the measured speedups and the crossover."""
    out = []
    for ctx in doc["contexts"]:
        for arm in arms(doc):
            pts = [(bs, sp) for bs in doc["batches"]
                   if (sp := speedup(doc, ctx, arm, bs)) is not None]
            out.append({"ctx": ctx, "arm": arm, "points": pts,
                        "crossover": crossover([(bs, sp["verdict"]) for bs, sp in pts])})
    return out


def _cross_text(c: dict) -> str:
    if not c["points"]:
        return "not measured"
    top = max(bs for bs, _ in c["points"])
    if c["crossover"] is None:
        return f"pays at every measured bs (up to {top})"
    if c["crossover"] == min(bs for bs, _ in c["points"]):
        return f"does not pay at any measured bs (from {c['crossover']})"
    return f"stops paying from bs {c['crossover']}"


# -- the report ------------------------------------------------------------------------------
def answer(doc: dict) -> str:
    parts = [f"{c['arm']} at {ctx_text(c['ctx'])} {_cross_text(c)}" for c in crossings(doc)]
    skipped = sorted({(c["ctx"], c["bs"]) for c in doc["cells"] if c["status"] == "skipped"})
    if skipped:
        parts.append("not measured (see below): " + ", ".join(
            f"{ctx_text(ctx)} bs {bs}" for ctx, bs in skipped[:6])
            + (" ..." if len(skipped) > 6 else ""))
    return ("; ".join(parts) or "nothing measured") + "."


def _magicdec(doc: dict) -> list[str]:
    out = [f"- {MAGICDEC}."]
    for ctx in doc["contexts"]:
        got = [f"{arm} {R.ratio_text(sp['ratio'], sp['noise'], sp['verdict'])} at bs {bs}"
               for arm in arms(doc) for bs in doc["batches"] if bs >= 32
               if (sp := speedup(doc, ctx, arm, bs)) is not None]
        out.append(f"- here at {ctx_text(ctx)}, bs >= 32: " + ("; ".join(got) if got else
                   "not measured (the KV does not fit, or the cells were skipped)"))
    return out


def _table(doc: dict, ctx: int) -> list[str]:
    head = ["bs", "target step ms"] + [f"{a}: step ms, accept / step, speedup"
                                       for a in arms(doc)]
    rows = []
    for bs in doc["batches"]:
        t = _ok(doc, ctx, TARGET, bs)
        row = [str(bs), "-" if t is None else
               f"{statistics.median([x for x in t['ms'] if x is not None]):.3f}"]
        for arm in arms(doc):
            sp = speedup(doc, ctx, arm, bs)
            row.append("-" if sp is None else
                       f"{sp['spec_ms']:.3f}, {sp['accept']:.2f}, "
                       f"{R.ratio_text(sp['ratio'], sp['noise'], sp['verdict'])}")
        if len(row) > 2 and all(x == "-" for x in row[1:]):
            why = next((c["reason"] for c in doc["cells"] if c["ctx"] == ctx and c["bs"] == bs
                        and c["status"] == "skipped"), "not run")
            row = [str(bs)] + [f"skipped: {why}"] + ["-"] * (len(row) - 2)
        rows.append(row)
    return [R.md_table(head, rows)]


def _engines(doc: dict) -> list[str]:
    out = []
    for e in doc["engines"]:
        if e["status"] == "ok":
            out.append(f"- {ctx_text(e['ctx'])} {e['arm']}: bs up to {e['max_bs']}, built in "
                       f"{e['build_s']:.0f} s, prompts prefilled in {e['prefill_s']:.0f} s, "
                       f"{e['steps']} decode steps")
        else:
            out.append(f"- {ctx_text(e['ctx'])} {e['arm']}: {e['status']}: {e['reason']}")
    return out


def render(doc: dict) -> str:
    check(doc)
    parts = [R.header(doc, f"{TITLE} ({doc['model']})"),
             f"- a cell: the decode steps at exactly that batch size, steady (no prefill, no "
             f"request finishing within two iterations), in {doc['windows']} windows; each "
             f"window's p50 step is one measurement; noise = max / min - 1 over the windows "
             f"(a speedup's: the larger of its two sides'), at least {R.MIN_NOISE:.0%}",
             "- speedup = (spec tokens per step / spec step) / (bs / target step); accept / "
             "step = the spec cell's tokens per step per request"]
    parts += [f"- {arm}: " + ", ".join(f"{k} {v}" for k, v in kw.items())
              for arm, kw in doc.get("arm_settings", {}).items() if kw]
    parts += [""]
    parts += R.note_and_answer(doc, answer(doc))
    parts += ["", "## Where speculation stops paying", ""]
    parts += [R.md_table(["context", "arm", "crossover"],
                         [[f"{ctx_text(c['ctx'])}", c["arm"], _cross_text(c)]
                          for c in crossings(doc)])]
    parts += ["", "Beside the field:", "", *_magicdec(doc)]
    for ctx in doc["contexts"]:
        parts += ["", f"## {ctx_text(ctx)} context", "", *_table(doc, ctx)]
    parts += ["", "## Engines", "", *_engines(doc)]
    return "\n".join(parts) + "\n"


# -- the results file ------------------------------------------------------------------------
def check(doc: dict) -> None:
    """ConfigError naming the first field a results file lacks."""
    def need(d, keys, where):
        if not isinstance(d, dict):
            raise ConfigError(f"{where} is not a mapping; write the results with {WRITER}.")
        miss = [k for k in keys if k not in d]
        if miss:
            raise ConfigError(f"{where} lacks {miss}; write the results with {WRITER}.")
    need(doc, DOC_KEYS, f"the {QUESTION} results of {doc.get('date')}_{doc.get('device')}")
    for i, c in enumerate(doc["cells"]):
        need(c, CELL_KEYS + (("ms", "tokens_per_step") if c.get("status") == "ok"
                             else ("reason",)), f"cells[{i}]")


def new_doc(*, model: str, batches: list[int], contexts: list[int], windows: int,
            steps_per_level: int) -> dict:
    return {"question": QUESTION, "kind": KIND, "model": model, "batches": list(batches),
            "contexts": list(contexts), "windows": windows, "steps_per_level": steps_per_level,
            "cells": [], "engines": []}


def merge(old: dict, new: dict) -> dict:
    """`new` with the cells and engines of `old` (a report of the same stamp, written by an
    earlier run) that `new` did not measure again: one report per stamp covers every context
    its runs measured. The commands are joined."""
    if old.get("model") != new["model"] or old.get("batches") != new["batches"]:
        raise ConfigError(f"the report of this stamp measured {old.get('model')} at bs "
                          f"{old.get('batches')}, this run {new['model']} at bs "
                          f"{new['batches']}; give another --out-dir.")
    ran = {(c["ctx"], c["arm"]) for c in new["cells"]}
    cells = [c for c in old["cells"] if (c["ctx"], c["arm"]) not in ran] + new["cells"]
    engines = [e for e in old["engines"] if (e["ctx"], e["arm"]) not in ran] + new["engines"]
    contexts = sorted(set(old["contexts"]) | set(new["contexts"]))
    command = new["command"] if old["command"] == new["command"] else \
        f"{old['command']}; {new['command']}"
    settings = {**old.get("arm_settings", {}), **new.get("arm_settings", {})}
    return {**new, "cells": cells, "engines": engines, "contexts": contexts,
            "command": command, "arm_settings": settings}


