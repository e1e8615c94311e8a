"""mtplab command line: run | demo | bench | analyze | plot | sweep.

`analyze` and `plot` never import torch (they work on any Kineto trace, fast start-up);
`run` exposes every RunConfig field as a --flag (fields are the knobs of docs/design.md).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields
from typing import Optional

DEMO_PROMPTS = ["def fibonacci(n):", "import os\n\n", "class Stack:\n    def push(self, x):"]


def _add_config_flags(p: argparse.ArgumentParser, skip: tuple = ()) -> None:
    from .config import RunConfig
    for f in fields(RunConfig):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        ann = str(f.type)
        if "bool" in ann:
            p.add_argument(flag, dest=f.name, default=None,
                           type=lambda s: s.lower() in ("1", "true", "yes", "on"),
                           metavar="{true,false}", help=f"(default {default})")
        else:
            conv = int if "int" in ann else float if "float" in ann else str
            p.add_argument(flag, dest=f.name, default=None, type=conv,
                           help=f"(default {default})")


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


def cmd_run(args) -> int:
    import random

    from .engine import Engine
    from .models.memory import estimate_memory
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

    from .config import RunConfig
    from .engine import Engine
    from .analysis.bubbles import analyze, write_analysis
    from .analysis.plots import plot_event_timeline, plot_timeline

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
    res = analyze(files["trace0"])
    if res.summary["n_steps"] > 2:      # steady state: drop the first profiled step
        res = analyze(files["trace0"], skip_steps=1)
    write_analysis(res, eng.run_dir)
    png = eng.run_dir / "timeline.png"
    if res.summary.get("device") is not None:
        plot_timeline(files["trace0"], res, path=png)
    else:       # CPU: no GPU lanes in the trace; draw the event timeline's host spans
        tl = eng.timeline_frame()
        last = int(tl["step"].max())
        plot_event_timeline(tl, steps=(max(0, last - 5), last), path=png)
    s = res.summary
    print(f"bubble summary (profiled steps): steps={s['n_steps']} wall_us={s['wall_us']:.0f} "
          f"busy_us={s['busy_us']:.0f} bubble_frac={s['bubble_frac']}")
    print(f"wrote {eng.run_dir}/: {', '.join(sorted(p.name for p in eng.run_dir.iterdir()))}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtplab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="serve random prompts with one configuration")
    r.add_argument("--prompts", type=int, default=8, help="number of requests (default 8)")
    r.add_argument("--max-new-tokens", type=int, default=32)
    r.add_argument("--min-prompt-len", type=int, default=8)
    r.add_argument("--max-prompt-len", type=int, default=64)
    r.add_argument("--temperature", type=float, default=0.0)
    _add_config_flags(r)
    d = sub.add_parser("demo", help="the embedded default run, on whatever device is present")
    d.add_argument("--device", default="auto")
    d.add_argument("--model", default="tiny-code")
    d.add_argument("--draft", default="frozen_kv_mtp")
    d.add_argument("--trace-dir", default="traces")
    d.add_argument("--max-new-tokens", type=int, default=48)
    sub.add_parser("bench", help="the standard arms side by side (ratio table)", add_help=False)
    sub.add_parser("sweep", help="grids of runs, one process per cell", add_help=False)
    sub.add_parser("analyze", help="bubble analysis of a Kineto trace", add_help=False)
    sub.add_parser("plot", help="bubble timeline plot of a Kineto trace", add_help=False)
    sub.add_parser("sglang", help="drive a real SGLang server with the same knobs", add_help=False)
    return p


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # analyze/plot: dispatch before building the config flags (which import torch).
    if argv and argv[0] == "sweep":
        from .sweep import main_sweep
        return main_sweep(argv[1:])
    if argv and argv[0] == "bench":
        from .bench import main_bench
        return main_bench(argv[1:])
    if argv and argv[0] == "sglang":
        from .sglang.cli import main_sglang
        return main_sglang(argv[1:])
    if argv and argv[0] in ("analyze", "plot"):
        from .analysis import cli as analyze_cli
        fn = analyze_cli.main_analyze if argv[0] == "analyze" else analyze_cli.main_plot
        return fn(argv[1:])
    args = build_parser().parse_args(argv)
    from .core import ConfigError
    try:
        return {"run": cmd_run, "demo": cmd_demo}[args.cmd](args)
    except (ConfigError, ValueError) as e:
        print(f"mtplab {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
