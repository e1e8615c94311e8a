"""`mtplab sglang launch`: start `python -m sglang.launch_server` with a RunConfig's knobs,
wait for /health, drive random token-id prompts through /generate, record a profile into
traces/<run>/ and analyse it with mtplab's bubble analyser. `--dry-run` prints the command.
`mtplab sglang models`: config-only model directories for `--dummy-weights true` runs.

launch speaks `mtplab run`'s dialect: every RunConfig field is a flag with the same name,
value syntax and help (flags.add_knob_flags), so the same flags name the same configuration:

    RunConfig flag                       on the server
    --model DIR                          --model-path DIR (the directory SGLang loads)
    --device, --attention-backend,       the server's own (SGLang's names; auto: cuda,
    --cuda-graphs, --deterministic,      triton, True on cuda, SGLang's dtype), resolved for
    --dtype, --context-len,              the server's host, not this one
    --max-total-tokens
    --trace-dir, --run-name,             where the run folder goes; whether and how many steps
    --profile, --profile-active          /start_profile records (default: no profile)
    other knobs SGLang has               the RunConfig (args.server_launch maps and refuses)
    knobs SGLang has no equivalent for   refused when given (NO_EQUIVALENT)

plus its own flags (LAUNCH_FLAGS: the draft directory, the port, the workload, the python).
Errors name the flag (`--draft-model`), not the field.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import orjson

from ..atomic import atomic_write_bytes
from ..config import RunConfig
from ..draft_kinds import DRAFT_KINDS, kinds_where
from ..errors import ConfigError
from ..flags import (FlagParser, add_knob_flags, add_request_flags, as_flags, flag_of, flag_type,
                     given, knob_flags, out_dir, parse_bool, port_number, positive_int)
from ..validate import check_out_dir, check_run_name
from . import client
from .args import FROZEN, ATTENTION_BACKENDS, DEVICES, ServerSpec, check_model_dirs, server_launch

VOCAB_FLOOR = 10          # prompt token ids are drawn from [VOCAB_FLOOR, --vocab)
# `sglang models` without --model: a full-attention preset for EAGLE's Llama target, a
# Gemma-pattern one for the Gemma-4 target of FROZEN_KV_MTP (models.sglang_gemma4_problem)
MODELS_DEFAULT = {"eagle": "random-medium", "frozen": "gemma4-31b-like@6"}
# RunConfig field -> ServerSpec field: knobs of the server itself, resolved on its host.
SERVER_KNOBS = {"model": "model_path", "device": "device", "attention_backend": "attention_backend",
                "cuda_graphs": "cuda_graphs", "deterministic": "deterministic", "dtype": "dtype",
                "context_len": "context_len", "max_total_tokens": "max_total_tokens"}
# Where the run folder goes and what is profiled: the launch's, not the RunConfig's.
RUN_KNOBS = ("trace_dir", "run_name", "profile", "profile_active")
NO_EQUIVALENT = ("layers", "fused", "moe_kernels", "profile_wait", "profile_warmup",
                 "event_timeline", "event_timeline_every", "bubble_meter", "debug_invariants",
                 "debug_future_map", "debug_syncs")
AUTO = {"device": "cuda", "attention_backend": "triton"}      # 'auto' on an SGLang server
# Launch-only flags -> the ServerSpec field or message word they stand for (errors name these).
LAUNCH_FLAGS = {"draft_model_path": "--draft-model", "version": "--sglang-version",
                "port": "--port", "dummy_weights": "--dummy-weights",
                "extra_args": "--extra-args", "token_map": "--token-map"}


@flag_type
def shell_words(text: str) -> tuple:
    """--extra-args: one shell-quoted string -> its words."""
    import shlex
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise ValueError(f"{text!r} is not a shell-quoted list of flags ({e}); close the quote "
                         "or escape it") from None


@flag_type
def vocab_size(text: str) -> int:
    v = positive_int(text)
    if v <= VOCAB_FLOOR:
        raise ValueError(f"must be above {VOCAB_FLOOR} (prompt ids are drawn from "
                         f"[{VOCAB_FLOOR}, vocab)), got {text!r}")
    return v


def build_parser() -> FlagParser:
    p = FlagParser(prog="mtplab sglang", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=FlagParser)
    a = sub.add_parser("launch", help="start an SGLang server, drive a workload, profile it",
                       description="Start an SGLang server with RunConfig knobs (the flags of "
                                   "`mtplab run`), drive random token-id prompts through it "
                                   "and report tok/s, TTFT, TPOT, ITL, accept length (and, "
                                   "with --profile true, the trace's bubbles).")
    notes = {n: "no SGLang equivalent: refused when given" for n in NO_EQUIVALENT}
    notes.update(model="the directory SGLang loads (config.json and weights, or config only "
                       "with --dummy-weights true); required",
                 device="the server's",
                 attention_backend=f"the server's, one of {', '.join(ATTENTION_BACKENDS)}",
                 dtype="the server's (auto: the model's)",
                 cuda_graphs="the server's (default: True on cuda)",
                 profile="record /start_profile into trace_dir/run_name")
    add_knob_flags(a, RunConfig, title="RunConfig knobs (as `mtplab run`)", notes=notes,
                   defaults={"model": "", "device": "auto (cuda)",
                             "attention_backend": "auto (triton)", "run_name": "sglang-<time>"},
                   metavars={"attention_backend": "NAME"},
                   choices={"device": ("auto", *DEVICES),
                            "attention_backend": ("auto", *ATTENTION_BACKENDS)},
                   types={"trace_dir": out_dir})
    s = a.add_argument_group("the server and the workload")
    s.add_argument("--draft-model", dest="draft_model_path", metavar="DIR",
                   help="the draft's directory (an EAGLE draft, or a Frozen-KV assistant for "
                        "--draft frozen_kv_mtp); required with a draft")
    s.add_argument("--token-map", metavar="FILE",
                   help="the hot token ids for --draft-vocab hot:N, passed as "
                        "--speculative-token-map (write one with "
                        "mtplab.sglang.models.write_token_map)")
    s.add_argument("--sglang-version", dest="version", default="0.5.17", metavar="X.Y.Z",
                   help="the server's SGLang version: some flag names changed (default: 0.5.17)")
    s.add_argument("--port", type=port_number, default=30000,
                   help="the server's port on 127.0.0.1; refused when something listens there "
                        "(default: 30000)")
    s.add_argument("--dummy-weights", type=parse_bool, default=False, metavar="{true,false}",
                   help="random weights (--load-format dummy): config-only directories "
                        "(default: false)")
    add_request_flags(s, prompts=16, max_new_tokens=128)
    s.add_argument("--prompt-len", type=positive_int, default=128, metavar="N",
                   help="tokens per prompt (default: 128)")
    s.add_argument("--concurrency", type=positive_int, default=8, metavar="N",
                   help="requests in flight (default: 8)")
    s.add_argument("--vocab", type=vocab_size, default=32000, metavar="N",
                   help=f"prompt token ids are drawn from [{VOCAB_FLOOR}, N) (default: 32000)")
    s.add_argument("--extra-args", default=(), type=shell_words, metavar="'FLAGS'",
                   help="more server flags, one shell-quoted string")
    s.add_argument("--python", default=sys.executable,
                   help="the python that runs sglang.launch_server (default: this one)")
    s.add_argument("--dry-run", action="store_true",
                   help="check everything, print the env and the command line, start nothing")
    m = sub.add_parser("models", help="write config-only model dirs for --dummy-weights runs")
    m.add_argument("--out", required=True, type=out_dir,
                   help="root folder: target/ and draft/ (an EAGLE draft) or assistant/ (a "
                        "Frozen-KV assistant) go under it")
    m.add_argument("--draft", default="eagle", choices=tuple(DRAFT_KINDS),
                   help="the draft kind: for SGLang's EAGLE a Llama target in a preset's shape "
                        "and an EAGLE draft; for FROZEN_KV_MTP a Gemma-4 target and its "
                        "Frozen-KV assistant (needs transformers) (default: eagle)")
    m.add_argument("--model", default=None,
                   help="mtplab preset the target mirrors: for EAGLE one of full-attention "
                        "layers, for FROZEN_KV_MTP one with Gemma's sliding/full pattern "
                        f"(default: {MODELS_DEFAULT['eagle']}, for the Frozen-KV kinds "
                        f"{MODELS_DEFAULT['frozen']})")
    m.add_argument("--layers", type=positive_int, default=None, metavar="N",
                   help="depth of a shape preset, as `mtplab run --layers` (--model X --layers "
                        "N is --model X@N)")
    m.add_argument("--draft-layers", type=positive_int, default=None, metavar="N",
                   help="layers of the EAGLE draft (default: 1); a Frozen-KV assistant mirrors "
                        "mtplab's assistant of that kind")
    return p


def launch_flags() -> dict[str, str]:
    """Every name an error may use -> the flag that sets it."""
    return {**knob_flags(RunConfig), **{spec: flag_of(knob) for knob, spec in
                                        SERVER_KNOBS.items()}, **LAUNCH_FLAGS}


def config_from_args(args) -> tuple[RunConfig, ServerSpec]:
    """(RunConfig of the knobs SGLang maps, ServerSpec of the server's own); see the module
    docstring. The RunConfig is resolved as a CPU config: it carries knobs, not a device."""
    knobs = given(args, RunConfig)
    refused = [k for k in NO_EQUIVALENT if k in knobs]
    if refused:
        raise ConfigError(f"SGLang has no equivalent of {flag_of(refused[0])}; leave it out "
                          "of an SGLang launch.")
    if "model" not in knobs:
        raise ConfigError("--model is required: the directory SGLang loads.")
    server = {SERVER_KNOBS[k]: knobs.pop(k) for k in list(knobs) if k in SERVER_KNOBS}
    for k in RUN_KNOBS:
        knobs.pop(k, None)
    for k, v in AUTO.items():
        if server.get(k, "auto") == "auto":
            server[k] = v
    server.setdefault("cuda_graphs", server["device"] == "cuda")
    if knobs.get("draft") in kinds_where(sglang_algorithm=FROZEN):
        knobs.setdefault("fold_seed", True)         # SGLang's Frozen-KV worker always folds
    cfg = RunConfig(**knobs, device="cpu", cuda_graphs=False)
    spec = ServerSpec(**server, draft_model_path=args.draft_model_path, version=args.version,
                      port=args.port, dummy_weights=args.dummy_weights,
                      extra_args=tuple(args.extra_args), token_map=args.token_map)
    return cfg, spec


def launch(args) -> int:
    """Checks first (knobs, model directories, paths, the python, a free port), then the
    server; its figures count only while the process started here is alive."""
    cfg, spec = config_from_args(args)
    sl = server_launch(cfg, spec)
    check_model_dirs(cfg, spec)
    run_name = args.run_name or time.strftime("sglang-%Y%m%d-%H%M%S")
    check_run_name(run_name)
    out = check_out_dir(Path(args.trace_dir or "traces") / run_name, "--trace-dir/--run-name")
    if shutil.which(args.python) is None:
        raise ConfigError(f"--python {args.python} is not an executable; pass the python that "
                          "has sglang installed.")
    client.check_port_free(spec.host, spec.port)      # a dry run says so too
    if args.dry_run:
        for k, v in sorted(sl.env.items()):
            print(f"export {k}={v}")
        print(sl.shell_line(args.python))
        return 0
    base = f"http://{spec.host}:{spec.port}"
    rng = np.random.default_rng(cfg.seed)
    prompts = rng.integers(VOCAB_FLOOR, args.vocab, size=(args.prompts, args.prompt_len)).tolist()
    default_active = RunConfig.__dataclass_fields__["profile_active"].default
    profile_steps = (args.profile_active or default_active) if args.profile else 0
    proc = subprocess.Popen(sl.command(args.python), env={**os.environ, **sl.env})
    alive = lambda: proc.poll() is None  # noqa: E731
    try:
        client.wait_healthy(base, alive=alive)
        out.mkdir(parents=True, exist_ok=True)          # only once a server of ours answers
        try:
            client.run_workload(base, prompts[: max(1, args.concurrency)], 8, args.concurrency)
            if profile_steps:
                client.start_profile(base, str(out.resolve()), profile_steps, run_name)
            metrics = client.run_workload(base, prompts, args.max_new_tokens, args.concurrency)
            if profile_steps:
                client.stop_profile(base)
            if not alive():
                raise client.ServerError("it exited before the figures were taken")
        except client.ServerError as e:
            if alive():
                raise
            raise client.ServerError(f"the server process exited (code {proc.returncode}) "
                                     f"during the run ({e}); its figures are not reported.") \
                from None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    metrics["server_command"] = sl.shell_line(args.python)
    traces = sorted(out.glob("*.trace.json*"))
    if traces:
        from ..analysis.bubbles import analyze, write_analysis
        res = analyze(traces[0])
        write_analysis(res, out / "analysis")
        metrics["trace"] = str(traces[0])
        metrics["bubble_frac"] = res.summary.get("bubble_frac")
    atomic_write_bytes(out / "metrics.json", orjson.dumps(metrics, option=orjson.OPT_INDENT_2))
    print(orjson.dumps(metrics, option=orjson.OPT_INDENT_2).decode())
    return 0


def write_models(args) -> int:
    """`mtplab sglang models`: a target and its EAGLE draft or Frozen-KV assistant (by the
    kind's SGLang algorithm), config only."""
    from ..models.zoo import with_layers
    from .models import write_gemma4_frozen_dirs, write_llama_eagle_dirs
    frozen = args.draft in kinds_where(sglang_algorithm=FROZEN)
    model = args.model or MODELS_DEFAULT["frozen" if frozen else "eagle"]
    try:
        if args.layers is not None:
            model = with_layers(model, args.layers)
        if not frozen:
            t, d = write_llama_eagle_dirs(args.out, model, draft_layers=args.draft_layers or 1)
        elif args.draft_layers is not None:
            raise ConfigError(f"--draft-layers sets the EAGLE draft's depth; the Frozen-KV "
                              f"assistant of --draft {args.draft} mirrors mtplab's assistant of "
                              "that kind: leave --draft-layers out.")
        else:
            t, d = write_gemma4_frozen_dirs(args.out, model=model, draft=args.draft)
    except (KeyError, ValueError) as e:
        raise ConfigError(str(e).strip("'\"")) from None
    except ImportError as e:
        raise ConfigError(f"--draft {args.draft} writes its configs with transformers' Gemma-4 "
                          f"classes ({e}); pip install transformers.") from None
    print(f"target {t}\n{'assistant' if frozen else 'draft'} {d}")
    return 0


def main_sglang(argv: Optional[list] = None) -> int:
    args = build_parser().parse(argv)
    if isinstance(args, int):
        return args
    try:
        return write_models(args) if args.cmd == "models" else launch(args)
    except (ConfigError, client.ServerError) as e:
        print(f"mtplab sglang {args.cmd}: error: {as_flags(str(e), launch_flags())}",
              file=sys.stderr)
        return 2
