"""Study `deterministic`: what batch-invariant mode (RunConfig `deterministic`) costs, and how
often bf16 greedy spec output diverges from target-only without it (docs/deterministic.md:
the method).

Runner: deterministic_bench.py (`python -m benchmarks.bench_deterministic`: tok/s at bs 1 and
32 of target-only and Frozen-KV MTP, deterministic off and on, the four arms interleaved over
repeats; then, per mode, the requests whose greedy spec output diverges from target-only at
bs 1 / 8 / 32). With --out-dir it hands what it measured to `results_doc` and writes the
report with `reports.write(doc, render)`:

    docs/results/deterministic/<date>_<device>_<commit>.{json,md}

The results file keeps every repeat's tok/s of every arm and each divergence count with its
first positions; the ratios (deterministic / default), their noise and verdicts are computed
from them, so `mtplab report deterministic` regenerates the report.
"""
from __future__ import annotations

import math
import statistics

from ...errors import ConfigError
from .. import reports as R

QUESTION = "deterministic"
TITLE = "Deterministic mode: what batch invariance costs, how often bf16 diverges"
WRITER = "python -m benchmarks.bench_deterministic --out-dir DIR"   # what writes its reports
RATES = ("tok_per_s", "decode_tok_per_s")        # each arm's figures, one value per repeat
RATE_WORDS = {"tok_per_s": "end to end", "decode_tok_per_s": "decode"}
KEYS = {"workload": dict, "throughput": list, "divergence": list}
ARM_KEYS = ("bs", "arm", "deterministic", *RATES)
DIVERGENCE_KEYS = ("deterministic", "arm", "bs", "diverging", "requests", "first")


def results_doc(*, throughput: list[dict], divergence: list[dict], date: str, device: str,
                device_name: str, commit: str, command: str, model: str, new_tokens: int,
                repeats: int, software: str = "", note: str = "") -> dict:
    """A report's results: the stamp (`commit`: reports.report_commit), the workload, one
    record per throughput arm (bs, arm, deterministic, every repeat's RATES) and one per
    divergence cell (mode, spec arm, bs, diverging requests of `requests`, their first
    divergence positions)."""
    doc = R.stamped({"question": QUESTION,
                     "workload": {"model": model, "new_tokens": new_tokens, "repeats": repeats},
                     "throughput": throughput, "divergence": divergence},
                    date=date, device=device, device_name=device_name, commit=commit,
                    command=command, software=software, note=note)
    check(doc)
    return doc


def check(doc: dict) -> None:
    """ConfigError naming the first field a results file lacks or holds in the wrong shape."""
    def bad(what: str):
        raise ConfigError(f"a {QUESTION} results file (date {doc.get('date')!r}, commit "
                          f"{doc.get('commit')!r}): {what}; it is written by `{WRITER}`, "
                          "write it again with that.")
    for k, kind in KEYS.items():
        if not isinstance(doc.get(k), kind):
            bad(f"'{k}' is missing or not a {kind.__name__}")
    for i, a in enumerate(doc["throughput"]):
        miss = [k for k in ARM_KEYS if not isinstance(a, dict) or k not in a]
        if miss:
            bad(f"throughput[{i}] lacks {miss}")
        if not all(isinstance(a[k], list) and a[k] for k in RATES):
            bad(f"throughput[{i}]: {list(RATES)} must each list one value per repeat")
    for i, d in enumerate(doc["divergence"]):
        miss = [k for k in DIVERGENCE_KEYS if not isinstance(d, dict) or k not in d]
        if miss:
            bad(f"divergence[{i}] lacks {miss}")


def spread(xs: list[float]) -> float:
    """max / min - 1 over the repeats (NaN with fewer than two)."""
    return max(xs) / min(xs) - 1 if len(xs) > 1 and min(xs) > 0 else math.nan


def _arm(doc: dict, bs: int, arm: str, det: bool):
    for a in doc["throughput"]:
        if a["bs"] == bs and a["arm"] == arm and bool(a["deterministic"]) == det:
            return a
    return None


def ratios(doc: dict) -> list[dict]:
    """Per bs, arm and figure (RATES): deterministic / default of the repeats' medians, its
    noise (the larger spread of the two sides, at least reports.MIN_NOISE), the repeats a
    side and the verdict (above 1: deterministic mode is faster)."""
    out = []
    for a in doc["throughput"]:
        if a["deterministic"]:
            continue
        on = _arm(doc, a["bs"], a["arm"], True)
        if on is None:
            continue
        for k in RATES:
            off_x, on_x = a[k], on[k]
            r = statistics.median(on_x) / statistics.median(off_x)
            noise = max([R.MIN_NOISE] + [s for s in (spread(on_x), spread(off_x)) if s == s])
            out.append({"bs": a["bs"], "arm": a["arm"], "figure": k,
                        "default": statistics.median(off_x), "det": statistics.median(on_x),
                        "ratio": r, "noise": noise, "n": len(on_x), "n_base": len(off_x),
                        "verdict": R.verdict(r, noise, len(on_x), len(off_x))})
    return out


def _counts(doc: dict, det: bool) -> tuple[int, int]:
    cells = [d for d in doc["divergence"] if bool(d["deterministic"]) == det]
    return sum(d["diverging"] for d in cells), sum(d["requests"] for d in cells)


def answer(doc: dict) -> str:
    parts = []
    dec = [r for r in ratios(doc) if r["figure"] == "decode_tok_per_s"]
    if dec:
        parts.append("decode tok/s deterministic / default " + ", ".join(
            f"{R.ratio_text(r['ratio'], r['noise'], r['verdict'])} ({r['arm']}, bs {r['bs']})"
            for r in dec))
    for det, mode in ((False, "default bf16"), (True, "deterministic")):
        k, n = _counts(doc, det)
        if n:
            cells = [d for d in doc["divergence"] if bool(d["deterministic"]) == det
                     and d["diverging"]]
            where = ", ".join(f"{d['diverging']}/{d['requests']} {d['arm']} bs {d['bs']}"
                              for d in cells)
            parts.append(f"{mode} spec output diverges from target-only in {k} of {n} "
                         "requests" + (f" ({where})" if where else ""))
    return ("; ".join(parts) or "nothing measured") + "."


def _throughput_rows(doc: dict) -> list[list[str]]:
    rows = []
    for r in ratios(doc):
        rows.append([str(r["bs"]), r["arm"], RATE_WORDS[r["figure"]], f"{r['default']:.0f}",
                     f"{r['det']:.0f}", R.ratio_text(r["ratio"], r["noise"], r["verdict"]),
                     f"{r['n']} / {r['n_base']}"])
    return rows


def _divergence_rows(doc: dict) -> tuple[list[list[str]], list[int]]:
    """One row per (mode, spec arm), one cell per bs; and the batch sizes."""
    batches = sorted({d["bs"] for d in doc["divergence"]})
    keys = []
    for d in doc["divergence"]:
        if (d["deterministic"], d["arm"]) not in keys:
            keys.append((d["deterministic"], d["arm"]))
    rows = []
    for det, arm in keys:
        cells = []
        for b in batches:
            c = [d for d in doc["divergence"] if (d["deterministic"], d["arm"], d["bs"])
                 == (det, arm, b)]
            cells.append(f"{c[0]['diverging']}/{c[0]['requests']} {sorted(c[0]['first'])}"
                         if c else "-")
        rows.append(["deterministic" if det else "default", arm, *cells])
    return rows, batches


def render(doc: dict) -> str:
    """The report: its stamp, the workload, the answer, the ratios deterministic / default
    with their noise and verdicts, the divergence counts."""
    check(doc)
    w = doc["workload"]
    div, batches = _divergence_rows(doc)
    parts = [R.header(doc, TITLE),
             f"- workload: {w['model']}, bf16, page 16, CUDA graphs, greedy, {w['new_tokens']} "
             "new tokens per request, held-out prompts of ~256 bytes; the four arms of a batch "
             f"size interleaved over {w['repeats']} repeats, each figure their median",
             f"- noise: an arm's spread is max / min - 1 over its repeats; a ratio's noise the "
             f"larger of its two sides' spreads, at least {R.MIN_NOISE:.0%}", ""]
    parts += R.note_and_answer(doc, answer(doc)) + [
        "", "## Cost: tok/s, deterministic / default", "",
        R.md_table(["bs", "arm", "tok/s", "default", "deterministic",
                    "deterministic / default", "repeats (det / default)"],
                   _throughput_rows(doc)),
        "", "## Divergence from target-only (greedy, same batch size)", "",
        "Requests whose spec output differs from target-only's, of those in the batch, and "
        "their first differing token positions. Deterministic mode must read 0 everywhere.", "",
        R.md_table(["mode", "spec arm", *[f"bs {b}" for b in batches]], div)]
    return "\n".join(parts) + "\n"
