"""Study `health`: are the engine's figures sound on a device?

Runner: runner.py, entry point `python -m benchmarks.bench_health` (one engine per arm: a
host-bound and a GPU-bound shape, each with overlap + zero_bubble, overlap off and a host delay
planted after every step longer than the GPU step; an MoE target under uniform and zipf
routing). It hands each arm's measured generates to `results_doc` and writes the report with
`results.write(doc, render)`:

    docs/results/health/<date>_<device>_<commit>.{json,md}

The results file keeps every measured generate's figures (FIGURES) and the profiled
generate's trace figures per arm; the report (medians, their range, the checks) is computed
from them, so `mtplab report health` regenerates it.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

from ...health import run_ahead
from .. import reports as R

QUESTION = "health"
TITLE = "Health: are the engine's figures sound on a device?"
WRITER = "python -m benchmarks.bench_health --out-dir DIR"     # what writes its reports
FIGURES = ("decode_tok_per_s", "meter_tok_per_s", "meter_wall_us_per_step", "run_ahead_frac",
           "launch_lead_p10_us", "launch_lead_p50_us", "launch_lead_p90_us", "bubble_frac",
           "draft_busy_frac", "draft_waste_frac", "accept_len", "accept_alarm",
           "experts_per_verify", "experts_per_verify_uniform")
NOTE = "run_ahead_note"                     # why a generate has no run-ahead (CPU: no device)
# The profiled generate's steps: its trace read by `mtplab analyze` (run-ahead, lead p50, the
# device wall per step), and the meter read over the same steps (`traced_meter_figures`).
TRACE = ("run_ahead_frac", "launch_lead_p50_us", "wall_us_per_step", "meter_run_ahead_frac",
         "meter_launch_lead_p50_us", "meter_wall_us_per_step")
PASS, MISS, NA = "PASS", "MISS", "n/a (not measured)"
GPU_BOUND, ZB, OFF = "GPU-bound", "overlap+zb", "overlap off"
CLOSE_TO_1, CLOSE_TO_0 = 0.9, 0.1           # the run-ahead checks' bounds




def arm_record(*, shape: str, model: str, layers: Optional[int], bs: int, regime: str,
               arm: str, delay_us: float, repeats: list[dict], trace: dict) -> dict:
    """One arm of the results file: its shape, setting, planted delay (µs), the FIGURES of
    each measured generate (with its run-ahead note, if any) and the trace's TRACE figures."""
    return {"shape": shape, "model": model, "layers": layers, "bs": bs, "regime": regime,
            "arm": arm, "delay_us": float(delay_us),
            "repeats": [{k: R.plain(r.get(k)) for k in (*FIGURES, NOTE) if r.get(k) is not None}
                        for r in repeats],
            "trace": {k: R.plain(trace.get(k)) for k in TRACE if trace.get(k) is not None}}


def traced_meter_figures(frame, first: int, last: int) -> dict:
    """The meter over its decode steps first..last (`frame`: Engine.meter_frame(); the steps
    the profiler's trace holds, its warm-up skip left out), as TRACE's `meter_*` keys: the
    run-ahead and lead p50 of the leads the trace can also give (every step but the last,
    whose next launch is not in the trace) and the wall per step; NaN without such a step."""
    f = frame[(frame["step"] >= first) & (frame["step"] <= last)
              & frame["name"].str.startswith("step[decode")]
    ra = run_ahead(f.loc[f["step"] < last, "launch_lead_us"])
    return {"meter_run_ahead_frac": ra["run_ahead_frac"],
            "meter_launch_lead_p50_us": ra["launch_lead_p50_us"],
            "meter_wall_us_per_step": float(f["wall_us"].mean()) if len(f) else math.nan}


def results_doc(arms: list[dict], *, date: str, device: str, device_name: str, commit: str,
                command: str, prompt_len: int, out_len: int, repeats: int,
                software: str = "", note: str = "") -> dict:
    """A report's results: the stamp (`commit`: results.report_commit), the workload and the
    arms (`arm_record`)."""
    return R.stamped({"question": QUESTION, "arms": arms,
                      "workload": {"prompt_len": prompt_len, "out_len": out_len,
                                   "repeats": repeats}},
                     date=date, device=device, device_name=device_name, commit=commit,
                     command=command, software=software, note=note)


def _values(arm: dict, key: str) -> list[float]:
    return [float(r[key]) for r in arm["repeats"] if r.get(key) is not None]


def median(arm: dict, key: str) -> float:
    xs = _values(arm, key)
    return statistics.median(xs) if xs else math.nan


def spread(arm: dict, key: str) -> float:
    """The range (max - min) over the measured generates; NaN with fewer than two."""
    xs = _values(arm, key)
    return max(xs) - min(xs) if len(xs) > 1 else math.nan


def _verdict(x: float, ok: bool) -> str:
    return NA if x != x else PASS if ok else MISS


def checks(doc: dict) -> list[dict]:
    """What the figures must read (runner.py's doc): run-ahead close to 1 at the GPU-bound
    shape under overlap + zero_bubble (its median), close to 0 with a host delay longer than
    the GPU step (its median), 0 with overlap off (every generate).
    Each: shape, arm, run-ahead, the expectation, the verdict."""
    out = []
    for a in doc["arms"]:
        ra = median(a, "run_ahead_frac")
        if a["regime"] == GPU_BOUND and a["arm"] == ZB:
            out.append({"shape": a["shape"], "arm": a["arm"], "value": ra,
                        "want": f"close to 1: >= {CLOSE_TO_1}",
                        "verdict": _verdict(ra, ra >= CLOSE_TO_1)})
        if a["delay_us"]:
            out.append({"shape": a["shape"], "arm": f"{a['arm']} ({a['delay_us']:.0f} µs > "
                        "the GPU step)", "value": ra, "want": f"close to 0: <= {CLOSE_TO_0}",
                        "verdict": _verdict(ra, ra <= CLOSE_TO_0)})
        if a["arm"] == OFF:
            top = max(_values(a, "run_ahead_frac"), default=math.nan)
            out.append({"shape": a["shape"], "arm": a["arm"], "value": top, "at_most": True,
                        "want": "0 by construction", "verdict": _verdict(top, top == 0)})
    return out


def _check_line(c: dict) -> str:
    at = "at most " if c.get("at_most") else ""
    return (f"- {c['shape']} {c['arm']}: run-ahead {at}{R.num(c['value'], '.3f')} "
            f"({c['want']}) {c['verdict']}")


def answer(doc: dict) -> str:
    cs = checks(doc)
    ok = [c for c in cs if c["verdict"] == PASS]
    out = f"{len(ok)} of {len(cs)} run-ahead checks pass"
    said = []
    gpu = [c for c in ok if "close to 1" in c["want"]]
    if gpu:
        said.append(f"overlap + zero_bubble runs ahead on {gpu[0]['value']:.3f} of the steps "
                    f"at the GPU-bound {gpu[0]['shape']}")
    delay = [c for c in ok if "close to 0" in c["want"]]
    if delay:
        said.append("a host delay longer than the GPU step leaves at most "
                    f"{max(c['value'] for c in delay):.3f}")
    off = [c for c in ok if c.get("at_most")]
    if off:
        said.append(f"overlap off at most {max(c['value'] for c in off):.3f}")
    if said:
        out += ": " + ", ".join(said)
    for verdict, words in ((MISS, "missed"), (NA, "not measured")):
        bad = [c for c in cs if c["verdict"] == verdict]
        if bad:
            out += f"; {words}: " + ", ".join(
                f"{c['shape']} {c['arm']}" + (f" {c['value']:.3f} ({c['want']})"
                                              if verdict == MISS else "") for c in bad)
    return out + "."


def _main_row(a: dict) -> list[str]:
    t = a["trace"]
    alarm = any(r.get("accept_alarm") for r in a["repeats"])
    return [a["shape"], a["regime"], a["arm"], str(a["bs"]),
            R.num(median(a, "meter_tok_per_s"), ".0f"), R.num(median(a, "run_ahead_frac"), ".3f"),
            f"{R.num(median(a, 'launch_lead_p10_us'), '+.0f')} / "
            f"{R.num(median(a, 'launch_lead_p50_us'), '+.0f')} / "
            f"{R.num(median(a, 'launch_lead_p90_us'), '+.0f')}",
            R.num(t.get("run_ahead_frac"), ".3f"), R.num(t.get("launch_lead_p50_us"), "+.0f"),
            R.num(median(a, "bubble_frac"), ".1%"), R.num(median(a, "draft_busy_frac"), ".1%"),
            R.num(median(a, "draft_waste_frac"), ".1%"), R.num(median(a, "accept_len"), ".2f"),
            str(alarm), f"{R.num(median(a, 'experts_per_verify'), '.1f')} "
                        f"({R.num(median(a, 'experts_per_verify_uniform'), '.1f')})"]


def _profiler_row(a: dict) -> list[str]:
    t = a["trace"]
    return [a["shape"], a["arm"], R.num(median(a, "run_ahead_frac"), ".3f"),
            R.num(t.get("meter_run_ahead_frac"), ".3f"), R.num(t.get("run_ahead_frac"), ".3f"),
            R.num(median(a, "launch_lead_p50_us"), "+.0f"),
            R.num(t.get("meter_launch_lead_p50_us"), "+.0f"),
            R.num(t.get("launch_lead_p50_us"), "+.0f"),
            R.num(median(a, "meter_wall_us_per_step"), ".0f"),
            R.num(t.get("meter_wall_us_per_step"), ".0f"), R.num(t.get("wall_us_per_step"), ".0f")]


PROFILER_NOTE = (
    "Each run-ahead column measures a different run. *measured*: the bubble meter over the "
    "measured generates (profiler idle; the figures above and the checks). *profiled steps*: "
    "the steps the profiler recorded (one more generate, the profiler's warm-up step left "
    "out), read by the meter and, from the Kineto trace, by `mtplab analyze`. Both take a "
    "step's launch as the host's issue of its forward work (the meter's `mark_launch`, the "
    "analyser's first launch call outside `prepare`) and the end of the previous step's last "
    "GPU work, so on the same steps they agree up to the meter's clock offset (a few µs). "
    "Where meter (measured) and meter (profiled steps) differ, the profiler changed the run "
    "(for one, what it costs per launch on the host); where meter (profiled steps) and "
    "trace differ, the two readings of one run disagree. *step wall*: device time per "
    "decode step (the meter's window; the trace's step window).")


def _noise_row(a: dict) -> list[str]:
    tps = median(a, "meter_tok_per_s")
    rel = spread(a, "meter_tok_per_s") / tps if tps else math.nan
    return [a["shape"], a["arm"], R.num(spread(a, "run_ahead_frac"), ".3f"),
            R.num(spread(a, "launch_lead_p50_us"), ".0f"), R.num(rel, ".1%"),
            f"{a['delay_us']:.0f}"]


def render(doc: dict) -> str:
    """The report: its stamp, the workload, the answer, one row per arm (medians), the noise
    (their range over the measured generates) and the checks."""
    w = doc["workload"]
    parts = [R.header(doc, TITLE),
             f"- workload: random prompts of {w['prompt_len']} tokens, {w['out_len']} new "
             "tokens per request, Frozen-KV MTP at a simulated accept length of 3.0, page 16, "
             f"bubble meter on; each figure the median of {w['repeats']} measured generates "
             "after a warm-up, its noise their range (max - min)", ""]
    parts += R.note_and_answer(doc, answer(doc)) + [
              "",
              "How to read it (the figures of mtplab/stats.py). *run-ahead*: the share of "
              "decode steps whose next forward launch was issued before the step's last GPU "
              "work ended (meter: the bubble meter over the measured generates; trace: the "
              "profiled generate's Kineto trace read by `mtplab analyze`, another run: see "
              "\"Run-ahead under the profiler\"); *launch lead*: end of a step's GPU work - "
              "the host's launch of the next step's forward (> 0: run-ahead); *bubble*: the "
              "meter's share of the decode step's wall time that no stage covers; *draft "
              "busy*: the draft's stages' share of the step's GPU busy time; *draft waste*: "
              "draft tokens rejected / proposed; *alarm*: the acceptance alarm; *experts / "
              "verify*: distinct experts per layer one verify's tokens touch (in parentheses: "
              "under uniform routing).", "",
              R.md_table(["shape", "regime", "arm", "bs", "decode tok/s (meter)",
                          "run-ahead (meter)", "launch lead p10 / p50 / p90 µs",
                          "run-ahead (trace)", "trace lead p50 µs", "bubble (meter)",
                          "draft busy", "draft waste", "accept len", "alarm",
                          "experts / verify (uniform)"], [_main_row(a) for a in doc["arms"]]),
              "", "## Run-ahead under the profiler", "", PROFILER_NOTE, "",
              R.md_table(["shape", "arm", "run-ahead: meter (measured)",
                          "meter (profiled steps)", "trace (profiled steps)",
                          "lead p50 µs: meter (measured)", "meter (profiled steps)",
                          "trace (profiled steps)", "step wall µs: meter (measured)",
                          "meter (profiled steps)", "trace (profiled steps)"],
                         [_profiler_row(a) for a in doc["arms"] if a["trace"]]),
              "", "## Noise (range over the measured generates)", "",
              R.md_table(["shape", "arm", "run-ahead", "lead p50 µs", "decode tok/s (meter)",
                          "planted delay µs"], [_noise_row(a) for a in doc["arms"]]),
              "", "## Checks", ""]
    parts += [_check_line(c) for c in checks(doc)]
    notes = sorted({r[NOTE] for a in doc["arms"] for r in a["repeats"] if r.get(NOTE)})
    if notes:
        parts += ["", "Notes: " + "; ".join(notes)]
    return "\n".join(parts) + "\n"
