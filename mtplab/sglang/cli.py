"""`mtplab sglang launch`: start `python -m sglang.launch_server` with a RunConfig's knobs,
wait for /health, drive random token-id prompts through /generate, record a profile into
traces/<run>/ and analyse it with mtplab's bubble analyser. `--dry-run` prints the command.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import orjson

from ..atomic import atomic_write_bytes
from ..config import RunConfig
from ..errors import ConfigError
from . import client
from .args import ServerSpec, server_launch


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtplab sglang")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("launch", help="start an SGLang server, drive a workload, profile it")
    a.add_argument("--model-path", required=True)
    a.add_argument("--draft-model-path")
    a.add_argument("--sglang-version", default="0.5.17")
    a.add_argument("--device", default="cuda")
    a.add_argument("--attention-backend", default="triton")
    a.add_argument("--port", type=int, default=30000)
    a.add_argument("--draft", default="none", choices=("none", "eagle", "frozen_kv_mtp"))
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
    a.add_argument("--prompts", type=int, default=16)
    a.add_argument("--prompt-len", type=int, default=128)
    a.add_argument("--max-new-tokens", type=int, default=128)
    a.add_argument("--concurrency", type=int, default=8)
    a.add_argument("--vocab", type=int, default=32000, help="prompt token ids are drawn below")
    a.add_argument("--profile-steps", type=int, default=20, help="0: no trace")
    a.add_argument("--trace-dir", default="traces")
    a.add_argument("--run-name", default="sglang")
    a.add_argument("--extra-args", default="", help="more server flags, one shell-quoted string")
    a.add_argument("--python", default=sys.executable)
    a.add_argument("--dry-run", action="store_true", help="print env + command line and exit")
    m = sub.add_parser("models", help="write config-only model dirs for --dummy-weights runs")
    m.add_argument("--out", required=True, help="root folder: target/ and draft/ go under it")
    m.add_argument("--model", default="random-medium", help="mtplab preset whose shape to use")
    m.add_argument("--draft-layers", type=int, default=1)
    return p


def config_from_args(args) -> tuple[RunConfig, ServerSpec]:
    cfg = RunConfig(draft=args.draft, num_steps=args.num_steps, topk=args.topk,
                    num_draft_tokens=args.num_draft_tokens, page_size=args.page_size,
                    max_running_requests=args.max_running_requests, overlap=args.overlap,
                    cuda_graphs=False, cuda_graph_max_bs=args.cuda_graph_max_bs,
                    fold_seed=args.fold_seed and args.draft == "frozen_kv_mtp",
                    simulate_accept_len=args.simulate_accept_len, seed=args.seed, device="cpu")
    spec = ServerSpec(model_path=args.model_path, draft_model_path=args.draft_model_path,
                      version=args.sglang_version, device=args.device,
                      attention_backend=args.attention_backend, port=args.port,
                      dummy_weights=args.dummy_weights, deterministic=args.deterministic,
                      cuda_graphs=args.cuda_graphs, extra_args=tuple(shlex.split(args.extra_args)))
    return cfg, spec


def launch(args) -> int:
    cfg, spec = config_from_args(args)
    sl = server_launch(cfg, spec)
    if args.dry_run:
        for k, v in sorted(sl.env.items()):
            print(f"export {k}={v}")
        print(sl.shell_line(args.python))
        return 0
    out = Path(args.trace_dir) / args.run_name
    out.mkdir(parents=True, exist_ok=True)
    base = f"http://{spec.host}:{spec.port}"
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(10, args.vocab, size=(args.prompts, args.prompt_len)).tolist()
    proc = subprocess.Popen(sl.command(args.python), env={**os.environ, **sl.env})
    try:
        client.wait_healthy(base, alive=lambda: proc.poll() is None)
        client.run_workload(base, prompts[: max(1, args.concurrency)], 8, args.concurrency)
        if args.profile_steps:
            client.start_profile(base, str(out.resolve()), args.profile_steps, args.run_name)
        metrics = client.run_workload(base, prompts, args.max_new_tokens, args.concurrency)
        if args.profile_steps:
            client.stop_profile(base)
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
    args = build_parser().parse_args(argv)
    try:
        return write_models(args) if args.cmd == "models" else launch(args)
    except (ConfigError, client.ServerError) as e:
        print(f"mtplab sglang: error: {e}", file=sys.stderr)
        return 2
