"""Study `regime`: what each scheduling idea and each draft buys, from host-bound to GPU-bound.

Grid: `mtplab bench --groups regime` (regime.yaml here: the ladder of rungs, the arms).
Reading: ladder.py (per rung, x = GPU time / host time per step; per
effect, the median meter_tok_per_s ratio against the repeats' spread).

    doc = results_doc(results, command="mtplab bench --groups regime ...")  # a sweep's rows
    write(doc, render)          # docs/results/regime/<date>_<device>_<commit>.{json,md}
    headline(doc)               # the README's table: each idea at the ends of the ladder

The results file holds the effect table (one row per rung and effect: x, the GPU and host time
per step, the baseline's bubble, the ratio, its noise, the repeats of each side); the report,
the crossovers and the README headline are computed from it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd

from functools import partial

from .. import report as _report
from .. import reports as R

QUESTION = "regime"
TITLE = "Regime: what each idea buys, from host-bound to GPU-bound"
FIELDS = ("rung", "effect", "arm", "baseline", "x", "gpu_us", "host_us", "bubble", "ratio",
          "noise", "n", "n_base", "verdict")
# The README's rows: (idea, the effect of ladder.py EFFECTS that measures it); an idea with no
# effect on the ladder says where it is answered.
HEADLINE = (
    ("overlap (target-only)", "overlap (target)"),
    ("zero_bubble over overlap (target-only)", "zero_bubble (target)"),
    ("zero_bubble over overlap (Frozen-KV MTP)", "zero_bubble (frozen)"),
    ("fold_seed (Frozen-KV MTP, overlap + zero_bubble)", "fold_seed (frozen)"),
    ("Frozen-KV MTP vs target-only (simulated accept 3.0)", "speculation: frozen_kv_mtp"),
    ("EAGLE vs target-only (simulated accept 3.0)", "speculation: eagle"),
    ("page size x topk", None),
)
END = 2.0                      # the headline's rungs: within this factor of the ladder's ends
NOT_ON_LADDER = ("not on the ladder: its trade needs trained drafts' acceptance "
                 "(question `page_topk`)", "not on the ladder")




def results_doc(results: pd.DataFrame, *, command: str, date: str,
                sweep_dir: Optional[str] = None, device: Optional[str] = None,
                note: str = "") -> dict:
    """A report's results from a regime sweep's results table: the stamp (the device and the
    commit from the cells' own columns: one commit, a clean tree) and the effect table."""
    from .ladder import regime_table
    commit, names = R.cells_stamp([R.ok_cells(results)], "run the ladder again")
    t = regime_table(results, sweep_dir=sweep_dir)
    t["verdict"] = [R.verdict(r, s, n, nb) for r, s, n, nb in         # at full precision
                    zip(t["ratio"], t["noise"], t["n"], t["n_base"])]
    rows = [{k: R.plain(r[k]) for k in FIELDS} for r in t.to_dict("records")]
    return {"question": QUESTION, "date": date,
            "device": device or R.device_slug(names[0] if names else ""),
            "device_name": ", ".join(names), "commit": commit, "command": command,
            "software": "", "note": note, "rows": rows}


def frame(doc: dict) -> pd.DataFrame:
    """The effect table of a results doc; `verdict_words` the row's verdict (results.verdict,
    taken at full precision when the results were written), `verdict` the sweep's word for
    it (studies/regime/ladder.py crossovers reads it)."""
    from ..effects import NO_VERDICT
    t = pd.DataFrame(doc["rows"], columns=list(FIELDS)).astype(
        {k: float for k in ("x", "gpu_us", "host_us", "bubble", "ratio", "noise")})
    t["verdict_words"] = t["verdict"]
    t["verdict"] = t["verdict_words"].map({R.PAYS: "faster", R.COSTS: "slower",
                                           R.NOISE: "nothing", R.ONE_REPEAT: NO_VERDICT})
    return t


def ends(t: pd.DataFrame) -> tuple[tuple[str, float], tuple[str, float]]:
    """The rungs the headline quotes, (rung, x) each: of the rungs within a factor END of the
    ladder's least x, the one where the most HEADLINE effects have a verdict (two repeats a
    side), the least x on a tie (the most host-bound); of those within END of the greatest
    x, the same, the greatest x on a tie (the most GPU-bound)."""
    xs = t.dropna(subset=["x"]).groupby("rung", sort=False)["x"].first().sort_values()
    judged = t[t["effect"].isin([e for _, e in HEADLINE if e]) &
               (t["verdict_words"] != R.ONE_REPEAT)].groupby("rung").size()
    low = list(xs[xs <= END * xs.iloc[0]].index)
    high = list(xs[xs >= xs.iloc[-1] / END].index[::-1])
    lo = max(low, key=lambda r: (judged.get(r, 0), -low.index(r)))
    hi = max(high, key=lambda r: (judged.get(r, 0), -high.index(r)))
    return (lo, float(xs[lo])), (hi, float(xs[hi]))


def _cell(t: pd.DataFrame, effect: str, rung: str) -> str:
    r = t[(t["effect"] == effect) & (t["rung"] == rung)]
    if r.empty:
        return "not run at this rung"
    r = r.iloc[0]
    return R.ratio_text(r["ratio"], r["noise"], r["verdict_words"])


def headline_table(doc: dict) -> str:
    t = frame(doc)
    (lo, xlo), (hi, xhi) = ends(t)
    rows = [[idea, *NOT_ON_LADDER] if effect is None
            else [idea, _cell(t, effect, lo), _cell(t, effect, hi)] for idea, effect in HEADLINE]
    return R.md_table(["idea (tok/s ratio vs its baseline)",
                       f"most host-bound: {lo}, x {xlo:.2f}", f"most GPU-bound: {hi}, x {xhi:.2f}"],
                      rows)


def answer(doc: dict) -> str:
    t = frame(doc)
    (lo, xlo), (hi, xhi) = ends(t)

    def say(effect, rung):
        return _cell(t, effect, rung).replace(", ", " (", 1) + ")"

    return (f"most host-bound (x {xlo:.2f}) overlap buys {say('overlap (target)', lo)} and "
            f"Frozen-KV MTP {say('speculation: frozen_kv_mtp', lo)}; most GPU-bound (x {xhi:.2f}) "
            f"overlap buys {say('overlap (target)', hi)} and Frozen-KV MTP "
            f"{say('speculation: frozen_kv_mtp', hi)}.")


def effect_table(t: pd.DataFrame) -> str:
    head = ["effect", "rung", "x = GPU/host", "GPU µs/step (meter)", "host µs/step (p50)",
            "bubble (baseline)", "ratio", "noise", "verdict", "n"]
    rows = [[r["effect"], r["rung"], R.num(r["x"], ".2f"), R.num(r["gpu_us"], ".0f"),
             R.num(r["host_us"], ".0f"), R.num(r["bubble"], ".1%"), R.num(r["ratio"], ".3f"),
             f"±{r['noise']:.1%}", r["verdict_words"], f"{r['n']}/{r['n_base']}"]
            for r in t.to_dict("records")]
    return R.md_table(head, rows)


def render(doc: dict) -> str:
    """The report: its stamp, the answer, the headline table, every effect at every rung, and
    each effect's crossover (studies/regime/ladder.py crossovers)."""
    from .ladder import crossovers
    t = frame(doc)
    parts = [R.header(doc, TITLE), ""]
    parts += R.note_and_answer(doc, answer(doc)) + [
              "",
              "How to read it. A *rung* is one (model, layers, batch size, prompt length) point "
              "of the ladder; an *arm* is one setting measured at every rung; an effect "
              "compares an arm with its baseline arm. *x* = the GPU's busy time per decode "
              "step (the bubble *meter*: wall minus bubble) / the host's own time per step, of "
              "the rung's target-only overlap + zero_bubble arm: x < 1 host-bound, x > 1 "
              "GPU-bound. *ratio* = the median decode tok/s (meter_tok_per_s) of the arm over "
              "its baseline's; *noise* = the larger of the two arms' spread over the "
              "interleaved repeats, (max - min) / median, at least 2%; the *verdict*: "
              f"{R.PAYS} / {R.COSTS} beyond the noise, {R.NOISE}, or {R.ONE_REPEAT} "
              "(a side with one repeat measures no spread; its noise is the 2% floor).", "",
              "## What each idea buys at the two ends of the ladder", "",
              headline_table(doc), "",
              "## Every effect at every rung (rungs in x order)", "",
              effect_table(t), "",
              "## Crossovers: where each effect changes side", ""]
    parts += [f"- {s}" for s in crossovers(t)["sentence"]]
    return "\n".join(parts) + "\n"


def readme_block(doc: dict, link: str) -> str:
    """The README's headline from a report's results (`link`: the report, relative to the
    README): the headline table and one line naming the date, device, commit and command."""
    s = R.stamp_of(doc)
    return "\n".join([
        "What each idea buys: the decode tok/s ratio of its arm over its baseline, ± the noise, "
        "and the verdict, at the most host-bound and the most GPU-bound rung of the ladder "
        "(every term: [Glossary](#glossary)).", "",
        headline_table(doc), "",
        f"Measured {s.date} on {s.device} at commit `{s.commit}` with `{doc['command']}`. "
        f"Every rung and effect: [{Path(link).name}]({link}); every question: "
        f"[docs/results](docs/results/README.md)."])


report = partial(_report, QUESTION)       # a new dated report from a regime sweep's folder
