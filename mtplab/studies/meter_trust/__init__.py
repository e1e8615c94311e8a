"""Study `meter_trust`: can the bubble meter (and the event timeline) be trusted, and what do
they cost?

Runners, one module per part of the meter's validation:

    meter_bench.py       `python -m benchmarks.bench_meter`: runs the parts below in order;
                         --out-dir writes this question's dated report
    meter_common.py      the workload (tiny-code frozen, the planted-delay regimes), planted waits
    meter_stats.py       the overhead's ratios and intervals, the targets (numpy only)
    meter_resolution.py  stamp resolution, an eager stamp's host cost, wake-up latency after idle
    meter_host_wake.py   how much slower the host's next work is after it was away
    meter_stamp_cost.py  the stamps' device time per segment graph
    meter_planted.py     planted host delays per step, the meter's rise against d
    meter_profiler.py    meter vs profiler (backlogged, host-bound; the planted delays)
    meter_overhead.py    decode tok/s meter on vs off, engines interleaved; --pool of saved runs
    meter_split.py       the meter's cost outside its graphs, by part
    profile_bench.py     `python -m benchmarks.bench_profile`: event timeline vs profiler
    plain_trace.py       `python -m benchmarks.record_plain_trace`: plain PyTorch traces

`python -m benchmarks.bench_meter --out-dir DIR` hands what each part measured (`PARTS`: per
repeat where the part repeats) to `results_doc` and writes the report with
`reports.write(doc, render)`:

    docs/results/meter_trust/<date>_<device>_<commit>.{json,md}

`render` computes every figure (value, noise, target, PASS/MISS) and the answer from the
results file, so `mtplab report meter_trust` regenerates the report. It imports numpy only.
"""
from __future__ import annotations

import statistics

import numpy as np

from ...errors import ConfigError
from .. import reports as R
from .meter_stats import (OVERHEAD_PCT, PROFILER_POINTS, arm_rate, engine_spread, overhead_ci,
                          planted_tolerance)

QUESTION = "meter_trust"
TITLE = "Meter trust: can the bubble meter be trusted, and what does it cost?"
WRITER = "python -m benchmarks.bench_meter --out-dir DIR"       # what writes its reports
PASS, MISS, STATED = "PASS", "MISS", "stated"
# each part of a results file: the keys of its records (a dict for "resolution", else a list)
PARTS = {
    "resolution": ("n", "min_nonzero_ns", "median_delta_ns", "zero_frac", "ticks",
                   "eager_stamp_us", "launch"),
    "wake": ("kind", "d_ms", "us"),
    "host_wake": ("work", "wait", "d_ms", "us"),
    "stamp_cost": ("bs", "graph", "stamps", "nodes", "off_us", "on_us", "replays"),
    "planted": ("regime", "mode", "model", "draft", "bs", "tokens", "base_us", "wall_us",
                "delays"),
    "planted_profiler": ("d_ms", "meter_us", "profiler_us", "steps", "aligned"),
    "profiler": ("regime", "meter_frac", "profiler_frac", "steps", "aligned"),
    "overhead": ("bs", "tokens", "per_arm", "eager_per_step", "rates"),
    "split": ("bs", "tokens", "rates"),
}
DELAY_KEYS = ("d_ms", "rise_us", "host_us")
MODE_WORDS = {"off": "overlap off", "on+zb": "overlap + zero_bubble"}


def results_doc(parts: dict, *, date: str, device: str, device_name: str, commit: str,
                command: str, software: str = "", note: str = "") -> dict:
    """A report's results: the stamp (`commit`: reports.report_commit) and what each part
    that ran measured (`parts`: part name of PARTS -> its records)."""
    doc = R.stamped({"question": QUESTION, "parts": parts}, date=date, device=device,
                    device_name=device_name, commit=commit, command=command,
                    software=software, note=note)
    check(doc)
    return doc


def check(doc: dict) -> None:
    """ConfigError naming the first thing a results file lacks or holds in the wrong shape."""
    def bad(what: str):
        raise ConfigError(f"a {QUESTION} results file (date {doc.get('date')!r}, commit "
                          f"{doc.get('commit')!r}): {what}; it is written by `{WRITER}`, "
                          "write it again with that.")
    parts = doc.get("parts")
    if not isinstance(parts, dict):
        bad("'parts' is missing or not a mapping of part -> records")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        bad(f"unknown parts {unknown} (known: {list(PARTS)})")
    for name, recs in parts.items():
        recs = [recs] if name == "resolution" else recs
        if not isinstance(recs, list):
            bad(f"part {name!r} is not a list of records")
        for i, rec in enumerate(recs):
            miss = [k for k in PARTS[name] if not isinstance(rec, dict) or k not in rec]
            if miss:
                bad(f"part {name!r}, record {i}, lacks {miss}")
            for j, d in enumerate(rec.get("delays", [])):
                miss = [k for k in DELAY_KEYS if not isinstance(d, dict) or k not in d]
                if miss:
                    bad(f"part {name!r}, record {i}, delay {j}, lacks {miss}")


# -- figures ---------------------------------------------------------------------------------
def _fig(part: str, figure: str, value: str, noise: str, target: str = "-",
         verdict: str = STATED) -> dict:
    return {"part": part, "figure": figure, "value": value, "noise": noise, "target": target,
            "verdict": verdict}


def _pass(ok: bool) -> str:
    return PASS if ok else MISS


def overhead_figures(rec: dict) -> dict:
    """One overhead record's figures (meter_overhead.py's row): the overhead (1 - median of
    the per-repeat on/off ratios of the arms' geometric means, %) with its bootstrap 95%
    interval, the pooled overhead, each arm's engine spread, the repeats."""
    k, r = rec["per_arm"], {n: np.array(v, dtype=float) for n, v in rec["rates"].items()}
    on, off = arm_rate(r, "on", k), arm_rate(r, "off", k)
    total, lo, hi = overhead_ci(on / off, np.random.default_rng(0))
    pooled = 100 * (1 - statistics.harmonic_mean(np.concatenate([r[f"on {i}"] for i in range(k)]))
                    / statistics.harmonic_mean(np.concatenate([r[f"off {i}"]
                                                               for i in range(k)])))
    return {"overhead": total, "lo": lo, "hi": hi, "pooled": pooled, "repeats": int(on.size),
            "off": float(np.median(off)), "on": float(np.median(on)),
            "spread_off": engine_spread(r, "off", k), "spread_on": engine_spread(r, "on", k)}


def figures(doc: dict) -> list[dict]:
    """Every figure of the report: part, figure, value, noise, target and verdict (PASS /
    MISS against its target, `stated` for a figure without one)."""
    p, out = doc["parts"], []
    if "resolution" in p:
        r = p["resolution"]
        out.append(_fig("resolution", f"stamp resolution ({r['n']} back-to-back stamps): "
                        "min nonzero delta", f"{R.num(r['min_nonzero_ns'], '.0f')} ns",
                        f"median delta {r['median_delta_ns']:.0f} ns, {r['zero_frac']:.1%} of "
                        f"deltas 0, {r['ticks']} distinct ticks"))
        xs = r["eager_stamp_us"]
        out.append(_fig("resolution", f"host cost of one eager stamp ({r['launch']})",
                        f"{statistics.median(xs):.2f} µs",
                        f"range {min(xs):.2f}-{max(xs):.2f} µs over {len(xs)} timings"))
    for bs in sorted({s["bs"] for s in p.get("stamp_cost", [])}):
        rows = [s for s in p["stamp_cost"] if s["bs"] == bs]
        off, on = sum(s["off_us"] for s in rows), sum(s["on_us"] for s in rows)
        out.append(_fig("stamp_cost", f"stamps' device time per decode step, bs {bs} "
                        f"({len(rows)} graphs)", f"{on - off:+.1f} µs of {off:.1f} µs",
                        f"one timing of {rows[0]['replays']} replays per graph"))
    for rec in p.get("planted", []):
        where = f"{rec['regime']}, {MODE_WORDS.get(rec['mode'], rec['mode'])}"
        for d in rec["delays"]:
            want = d["d_ms"] * 1e3
            rise = float(np.median(d["rise_us"]))
            q1, q3 = np.percentile(d["rise_us"], [25, 75])
            noise = f"rise IQR [{q1:.0f}, {q3:.0f}] µs over {len(d['rise_us'])} pairs"
            if rec["mode"] == "off":
                tol = planted_tolerance(want)
                out.append(_fig("planted", f"planted delay {want:.0f} µs, {where}: the "
                                "meter's rise", f"{rise:.1f} µs", noise,
                                f"{want:.0f} ± {tol:.0f} µs", _pass(abs(rise - want) <= tol)))
            else:
                out.append(_fig("planted", f"planted delay {want:.0f} µs, {where}: hidden",
                                f"{want - rise:.1f} µs ({(want - rise) / want:.1%})", noise))
    for rec in p.get("profiler", []):
        diff = 100 * (rec["profiler_frac"] - rec["meter_frac"])
        seen = "" if rec["aligned"] else " (step names differ: windows misaligned)"
        backlogged = rec["regime"] == "backlogged"
        out.append(_fig("profiler", f"meter vs profiler, {rec['regime']}: profiler - meter "
                        f"bubble ({100 * rec['meter_frac']:.1f}% vs "
                        f"{100 * rec['profiler_frac']:.1f}%){seen}", f"{diff:+.1f} points",
                        f"one profiled run of {rec['steps']} steps",
                        f"≤ {PROFILER_POINTS:g} points" if backlogged else "-",
                        _pass(abs(diff) <= PROFILER_POINTS and rec["aligned"]) if backlogged
                        else STATED))
    for rec in p.get("planted_profiler", []):
        seen = "" if rec["aligned"] else " (step names differ: windows misaligned)"
        out.append(_fig("planted_profiler", f"planted delay {rec['d_ms'] * 1e3:.0f} µs, "
                        f"host-bound, overlap off: meter - profiler per step{seen}",
                        f"{rec['meter_us'] - rec['profiler_us']:+.1f} µs",
                        f"one profiled run of {rec['steps']} steps"))
    for rec in p.get("overhead", []):
        f = overhead_figures(rec)
        out.append(_fig("overhead", f"meter overhead, decode tok/s, bs {rec['bs']} "
                        f"({rec['per_arm']} engines per arm)", f"{f['overhead']:.2f}%",
                        f"95% interval [{f['lo']:.2f}, {f['hi']:.2f}] over {f['repeats']} "
                        "repeats", f"≤ {OVERHEAD_PCT:g}%", _pass(f["overhead"] <= OVERHEAD_PCT)))
    for rec in p.get("split", []):
        r = {n: np.array(v, dtype=float) for n, v in rec["rates"].items()}
        off = np.sqrt(r["off a"] * r["off b"])
        for name, words in (("U", "graphs unstamped"), ("UD", "graphs and d2h unstamped")):
            out.append(_fig("split", f"meter cost outside its graphs, bs {rec['bs']}, "
                            f"{words}", f"{100 * (1 - float(np.median(r[name] / off))):.2f}%",
                            f"A/A (off b vs off a) "
                            f"{100 * (1 - float(np.median(r['off b'] / r['off a']))):.2f}%, "
                            f"{off.size} repeats"))
    return out


def answer(doc: dict) -> str:
    figs = figures(doc)
    checks = [f for f in figs if f["verdict"] in (PASS, MISS)]
    said = [f"{sum(f['verdict'] == PASS for f in checks)} of {len(checks)} checks pass"
            if checks else "no figure with a target was measured"]
    planted = [f for f in checks if f["part"] == "planted"]
    if planted:
        said.append("the meter reads a planted host delay back within its target in "
                    f"{sum(f['verdict'] == PASS for f in planted)} of {len(planted)} "
                    "(overlap off)")
    for f in checks:
        if f["part"] == "profiler":
            said.append(f"profiler - meter bubble with the GPU backlogged {f['value']}")
    costs = []
    for rec in doc["parts"].get("overhead", []):
        o = overhead_figures(rec)
        costs.append(f"{o['overhead']:.2f}% [{o['lo']:.2f}, {o['hi']:.2f}] at bs {rec['bs']}")
    if costs:
        said.append(f"the meter costs {' and '.join(costs)} of decode tok/s (target "
                    f"≤ {OVERHEAD_PCT:g}%)")
    missed = [f["figure"] for f in checks if f["verdict"] == MISS]
    if missed:
        said.append("missed: " + ", ".join(missed))
    left = [n for n in PARTS if n not in doc["parts"] and n != "wake"]
    if left:
        said.append("not run: " + ", ".join(left))
    return "; ".join(said) + "."


# -- sections ---------------------------------------------------------------------------------
def _by_d(recs: list[dict], key: tuple) -> tuple[list[float], dict]:
    ds = sorted({r["d_ms"] for r in recs})
    rows: dict = {}
    for r in recs:
        rows.setdefault(tuple(r[k] for k in key), {})[r["d_ms"]] = r["us"]
    return ds, rows


def _wake(doc: dict) -> list[str]:
    ds, rows = _by_d(doc["parts"]["wake"], ("kind",))
    body = [[kind, *(f"{np.median(v[d]):.1f} [{np.percentile(v[d], 10):.0f}, "
                     f"{np.percentile(v[d], 90):.0f}] µs" if d in v else "-" for d in ds)]
            for (kind,), v in rows.items()]
    return ["## Wake-up latency", "",
            "Device gap minus host gap between two stamps launched d apart, the GPU idle in "
            "between (median [p10, p90] over the repeats): how much later than its launch "
            "the second stamp starts after d of idle.", "",
            R.md_table(["second stamp", *(f"d = {d:g} ms" for d in ds)], body)]


def _host_wake(doc: dict) -> list[str]:
    ds, rows = _by_d(doc["parts"]["host_wake"], ("work", "wait"))
    body = []
    for (work, wait), v in rows.items():
        base = float(np.median(v[0.0])) if 0.0 in v else float("nan")
        body.append([work, wait, *(f"{np.median(v[d]):.1f}" if d == 0.0 else
                                   f"{np.median(v[d]):.1f} ({np.median(v[d]) - base:+.1f})"
                                   for d in ds)])
    return ["## Host work right after a wait", "",
            "Median µs of each work timed right after a wait of d (the d arms interleaved, GC "
            "off), in parentheses its rise over d = 0: host time a planted delay adds to the "
            "next step beyond d.", "",
            R.md_table(["work", "wait", *(f"d = {d:g} ms" for d in ds)], body)]


def _overhead(doc: dict) -> list[str]:
    body = []
    for rec in doc["parts"]["overhead"]:
        f = overhead_figures(rec)
        body.append([str(rec["bs"]), f"{f['off']:.0f}", f"{f['on']:.0f}",
                     R.num(rec["eager_per_step"], ".1f"),
                     f"{f['overhead']:.2f}% [{f['lo']:.2f}, {f['hi']:.2f}]",
                     f"{f['pooled']:.2f}%", f"{f['spread_off']:.2f}%, {f['spread_on']:.2f}%",
                     str(f["repeats"]), str(rec["tokens"])])
    return ["## Meter overhead", "",
            "Decode tok/s meter on vs off (tiny-code frozen, fold_seed, overlap + zero_bubble), "
            "the arms' engines built and run interleaved; an arm's rate per repeat is the "
            "geometric mean of its engines; overhead = 1 - median of the per-repeat on/off "
            "ratios [bootstrap 95% interval]; pooled = 1 - ratio of the arms' harmonic mean "
            "tok/s; engine spread = (largest - smallest) / median of one arm's engine "
            "medians.", "",
            R.md_table(["bs", "meter off tok/s", "meter on tok/s", "eager stamps / step",
                        "overhead [95%]", "pooled", "engine spread off, on", "repeats",
                        "tokens / generate"], body)]


SECTIONS = {"wake": _wake, "host_wake": _host_wake, "overhead": _overhead}


def render(doc: dict) -> str:
    """The report: its stamp, the answer, one row per figure, then the tables behind the
    figures that need one."""
    check(doc)
    parts = [R.header(doc, TITLE),
             "- targets: a planted host delay d read back within max(5% of d, 10 µs) with "
             f"overlap off; meter vs profiler within {PROFILER_POINTS:g} points with the GPU "
             f"backlogged; the meter's overhead ≤ {OVERHEAD_PCT:g}% of decode tok/s; the "
             "other figures are stated, with no target", ""]
    parts += R.note_and_answer(doc, answer(doc)) + [
        "", "## Figures", "",
        R.md_table(["part", "figure", "value", "noise", "target", "verdict"],
                   [[f["part"], f["figure"], f["value"], f["noise"], f["target"], f["verdict"]]
                    for f in figures(doc)])]
    for name, section in SECTIONS.items():
        if name in doc["parts"]:
            parts += ["", *section(doc)]
    return "\n".join(parts) + "\n"
