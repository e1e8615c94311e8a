"""mtplab command line: run | demo | bench | sweep | analyze | plot | whatif | sglang | report.

`analyze` and `plot` never import torch (they work on any Kineto trace, fast start-up);
`run` exposes every RunConfig field as a --flag with the field's documentation, choices and
default (fields are the knobs of docs/design.md). Commands that own their parser are listed in
EXTERNAL (name -> module, function, help) and dispatched before argparse: add one line there.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import fields, replace
from pathlib import Path
from typing import Optional

from .draft_kinds import DRAFT_CHOICES
from .flags import (FlagParser, add_knob_flags, add_request_flags, as_flags, device_name, given,
                    knob_flags, nonneg_number, out_dir, parse_bool, positive_int)
from .fmt import readable
from .version import __version__

DEMO_PROMPTS = ["def fibonacci(n):", "import os\n\n", "class Stack:\n    def push(self, x):"]
DEMO_MIN_TOKENS = 3      # engine steps the demo's profiler needs: wait 1, warm-up 1, record 1
# Subcommands with their own argument parser: name -> (module, function(argv) -> exit code, help)
EXTERNAL = {
    "bench": ("mtplab.studies.bench", "main_bench", "the standard arms side by side (ratio table)"),
    "sweep": ("mtplab.sweep", "main_sweep", "grids of runs, one process per cell"),
    "analyze": ("mtplab.analysis.cli", "main_analyze", "bubble analysis of a Kineto trace"),
    "plot": ("mtplab.analysis.cli", "main_plot",
             "timeline of a run folder, trace or timeline.parquet (--example: an H100 run)"),
    "whatif": ("mtplab.analysis.whatif_cli", "main_whatif",
               "a measured run's step under other settings (overlap, zero-bubble, fold_seed, "
               "host / GPU time of a stage), and what each bubble cause costs"),
    "sglang": ("mtplab.sglang.cli", "main_sglang",
               "drive a real SGLang server with the same knobs"),
    "report": ("mtplab.studies.cli", "main_report",
               "dated reports written from their results (docs/results), the index, the "
               "README's headline"),
}


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    """One --flag per RunConfig field (flags.add_knob_flags), trace_dir checked before the run."""
    from .config import RunConfig
    add_knob_flags(p, RunConfig, title="RunConfig knobs", types={"trace_dir": out_dir})


def _config_from_args(args: argparse.Namespace):
    from .config import RunConfig
    return RunConfig(**given(args, RunConfig))


METER_BUBBLE_KEYS = ("bubble_frac", "bubble_us_per_step", "draft_busy_frac")   # the meter's clock


def _print_table(rows: list[tuple[str, object]], device: str = "") -> None:
    """`key  value` lines; the bubble meter's figures are named as every table names them
    (sweep/metrics.py meter_name: `bubble_frac (meter, host clock)` on CPU)."""
    from .sweep.metrics import meter_name
    label = {k: f"{k} ({meter_name([device])})" for k in METER_BUBBLE_KEYS}
    w = max(len(label.get(k, k)) for k, _ in rows)
    for k, v in rows:
        print(f"  {label.get(k, k):<{w}}  {readable(v) if isinstance(v, (int, float)) else v}")


def _knob_header(cfg, set_names: set) -> list[str]:
    """The run's header: model, draft, device, dtype, then every other knob whose resolved
    value is not its declared default, split into those given on the command line and those
    'auto' resolved to."""
    from .config import RunConfig
    lead = ("model", "draft", "device", "dtype")
    head = "mtplab run: " + " ".join(f"{k}={getattr(cfg, k)}" for k in lead)
    moved = [f.name for f in fields(RunConfig) if f.name not in lead
             and getattr(cfg, f.name) != RunConfig.__dataclass_fields__[f.name].default]
    lines = [head]
    for label, names in (("set", [n for n in moved if n in set_names]),
                         ("resolved", [n for n in moved if n not in set_names])):
        if names:
            lines.append(f"  {label}: " + " ".join(f"{n}={getattr(cfg, n)}" for n in names))
    return lines


def _write_run(out: Path, cfg, stats: dict, workload: dict) -> list[Path]:
    """<out>/results.json (the stats, the workload, the resolved config) and
    <out>/manifest.json, atomically and as strict JSON (NaN is null)."""
    from .atomic import atomic_write_json
    out.mkdir(parents=True, exist_ok=True)
    man = cfg.manifest()
    res = {"stats": stats, "workload": workload, "config": man["config"]}
    return [atomic_write_json(out / "results.json", res),
            atomic_write_json(out / "manifest.json", man)]


def _check_workload(args) -> None:
    """The relation argparse's per-flag types cannot see."""
    if args.min_prompt_len > args.max_prompt_len:
        raise ValueError(f"--min-prompt-len {args.min_prompt_len} is larger than "
                         f"--max-prompt-len {args.max_prompt_len}; make the minimum <= the "
                         "maximum.")


def _run_folder(cfg, args):
    """`--out DIR` is the run folder: everything the run writes goes there (trace_dir = its
    parent, run_name = its name)."""
    if not args.out:
        return cfg
    from .config import RunConfig
    clash = [f"--{k.replace('_', '-')}" for k in ("trace_dir", "run_name")
             if k in given(args, RunConfig)]
    if clash:
        raise ValueError(f"--out DIR is the run folder, and {' and '.join(clash)} would name "
                         "another; give --out alone (or drop it and use --trace-dir / "
                         "--run-name).")
    out = Path(args.out).absolute()
    if out.parent == out:
        raise ValueError(f"--out {args.out} is the filesystem's root; give a folder for the "
                         "run, e.g. --out runs/a.")
    return replace(cfg, trace_dir=str(out.parent), run_name=out.name)


def cmd_run(args) -> int:
    import random

    from .engine import Engine
    from .models.memory import estimate_memory
    from .stats import LEGEND, health_columns
    _check_workload(args)
    cfg = _run_folder(_config_from_args(args), args)
    if args.step_profile:                 # the predictor pairs host spans with the meter's
        cfg = replace(cfg, bubble_meter=True)
    print(estimate_memory(cfg).describe())          # before anything is allocated
    eng = Engine(cfg)
    rng = random.Random(cfg.seed)
    V = eng.model.config.vocab_size
    prompts = [[rng.randrange(3, V) for _ in range(rng.randint(args.min_prompt_len,
                                                               args.max_prompt_len))]
               for _ in range(args.prompts)]
    eng.generate(prompts, max_new_tokens=args.max_new_tokens, ignore_eos=True,
                 temperature=args.temperature, progress=True)
    eng.check_invariants()
    st = eng.stats()
    if args.step_profile:
        from .sweep import step_profile
        written = step_profile.record(eng, prompts, args.max_new_tokens, args.temperature,
                                      st["meter_tok_per_s"])
        eng.check_invariants()
    else:
        written = {}
    written.update(eng.finish())                 # trace, timeline, meter, manifest
    print("\n".join(_knob_header(cfg, set(given(args, type(cfg))))))
    rows = [(k, v) for k, v in st.items() if not isinstance(v, (dict, list))]
    rows += [(k, v) for k, v in health_columns(st).items() if k.startswith("accept_len_ctx")]
    _print_table(rows, cfg.device)
    for k, _ in rows:
        if k in LEGEND:
            print(f"  - {k}: {LEGEND[k]}")
    if eng.profile_note:
        print(eng.profile_note)
    if args.out:
        workload = {k: getattr(args, k) for k in ("prompts", "max_new_tokens", "min_prompt_len",
                                                  "max_prompt_len", "temperature")}
        for path in _write_run(eng.run_dir, cfg, st, workload):
            written[path.stem] = path
    for name, path in written.items():
        print(f"  wrote {name}: {path}")
    if args.step_profile:
        print(f"  what if: mtplab whatif {eng.run_dir}")
    return 0


def cmd_demo(args) -> int:
    """A profiled run of the default model pair on whatever device is present; writes the
    trace, the bubble tables and a timeline plot under traces/demo-<timestamp>/."""
    import time

    from .analysis.bubbles import write_analysis
    from .analysis.bubbles import analyze_run
    from .analysis.cli import WARMUP_STEPS, time_unit
    from .analysis.example import EXAMPLE_TRACE
    from .analysis.plots import plot_event_timeline, plot_timeline
    from .config import RunConfig
    from .engine import Engine
    from .errors import ConfigError

    if args.max_new_tokens < DEMO_MIN_TOKENS:
        raise ConfigError(f"--max-new-tokens {args.max_new_tokens} is too few for the demo: its "
                          "profiler skips one engine step and warms up for one before it "
                          f"records; give at least {DEMO_MIN_TOKENS}.")
    cfg = RunConfig(model=args.model, draft=args.draft, device=args.device, profile=True,
                    event_timeline=True, trace_dir=args.trace_dir,
                    run_name=time.strftime("demo-%Y%m%d-%H%M%S"),
                    profile_wait=1, profile_warmup=1, profile_active=args.max_new_tokens)
    eng = Engine(cfg)
    outs = eng.generate(DEMO_PROMPTS, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    eng.check_invariants()
    files = eng.finish()
    if "trace0" not in files:        # a draft that took fewer steps than its tokens
        raise ConfigError(f"{eng.profile_note.rstrip('.')} (the demo's --max-new-tokens "
                          f"{args.max_new_tokens}); give more --max-new-tokens.")
    print(f"mtplab demo on {cfg.device} ({cfg.dtype}), model {cfg.model}, draft {cfg.draft}, "
          f"attention {cfg.attention_backend}, cuda_graphs={cfg.cuda_graphs}")
    for p, o in zip(DEMO_PROMPTS, outs):
        print(f"--- {p!r}\n{p}{eng.tokenizer.decode(o)}")
    _print_table([(k, v) for k, v in eng.stats().items() if not isinstance(v, (dict, list))],
                 cfg.device)
    res = analyze_run(files["trace0"])      # the warm-up rule of `mtplab analyze`
    write_analysis(res, eng.run_dir)
    png = eng.run_dir / "timeline.png"
    s = res.summary
    skipped = (f"first {s['skip_steps']} skipped as warm-up, as `mtplab analyze` does"
               if s["skip_steps"] else f"none skipped: warm-up is skipped only past "
               f"{WARMUP_STEPS + 1} steps")
    unit, per = time_unit([s["wall_us"]])
    print(f"profiled steps: {s['n_steps']} analysed ({skipped}), wall "
          f"{s['wall_us'] / per:.3f} {unit}")
    if s.get("device") is not None:
        plot_timeline(files["trace0"], res, path=png)
        print(f"device bubble: {s['bubble_frac']:.1%} of device wall time "
              f"({s['bubble_us'] / 1e3:.2f} ms in {s['n_gaps']} gaps)")
    else:       # CPU: no GPU lanes in the trace; draw the event timeline's host spans
        tl = eng.timeline_frame()
        dec = sorted(tl.loc[tl["stage"].str.startswith("step[decode"), "step"].unique())
        last = int(dec[-1]) if dec else int(tl["step"].max())
        plot_event_timeline(tl, steps=(max(0, last - 5), last), path=png,
                            title=f"mtplab demo on {cfg.device}, last decode steps")
        print("device bubble: none on CPU (work runs on the host thread, so there is no idle "
              f"device to measure); see real H100 bubbles with `mtplab plot --example` "
              f"({EXAMPLE_TRACE.name}) or notebooks/05_trace_explorer.ipynb")
    print(f"wrote {eng.run_dir}/: {', '.join(sorted(p.name for p in eng.run_dir.iterdir()))}")
    return 0


COMMANDS = {"run": cmd_run, "demo": cmd_demo}


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(prog="mtplab", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"mtplab {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=FlagParser)
    r = sub.add_parser("run", help="serve random prompts with one configuration",
                       description="Serve random prompts with one RunConfig; prints the memory "
                                   "estimate, a token progress bar and the stats table.")
    w = r.add_argument_group("workload")
    add_request_flags(w, prompts=8, max_new_tokens=32)
    w.add_argument("--min-prompt-len", type=positive_int, default=8, metavar="N",
                   help="shortest random prompt, tokens (default: 8)")
    w.add_argument("--max-prompt-len", type=positive_int, default=64, metavar="N",
                   help="longest random prompt, tokens (default: 64)")
    w.add_argument("--temperature", type=nonneg_number, default=0.0, metavar="X",
                   help="sampling temperature, 0 = greedy (default: 0.0)")
    w.add_argument("--step-profile", type=parse_bool, default=False, metavar="BOOL",
                   help="run the prompts once more with the host spans of every decode step "
                        "timed beside the bubble meter (turned on), for `mtplab whatif RUN_DIR` "
                        "(host_steps.parquet, whatif.json in the run folder; default: false)")
    r.add_argument("--out", default=None, type=out_dir, metavar="DIR",
                   help="the run folder: everything the run writes goes here (results.json: "
                        "the stats table, the workload, the resolved config; manifest.json; "
                        "the trace, the meter tables and the step profile where recorded), "
                        "for mtplab whatif / analyze / plot DIR (default: trace_dir/run_name)")
    _add_config_flags(r)
    d = sub.add_parser("demo", help="the embedded default run, on whatever device is present")
    d.add_argument("--device", default="auto", type=device_name,
                   help="auto | cpu | cuda | cuda:N (default: auto)")
    d.add_argument("--model", default="tiny-code", help="zoo preset (default: tiny-code)")
    d.add_argument("--draft", default="frozen_kv_mtp", choices=DRAFT_CHOICES,
                   help="draft (default: frozen_kv_mtp)")
    d.add_argument("--trace-dir", default="traces", type=out_dir,
                   help="output root (default: traces)")
    d.add_argument("--max-new-tokens", type=positive_int, default=48,
                   help="tokens per prompt (default: 48)")
    for name, (_, _, text) in EXTERNAL.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def dashed_flags(argv: list) -> list:
    """`--page_size 16` as `--page-size 16`: a flag spelled with a RunConfig field's
    underscores is its dashed flag (values and everything after `--` stay as given)."""
    out, flags = [], True
    for a in argv:
        if a == "--":
            flags = False
        if flags and a.startswith("--") and "_" in a.split("=", 1)[0]:
            name, eq, value = a.partition("=")
            a = name.replace("_", "-") + eq + value
        out.append(a)
    return out


def _unrecognized(parser: argparse.ArgumentParser, cmd: str, extra: list) -> int:
    """One line naming the subcommand, the flags it does not take and the nearest it does."""
    import difflib
    sub = next(a for a in parser._subparsers._group_actions).choices[cmd]
    known = [o for o in sub._option_string_actions if o.startswith("--")]
    near = [m for f in extra if f.startswith("-")
            for m in difflib.get_close_matches(f.split("=", 1)[0], known, n=1)]
    hint = f"; did you mean {', '.join(dict.fromkeys(near))}?" if near else ""
    print(f"mtplab {cmd}: error: unrecognized arguments: {' '.join(extra)}{hint} (see mtplab "
          f"{cmd} --help)", file=sys.stderr)
    return 2


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # external commands dispatch before the config flags are built (which import torch)
        if argv and argv[0] in EXTERNAL:
            module, func, _ = EXTERNAL[argv[0]]
            return getattr(importlib.import_module(module), func)(argv[1:])
        parser = build_parser()
        args, extra = parser.parse_known_args(dashed_flags(argv))
        if extra:
            return _unrecognized(parser, args.cmd, extra)
        from .config import RunConfig
        from .errors import ConfigError
        try:
            return COMMANDS[args.cmd](args)
        except (ConfigError, ValueError) as e:      # field names as the flags that set them
            print(f"mtplab {args.cmd}: error: {as_flags(str(e), knob_flags(RunConfig))}",
                  file=sys.stderr)
            return 2
    except KeyboardInterrupt:      # Ctrl-C: each command has freed what it held on the way out
        print(f"mtplab {argv[0] if argv else ''}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
