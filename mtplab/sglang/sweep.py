"""Sweep cells with `backend: sglang` (mtplab/sweep/grid.py accepts these keys, child.py calls
run_cell). The cell's RunConfig maps to server arguments (args.py); the `sglang_*` keys are the
ServerSpec. Cells whose server arguments and environment are equal share one server:

    <sweep out>/sglang/server.json   {key, pid, base_url} of the running server
    <sweep out>/sglang/lease         touched by every cell; the guard (guard.py) ends the server
                                     `sglang_idle_s` seconds after the last touch

A cell with a different key stops the previous server (its own process group) first.
Metric columns: `sglang.<name>` for client.run_workload's figures.
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..atomic import atomic_write_text
from ..config import RunConfig
from ..errors import ConfigError
from . import client
from .args import ServerLaunch, ServerSpec, check_model_dirs, server_launch

SPEC_KEYS = {"sglang_model_path": "model_path", "sglang_draft_model_path": "draft_model_path",
             "sglang_version": "version", "sglang_device": "device",
             "sglang_attention_backend": "attention_backend", "sglang_port": "port",
             "sglang_dummy_weights": "dummy_weights", "sglang_deterministic": "deterministic",
             "sglang_cuda_graphs": "cuda_graphs"}
OTHER_KEYS = {"backend", "sglang_extra_args", "sglang_python", "sglang_idle_s", "sglang_vocab"}
SWEEP_KEYS = frozenset(SPEC_KEYS) | OTHER_KEYS


def check_params(params: dict[str, Any]) -> str | None:
    """The reason a `backend: sglang` cell's extra keys are invalid, else None."""
    unknown = sorted(set(params) - SWEEP_KEYS)
    if unknown:
        return f"unknown settings {unknown} for backend sglang; use {sorted(SWEEP_KEYS)}."
    if "sglang_model_path" not in params:
        return "backend sglang needs sglang_model_path (a local model directory)."
    return None


def spec_from_params(params: dict[str, Any]) -> ServerSpec:
    kw = {SPEC_KEYS[k]: v for k, v in params.items() if k in SPEC_KEYS}
    try:
        kw["extra_args"] = tuple(shlex.split(params.get("sglang_extra_args", "")))
    except (ValueError, AttributeError) as e:
        raise ConfigError(f"sglang_extra_args {params.get('sglang_extra_args')!r} is not a "
                          f"shell-quoted string of flags ({e}).") from None
    return ServerSpec(**kw)


def check_cell(cfg: RunConfig, params: dict[str, Any]) -> None:
    """Everything a cell can be refused for before it runs (the grid drops it): the knobs
    SGLang lacks, the server arguments, the model directories."""
    spec = spec_from_params(params)
    check_model_dirs(cfg, spec)
    server_launch(cfg, spec)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def ensure_server(sl: ServerLaunch, spec: ServerSpec, state_dir: Path, python: str,
                  idle_s: float) -> tuple[str, bool, Callable[[], bool]]:
    """(base_url, started, alive): reuse the running server when its key matches, else start
    one on a free port; `alive()` says whether that server's guard still runs."""
    state_dir.mkdir(parents=True, exist_ok=True)
    state, lease = state_dir / "server.json", state_dir / "lease"
    lease.touch()
    key = json.dumps(sl.key())
    base = f"http://{spec.host}:{spec.port}"
    if state.is_file():
        old = json.loads(state.read_text())
        if old["key"] == key and _alive(old["pid"]):
            alive = lambda: _alive(old["pid"])  # noqa: E731
            client.wait_healthy(old["base_url"], alive=alive)
            return old["base_url"], False, alive
        if _alive(old["pid"]):
            os.killpg(old["pid"], signal.SIGTERM)
            while _alive(old["pid"]):
                time.sleep(0.2)
    client.check_port_free(spec.host, spec.port)     # else another server would be measured
    proc = subprocess.Popen([sys.executable, "-m", "mtplab.sglang.guard", str(lease),
                             str(idle_s), "--", *sl.command(python)],
                            env={**os.environ, **sl.env}, start_new_session=True)
    atomic_write_text(state, json.dumps({"key": key, "pid": proc.pid, "base_url": base}))
    alive = lambda: proc.poll() is None  # noqa: E731 -- a child: poll, never a zombie's pid
    client.wait_healthy(base, alive=alive)
    return base, True, alive


def run_cell(cfg: RunConfig, batch_size: int, requests: int, prompt_len: int,
             output_len: int, warmup_len: int, params: dict[str, Any],
             state_dir: Path) -> dict[str, Any]:
    reason = check_params(params)
    if reason:
        raise ConfigError(reason)
    check_cell(cfg, params)
    spec = spec_from_params(params)
    sl = server_launch(cfg, spec)
    base, started, alive = ensure_server(sl, spec, state_dir,
                                         params.get("sglang_python", sys.executable),
                                         float(params.get("sglang_idle_s", 120.0)))
    rng = np.random.default_rng(cfg.seed)
    vocab = int(params.get("sglang_vocab", 32000))
    prompts = rng.integers(10, vocab, size=(requests, prompt_len)).tolist()
    if warmup_len:
        client.run_workload(base, prompts[:batch_size], warmup_len, batch_size)
    m = client.run_workload(base, prompts, output_len, batch_size)
    if not alive():
        raise client.ServerError("the SGLang server exited during the cell; its figures are "
                                 "not reported.")
    (state_dir / "lease").touch()
    row = {f"sglang.{k}": v for k, v in m.items()}
    row["sglang.server_started"] = started
    row["sglang.server_command"] = sl.shell_line(params.get("sglang_python", "python"))
    return row
