"""`mtplab whatif RUN_DIR`: what a measured run's decode step would do under other settings
(analysis/whatif.py), from its tables alone (never imports torch).

    mtplab whatif RUN_DIR                         # every default what-if + the cause table
    mtplab whatif RUN_DIR --what overlap=on --what "zero_bubble=on,host:loop=0" --what gpu:verify*2
    mtplab whatif RUN_DIR --json                  # one JSON object on stdout

RUN_DIR is a run folder recorded with `mtplab run ... --step-profile true` (or a sweep cell
with `step_profile: true`: its traces/<cell_id>). Bad input prints one line on stderr and
exits with 2.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Sequence

from ..flags import FlagParser
from .whatif import (KNOBS, WhatIfError, cause_table, describe, load_run, predict, replay,
                     self_check, stage_errors)

EXIT_BAD_INPUT = 2


def _parser() -> FlagParser:
    ap = FlagParser(prog="mtplab whatif", description=(
        "Predict decode step time and tok/s of a measured run under other settings by "
        "replaying its step's dependency graph (docs/design.md 'What-if predictor'), and the "
        "tok/s each bubble cause would give back if removed."))
    ap.add_argument("run_dir", help="a run folder with manifest.json, meter_stages.parquet, "
                    "host_steps.parquet and whatif.json (mtplab run --step-profile true)")
    ap.add_argument("--what", action="append", default=None, metavar="W",
                    help=f"a what-if, repeatable: KNOB=on|off ({', '.join(KNOBS)}), "
                         "host:STAGE=US (or *F, +US, -US; STAGE: schedule, prepare, "
                         "process_result, loop or a launch's stage), host:all*F (the host "
                         "F times slower), gpu:STAGE*F (or =US, "
                         "+US, -US); comma-joined parts apply together (default: every knob "
                         "flipped, each host time at 0, the largest device stages at half)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return ap


def _f(x: float, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def report(model, pred, causes) -> str:
    base = replay(model)
    err, warning = self_check(model, base)
    lines = [describe(model),
             f"replayed step {base.period_us:.1f} µs vs measured {model.measured_period_us:.1f} µs "
             f"(self error {err:+.1%}); measured tok/s (decode tokens / meter wall) "
             f"{_f(model.anchor_tok_s, ',.1f')}; a what-if's tok/s = measured x replayed ratio"]
    if warning:
        lines.append(warning)
    lines += ["", "| what-if | step µs | tok/s | ratio | bubble µs | note |",
              "|---|---|---|---|---|---|"]
    for r in pred.to_dict("records"):
        lines.append(f"| {r['what']} | {_f(r['step_us'], '.1f')} | {_f(r['tok_s'], ',.1f')} | "
                     f"{_f(r['ratio'], '.3f')} | {_f(r['bubble_us'], '.1f')} | {r['note']} |")
    lines += ["", "bubble causes of the replayed step (analysis/causes.py names), each removed:",
              "| cause | bubble µs/step | share of step | tok/s if removed | ratio | removed |",
              "|---|---|---|---|---|---|"]
    for r in causes.to_dict("records"):
        lines.append(f"| {r['cause']} | {r['bubble_us']:.1f} | {r['bubble_frac']:.1%} | "
                     f"{_f(r['tok_s'], ',.1f')} | {r['ratio']:.3f} | {r['removed']} |")
    return "\n".join(lines)


def main_whatif(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse(argv)
    if isinstance(ns, int):
        return ns
    try:
        model = load_run(ns.run_dir)
        pred = predict(model, ns.what)
        causes = cause_table(model)
    except (WhatIfError, OSError) as e:      # every file and --what is checked before output
        print(f"mtplab whatif: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if ns.json:
        def nan(df):
            return json.loads(df.to_json(orient="records"))

        base = replay(model)
        err, warning = self_check(model, base)
        print(json.dumps({"measured_period_us": model.measured_period_us,
                          "replayed_period_us": base.period_us, "self_error": err,
                          "self_error_warning": warning,
                          "stage_errors": nan(stage_errors(model, base)),
                          "anchor_tok_s": model.anchor_tok_s, "whatifs": nan(pred),
                          "causes": nan(causes)}))
    else:
        print(report(model, pred, causes))
    return 0


if __name__ == "__main__":
    sys.exit(main_whatif())
