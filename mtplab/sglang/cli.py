"""`mtplab sglang launch`: start `python -m sglang.launch_server` with a RunConfig's knobs,
wait for /health, drive random token-id prompts through /generate, record a profile into
traces/<run>/ and analyse it with mtplab's bubble analyser. `--dry-run` prints the command.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import orjson

from ..atomic import atomic_write_bytes
from ..config import RunConfig
from ..draft_kinds import DRAFT_CHOICES, kinds_where
from ..errors import ConfigError
from ..validate import (FlagParser, check_out_dir, check_run_name, flag_type, nonneg_int,
                        port_number, positive_int)
from . import client
from .args import ATTENTION_BACKENDS, DEVICES, ServerSpec, check_model_dirs, server_launch

VOCAB_FLOOR = 10          # prompt token ids are drawn from [VOCAB_FLOOR, --vocab)


@flag_type
def shell_words(text: str) -> tuple:
    """--extra-args: one shell-quoted string -> its words."""
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


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(prog="mtplab sglang")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=FlagParser)
    a = sub.add_parser("launch", help="start an SGLang server, drive a workload, profile it")
    a.add_argument("--model-path", required=True)
    a.add_argument("--draft-model-path")
    a.add_argument("--sglang-version", default="0.5.17")
    a.add_argument("--device", default="cuda", choices=DEVICES)
    a.add_argument("--attention-backend", default="triton", choices=ATTENTION_BACKENDS)
    a.add_argument("--port", type=port_number, default=30000)
    a.add_argument("--draft", default="none", choices=DRAFT_CHOICES)
    a.add_argument("--num-steps", type=int, default=3)
    a.add_argument("--topk", type=int, default=1)
    a.add_argument("--num-draft-tokens", type=int)
    a.add_argument("--page-size", type=int, default=1)
    a.add_argument("--max-running-requests", type=int, default=32)
    a.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True)
    a.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True)
    a.add_argument("--cuda-graph-max-bs", type=int, default=32)
    a.add_argument("--fold-seed", action=argparse.BooleanOptionalAction, default=True)
    a.add_argument("--simulate-accept-len", type=float)
    a.add_argument("--deterministic", action="store_true")
    a.add_argument("--dummy-weights", action="store_true")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--prompts", type=positive_int, default=16)
    a.add_argument("--prompt-len", type=positive_int, default=128)
    a.add_argument("--max-new-tokens", type=positive_int, default=128)
    a.add_argument("--concurrency", type=positive_int, default=8)
    a.add_argument("--vocab", type=vocab_size, default=32000, help="prompt token ids are drawn below")
    a.add_argument("--profile-steps", type=nonneg_int, default=20, help="0: no trace")
    a.add_argument("--trace-dir", default="traces")
    a.add_argument("--run-name", default="sglang")
    a.add_argument("--extra-args", default=(), type=shell_words,
                   help="more server flags, one shell-quoted string")
    a.add_argument("--python", default=sys.executable)
    a.add_argument("--dry-run", action="store_true", help="print env + command line and exit")
    m = sub.add_parser("models", help="write config-only model dirs for --dummy-weights runs")
    m.add_argument("--out", required=True, help="root folder: target/ and draft/ go under it")
    m.add_argument("--model", default="random-medium", help="mtplab preset whose shape to use")
    m.add_argument("--draft-layers", type=positive_int, default=1)
    return p


def config_from_args(args) -> tuple[RunConfig, ServerSpec]:
    cfg = RunConfig(draft=args.draft, num_steps=args.num_steps, topk=args.topk,
                    num_draft_tokens=args.num_draft_tokens, page_size=args.page_size,
                    max_running_requests=args.max_running_requests, overlap=args.overlap,
                    cuda_graphs=False, cuda_graph_max_bs=args.cuda_graph_max_bs,
                    fold_seed=args.fold_seed and args.draft in kinds_where(seed_forward=True),
                    simulate_accept_len=args.simulate_accept_len, seed=args.seed, device="cpu")
    spec = ServerSpec(model_path=args.model_path, draft_model_path=args.draft_model_path,
                      version=args.sglang_version, device=args.device,
                      attention_backend=args.attention_backend, port=args.port,
                      dummy_weights=args.dummy_weights, deterministic=args.deterministic,
                      cuda_graphs=args.cuda_graphs, extra_args=tuple(args.extra_args))
    return cfg, spec


def launch(args) -> int:
    """Checks first (knobs, model directories, paths, the python, a free port), then the
    server; its figures count only while the process started here is alive."""
    cfg, spec = config_from_args(args)
    sl = server_launch(cfg, spec)
    check_model_dirs(cfg, spec)
    check_run_name(args.run_name)
    out = check_out_dir(Path(args.trace_dir) / args.run_name, "--trace-dir/--run-name")
    if args.dry_run:
        for k, v in sorted(sl.env.items()):
            print(f"export {k}={v}")
        print(sl.shell_line(args.python))
        return 0
    if shutil.which(args.python) is None:
        raise ConfigError(f"--python {args.python} is not an executable; pass the python that "
                          "has sglang installed.")
    client.check_port_free(spec.host, spec.port)
    base = f"http://{spec.host}:{spec.port}"
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(VOCAB_FLOOR, args.vocab, size=(args.prompts, args.prompt_len)).tolist()
    proc = subprocess.Popen(sl.command(args.python), env={**os.environ, **sl.env})
    alive = lambda: proc.poll() is None  # noqa: E731
    try:
        client.wait_healthy(base, alive=alive)
        out.mkdir(parents=True, exist_ok=True)          # only once a server of ours answers
        try:
            client.run_workload(base, prompts[: max(1, args.concurrency)], 8, args.concurrency)
            if args.profile_steps:
                client.start_profile(base, str(out.resolve()), args.profile_steps, args.run_name)
            metrics = client.run_workload(base, prompts, args.max_new_tokens, args.concurrency)
            if args.profile_steps:
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
    """`mtplab sglang models`: a Llama target and its EAGLE draft, config only."""
    from .models import write_llama_eagle_dirs
    try:
        t, d = write_llama_eagle_dirs(args.out, args.model, draft_layers=args.draft_layers)
    except (KeyError, ValueError) as e:
        raise ConfigError(str(e).strip("'\"")) from None
    print(f"target {t}\ndraft {d}")
    return 0


def main_sglang(argv: Optional[list] = None) -> int:
    args = build_parser().parse(argv)
    if isinstance(args, int):
        return args
    try:
        return write_models(args) if args.cmd == "models" else launch(args)
    except (ConfigError, client.ServerError) as e:
        print(f"mtplab sglang: error: {e}", file=sys.stderr)
        return 2
