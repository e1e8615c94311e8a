"""mtplab command line: run | demo | bench | sweep | analyze | plot | sglang.

`analyze` and `plot` never import torch (they work on any Kineto trace, fast start-up);
`run` exposes every RunConfig field as a --flag with the field's documentation, choices and
default (fields are the knobs of docs/design.md). Commands that own their parser are listed in
EXTERNAL (name -> module, function, help) and dispatched before argparse: add one line there.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import MISSING, fields
from typing import Optional

from .draft_kinds import DRAFT_CHOICES
from .validate import FlagParser, device_name, out_dir, positive_int

DEMO_PROMPTS = ["def fibonacci(n):", "import os\n\n", "class Stack:\n    def push(self, x):"]
TRUE, FALSE = ("true", "1", "yes"), ("false", "0", "no")
# Subcommands with their own argument parser: name -> (module, function(argv) -> exit code, help)
EXTERNAL = {
    "bench": ("mtplab.bench", "main_bench", "the standard arms side by side (ratio table)"),
    "sweep": ("mtplab.sweep", "main_sweep", "grids of runs, one process per cell"),
    "analyze": ("mtplab.analysis.cli", "main_analyze", "bubble analysis of a Kineto trace"),
    "plot": ("mtplab.analysis.cli", "main_plot",
             "timeline of a run folder, trace or timeline.parquet (--example: an H100 run)"),
    "sglang": ("mtplab.sglang.cli", "main_sglang", "drive a real SGLang server with the same knobs"),
}


def parse_bool(text: str) -> bool:
    """true/false, 1/0, yes/no in any case; anything else is refused."""
    t = text.strip().lower()
    if t in TRUE or t in FALSE:
        return t in TRUE
    raise argparse.ArgumentTypeError(f"expected true/false/1/0/yes/no, got {text!r}")


def parse_floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers, e.g. 0.5,0.5,0.5."""
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 0.8,0.6,0.4, got {text!r}") from None


def _converter(annotation: str):
    """The argparse type of a RunConfig field from its annotation (a string: postponed)."""
    if "bool" in annotation:
        return parse_bool
    if "tuple" in annotation:
        return parse_floats
    return int if "int" in annotation else float if "float" in annotation else str


def _add_config_flags(p: argparse.ArgumentParser, skip: tuple = ()) -> None:
    """One --flag per RunConfig field: help from the field's `knob` metadata, its choices and
    its default. Flags default to None (= the field's default) so only given ones are passed."""
    from .config import RunConfig
    g = p.add_argument_group("RunConfig knobs")
    for f in fields(RunConfig):
        if f.name in skip:
            continue
        conv = _converter(str(f.type))
        default = f.default if f.default is not MISSING else None
        kw = {"choices": f.metadata["choices"]} if "choices" in f.metadata else {}
        metavar = {parse_bool: "{true,false}", parse_floats: "X,Y,...", int: "N", float: "X",
                   str: None if kw else "TEXT"}[conv]
        text = f.metadata.get("help", "")
        if not (default is None and "(None:" in text):     # else the text says what None means
            text += f" (default: {default})"
        if f.name == "trace_dir":                   # checked, never made, before the run
            conv = out_dir
        g.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, type=conv,
                       metavar=metavar, help=text, **kw)


def _config_from_args(args: argparse.Namespace):
    from .config import RunConfig
    kw = {f.name: getattr(args, f.name) for f in fields(RunConfig)
          if getattr(args, f.name, None) is not None}
    return RunConfig(**kw)


def _print_table(rows: list[tuple[str, object]]) -> None:
    w = max(len(k) for k, _ in rows)
    for k, v in rows:
        if isinstance(v, float):
            v = f"{v:.3f}"
        print(f"  {k:<{w}}  {v}")


def _check_workload(args) -> None:
    if args.prompts < 1 or args.max_new_tokens < 1:
        raise ValueError(f"--prompts and --max-new-tokens must be >= 1, got {args.prompts} and "
                         f"{args.max_new_tokens}.")
    if args.min_prompt_len < 1:
        raise ValueError(f"--min-prompt-len must be >= 1, got {args.min_prompt_len}.")
    if args.min_prompt_len > args.max_prompt_len:
        raise ValueError(f"--min-prompt-len {args.min_prompt_len} is larger than "
                         f"--max-prompt-len {args.max_prompt_len}; make the minimum <= the "
                         "maximum.")


def cmd_run(args) -> int:
    import random

    from .engine import Engine
    from .models.memory import estimate_memory
    _check_workload(args)
    cfg = _config_from_args(args)
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
    written = eng.finish()                       # trace, timeline, manifest (when profiled)
    print(f"mtplab run: model={cfg.model} draft={cfg.draft} device={cfg.device} "
          f"dtype={cfg.dtype} page_size={cfg.page_size} cuda_graphs={cfg.cuda_graphs}")
    _print_table([(k, v) for k, v in st.items() if not isinstance(v, (dict, list))])
    if eng.profile_note:
        print(eng.profile_note)
    for name, path in written.items():
        print(f"  wrote {name}: {path}")
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

    cfg = RunConfig(model=args.model, draft=args.draft, device=args.device, profile=True,
                    event_timeline=True, trace_dir=args.trace_dir,
                    run_name=time.strftime("demo-%Y%m%d-%H%M%S"),
                    profile_wait=1, profile_warmup=1, profile_active=args.max_new_tokens)
    eng = Engine(cfg)
    outs = eng.generate(DEMO_PROMPTS, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    eng.check_invariants()
    files = eng.finish()
    print(f"mtplab demo on {cfg.device} ({cfg.dtype}), model {cfg.model}, draft {cfg.draft}, "
          f"attention {cfg.attention_backend}, cuda_graphs={cfg.cuda_graphs}")
    for p, o in zip(DEMO_PROMPTS, outs):
        print(f"--- {p!r}\n{p}{eng.tokenizer.decode(o)}")
    _print_table([(k, v) for k, v in eng.stats().items() if not isinstance(v, (dict, list))])
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
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=FlagParser)
    r = sub.add_parser("run", help="serve random prompts with one configuration",
                       description="Serve random prompts with one RunConfig; prints the memory "
                                   "estimate, a token progress bar and the stats table.")
    w = r.add_argument_group("workload")
    w.add_argument("--prompts", type=int, default=8, metavar="N",
                   help="number of requests (default: 8)")
    w.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="tokens generated per request (default: 32)")
    w.add_argument("--min-prompt-len", type=int, default=8, metavar="N",
                   help="shortest random prompt, tokens (default: 8)")
    w.add_argument("--max-prompt-len", type=int, default=64, metavar="N",
                   help="longest random prompt, tokens (default: 64)")
    w.add_argument("--temperature", type=float, default=0.0, metavar="X",
                   help="sampling temperature, 0 = greedy (default: 0.0)")
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


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # external commands dispatch before the config flags are built (which import torch)
        if argv and argv[0] in EXTERNAL:
            module, func, _ = EXTERNAL[argv[0]]
            return getattr(importlib.import_module(module), func)(argv[1:])
        args = build_parser().parse_args(argv)
        from .errors import ConfigError
        try:
            return COMMANDS[args.cmd](args)
        except (ConfigError, ValueError) as e:
            print(f"mtplab {args.cmd}: error: {e}", file=sys.stderr)
            return 2
    except KeyboardInterrupt:      # Ctrl-C: each command has freed what it held on the way out
        print(f"mtplab {argv[0] if argv else ''}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
