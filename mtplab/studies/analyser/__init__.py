"""Study `analyser`: how fast is the trace analyser beside HTA (Holistic Trace Analysis), and
do their idle times agree?

Runner: trace_speed.py (`python -m benchmarks.bench_analyzer`; CPU only, no engine): one
large trace, the arms timed interleaved (A B A B ...) in one process, or each as a fresh
process from its start (`--cli`). It hands the seconds of every repeat of every arm and the
per-stream idle totals of both analysers to `results_doc` and writes the report with
`reports.write(doc, render)`:

    docs/results/analyser/<date>_<device>_<commit>.{json,md}

The results file keeps the measurements only; the medians, each arm's time against mtplab's
with its noise and verdict, the target's check and the idle agreement are computed by
`render`, so `mtplab report analyser` regenerates the report. foreign_traces.py records and
reads the traces of programs that are not mtplab (does every bubble cause hold on them).
"""
from __future__ import annotations

import math
import statistics
from typing import Any

from ...errors import ConfigError
from .. import reports as R

QUESTION = "analyser"
TITLE = "Analyser speed: mtplab beside HTA on one large trace, and their idle times"
WRITER = "python -m benchmarks.bench_analyzer --out-dir DIR"     # what writes its reports
IN_PROCESS, PROCESS_START = "in-process", "process-start"
# the first arm of each mode is the baseline every other arm is set against
MTPLAB, STREAMING = "mtplab (orjson reader)", "mtplab (streaming ijson reader)"
HTA = "HTA TraceAnalysis + get_idle_time_breakdown"
FLOOR, GC_ON = "orjson.loads only, GC paused (parse floor)", "orjson.loads only, GC on"
CLI_MTPLAB = "mtplab analyze --json"
BASELINE = {IN_PROCESS: MTPLAB, PROCESS_START: CLI_MTPLAB}
TARGET = {IN_PROCESS: 3.0, PROCESS_START: 4.0}     # HTA's time / mtplab's, at least
CAUSES = ("host_wait", "kernel_wait", "other")     # HTA's idle categories, both analysers'
EXACT = 1e-6                 # mtplab's idle equals the exact sum of HTA's definition within this


def results_doc(*, mode: str, arms: dict[str, list], trace: dict, idle: list[dict],
                date: str, device: str, device_name: str, commit: str, command: str,
                cpu_seconds: dict[str, list] | None = None, import_s: float | None = None,
                software: str = "", note: str = "") -> dict:
    """A report's results: the stamp (`commit`: reports.report_commit), the trace (what, mb,
    events, x_events), the arms (name -> seconds of each repeat, in run order; from process
    start also each repeat's CPU seconds) and the idle rows (`idle_row`; none without HTA)."""
    cpu = cpu_seconds or {}
    return R.stamped({"question": QUESTION, "mode": mode, "trace": trace, "import_s": import_s,
                      "arms": [{"name": k, "seconds": [float(x) for x in v],
                                **({"cpu_seconds": [float(x) for x in cpu[k]]}
                                   if k in cpu else {})}
                               for k, v in arms.items()],
                      "idle": idle},
                     date=date, device=device, device_name=device_name, commit=commit,
                     command=command, software=software, note=note)


def idle_row(stream: int, mtplab_us: float, exact_us: float, hta_us: float,
             mtplab_by_cause: dict, hta_by_cause: dict) -> dict:
    """One stream's idle µs: mtplab's, the exact (unrounded) sum of HTA's definition, HTA's
    own; each analyser's split into CAUSES (None: the analyser saw no such stream)."""
    def f(x):
        return None if x is None or x != x else float(x)

    def split(d):
        return None if d is None else {c: float(d.get(c, 0.0)) for c in CAUSES}
    return {"stream": int(stream), "mtplab_us": f(mtplab_us), "exact_us": f(exact_us),
            "hta_us": f(hta_us), "mtplab_by_cause": split(mtplab_by_cause),
            "hta_by_cause": split(hta_by_cause)}


# -- the figures, computed from the doc ---------------------------------------------------------
def check(doc: dict) -> None:
    """ConfigError naming what a results file lacks (render's input)."""
    def bad(what):
        raise ConfigError(f"analyser results {doc.get('date')}_{doc.get('device')}_"
                          f"{doc.get('commit')}: {what}; write them again with `{WRITER}`.")
    missing = [k for k in ("question", "date", "device", "commit", "command", "mode", "trace",
                           "arms", "idle") if k not in doc]
    if missing:
        bad(f"no {', '.join(missing)}")
    if doc["mode"] not in BASELINE:
        bad(f"mode {doc['mode']!r} is none of {list(BASELINE)}")
    arms = doc["arms"]
    if (not isinstance(arms, list) or not all(isinstance(a, dict) and "name" in a
                                              and _numbers(a.get("seconds")) for a in arms)):
        bad("each arm needs a name and the seconds of its repeats (a list of numbers)")
    if BASELINE[doc["mode"]] not in [a["name"] for a in arms]:
        bad(f"no arm {BASELINE[doc['mode']]!r}, the baseline")
    if not isinstance(doc["trace"], dict) or "mb" not in doc["trace"]:
        bad("the trace needs its size (mb)")
    if not isinstance(doc["idle"], list) or not all(
            isinstance(r, dict) and {"stream", "mtplab_us", "exact_us", "hta_us"} <= set(r)
            for r in doc["idle"]):
        bad("each idle row needs stream, mtplab_us, exact_us and hta_us")


def _numbers(xs: Any) -> bool:
    return (isinstance(xs, list) and bool(xs)
            and all(isinstance(x, (int, float)) and x > 0 for x in xs))


def _arm(doc: dict, name: str) -> dict:
    return next(a for a in doc["arms"] if a["name"] == name)


def spread(xs: list[float]) -> float:
    """max / min - 1 over the repeats (NaN with fewer than two)."""
    return max(xs) / min(xs) - 1 if len(xs) > 1 else math.nan


def ratio(xs: list[float], base: list[float]) -> dict:
    """median(xs) / median(base): how many times the baseline's time an arm takes (> 1: the
    baseline is faster), its noise (the larger spread of the two, at least reports.MIN_NOISE)
    and the verdict on the baseline (pays: it is faster)."""
    r = statistics.median(xs) / statistics.median(base)
    noise = max([R.MIN_NOISE] + [s for s in (spread(xs), spread(base)) if s == s])
    return {"ratio": r, "noise": noise, "verdict": R.verdict(r, noise, len(xs), len(base))}


def hta_ratio(doc: dict, key: str = "seconds") -> dict | None:
    """HTA's time / mtplab's (`key`: seconds, or cpu_seconds from process start); None
    without an HTA arm."""
    names = [a["name"] for a in doc["arms"]]
    if HTA not in names or key not in _arm(doc, HTA):
        return None
    return ratio(_arm(doc, HTA)[key], _arm(doc, BASELINE[doc["mode"]])[key])


def target_met(doc: dict, r: dict) -> str:
    t = TARGET[doc["mode"]]
    return f"target >= {t:g}x: {'met' if r['ratio'] >= t else 'missed'}"


def idle_totals(doc: dict) -> dict:
    """The idle µs summed over the streams every analyser saw, by analyser."""
    rows = [r for r in doc["idle"]
            if None not in (r["mtplab_us"], r["exact_us"], r["hta_us"])]
    return {k: sum(r[k] for r in rows) for k in ("mtplab_us", "exact_us", "hta_us")}


def idle_agrees(r: dict) -> bool:
    m, x = r["mtplab_us"], r["exact_us"]
    return m is not None and x is not None and abs(m - x) <= EXACT * max(1.0, abs(x))


def answer(doc: dict) -> str:
    mb = doc["trace"]["mb"]
    r = hta_ratio(doc)
    if r is None:
        m = statistics.median(_arm(doc, BASELINE[doc["mode"]])["seconds"])
        return f"mtplab reads a {mb:.1f} MB trace in {m:.2f} s (HTA not timed)."
    start = " from process start (wall)" if doc["mode"] == PROCESS_START else ""
    out = (f"HTA takes {r['ratio']:.2f} times mtplab's time on a {mb:.1f} MB trace{start}: "
           f"{R.ratio_text(r['ratio'], r['noise'], r['verdict'])} ({target_met(doc, r)})")
    if doc["idle"]:
        ok = sum(idle_agrees(r) for r in doc["idle"])
        t = idle_totals(doc)
        bias = t["hta_us"] / t["mtplab_us"] - 1 if t["mtplab_us"] else math.nan
        out += (f"; mtplab's idle time equals HTA's definition summed exactly on {ok} of "
                f"{len(doc['idle'])} streams, HTA's own rounding adds {bias:+.2%}")
    return out + "."


# -- the report --------------------------------------------------------------------------------
def _runs(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs)


def speed_table(doc: dict) -> str:
    base = _arm(doc, BASELINE[doc["mode"]])
    cpu = all("cpu_seconds" in a for a in doc["arms"])
    head = ["arm", "median s", "runs (s)", "arm s / mtplab s (noise, verdict on mtplab)"]
    if cpu:
        head[2:2] = ["CPU s (median)"]
        head.append("arm CPU s / mtplab CPU s")
    rows = []
    for a in doc["arms"]:
        r = ratio(a["seconds"], base["seconds"])
        row = [a["name"], f"{statistics.median(a['seconds']):.2f}", _runs(a["seconds"]),
               "baseline" if a is base else R.ratio_text(r["ratio"], r["noise"], r["verdict"])]
        if cpu:
            c = ratio(a["cpu_seconds"], base["cpu_seconds"])
            row[2:2] = [f"{statistics.median(a['cpu_seconds']):.2f}"]
            row.append("baseline" if a is base else
                       R.ratio_text(c["ratio"], c["noise"], c["verdict"]))
        rows.append(row)
    return R.md_table(head, rows)


def _by_cause(d: dict | None) -> str:
    return "-" if d is None else "/".join(f"{d[c]:.0f}" for c in CAUSES)


def idle_table(doc: dict) -> str:
    rows = []
    for r in doc["idle"]:
        m, x, h = r["mtplab_us"], r["exact_us"], r["hta_us"]
        bias = h / m - 1 if None not in (m, h) and m else math.nan
        rows.append([str(r["stream"]), R.num(m, ".1f"), R.num(x, ".1f"), R.num(h, ".1f"),
                     R.num(bias, "+.2%"), "yes" if idle_agrees(r) else "no",
                     _by_cause(r.get("mtplab_by_cause")), _by_cause(r.get("hta_by_cause"))])
    t = idle_totals(doc)
    bias = t["hta_us"] / t["mtplab_us"] - 1 if t["mtplab_us"] else math.nan
    rows.append(["all", f"{t['mtplab_us']:.1f}", f"{t['exact_us']:.1f}", f"{t['hta_us']:.1f}",
                 R.num(bias, "+.2%"), "", "", ""])
    return R.md_table(["stream", "mtplab idle", "exact HTA def.", "HTA idle", "HTA bias",
                       "mtplab = exact", "mtplab host/kernel/other", "HTA host/kernel/other"],
                      rows)


def tables(doc: dict) -> str:
    """The report's body below its answer: the workload, the speed table, the idle table."""
    check(doc)
    t, n = doc["trace"], len(_arm(doc, BASELINE[doc["mode"]])["seconds"])
    events = (f", {t['events']:,} events ({t['x_events']:,} complete 'X')"
              if t.get("events") is not None else "")
    if doc["mode"] == PROCESS_START:
        how = (f"each arm a fresh Python process timed from its start to its exit (interpreter "
               f"start, imports, parse, analysis, output), median of {n} interleaved runs")
        if doc.get("import_s") is not None:
            how += f"; import of mtplab.analysis.cli {doc['import_s']:.3f} s (`-X importtime`)"
    else:
        how = f"all arms in one process, median of {n} interleaved runs after a warm-up each"
    parts = [f"- trace: {t['what']}: {t['mb']:.1f} MB JSON{events}", f"- timing: {how}", "",
             "How to read it: *arm s / mtplab s* is how many times mtplab's time an arm takes "
             "(> 1: mtplab is faster); its noise is the larger relative spread (max / min - 1) "
             "of the two arms' runs, at least 2%; the verdict is mtplab's against that arm.", "",
             speed_table(doc)]
    r = hta_ratio(doc)
    if r is not None:
        parts += ["", f"HTA / mtplab = {R.ratio_text(r['ratio'], r['noise'], r['verdict'])} "
                      f"({target_met(doc, r)})"]
    if doc["idle"]:
        parts += ["", "## Idle time per stream, µs", "",
                  "mtplab: exact float µs; *exact HTA def.*: the sum of `ts - previous end` "
                  "over the same activities (kernels, memcpy, memset) without rounding; HTA "
                  "rounds each start up and each end down, so every gap grows by up to 2 µs. "
                  "Split by HTA's categories (host_wait / kernel_wait / other).", "",
                  idle_table(doc)]
    return "\n".join(parts)


def render(doc: dict) -> str:
    """The report: its stamp, the answer, the trace and timing, the speed table (each arm's
    time against mtplab's with its noise and verdict), the idle agreement."""
    check(doc)
    return "\n".join([R.header(doc, TITLE), ""] + R.note_and_answer(doc, answer(doc))
                     + ["", tables(doc)]) + "\n"
