"""The traces/ layout works with `tensorboard --logdir traces` + torch-tb-profiler: each run
folder is a run, the trace file's prefix is the worker."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

pytest.importorskip("tensorboard")
pytest.importorskip("torch_tb_profiler")

from mtplab import Engine, RunConfig

PLUGIN = "/data/plugin/pytorch_profiler"
WAIT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str):
    with urllib.request.urlopen(url, timeout=30) as r:     # a busy CI machine is slow
        return json.loads(r.read())


def test_tensorboard_lists_run_and_worker(tmp_path):
    traces = tmp_path / "traces"
    eng = Engine(RunConfig(device="cpu", profile=True, profile_wait=1, profile_warmup=1,
                           profile_active=3, trace_dir=str(traces), run_name="run1"))
    eng.generate([[5, 6, 7, 8], [9, 10, 11]], max_new_tokens=8, ignore_eos=True)
    trace = eng.finish()["trace0"]
    worker = trace.name.split(".")[0]                  # <worker>.<time_ns>.pt.trace.json.gz
    port = _free_port()
    with open(tmp_path / "tensorboard.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir",
                                 str(traces), "--host", "127.0.0.1", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            _check(f"http://127.0.0.1:{port}{PLUGIN}", proc, worker, tmp_path)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _check(base: str, proc: subprocess.Popen, worker: str, tmp_path) -> None:
    """Poll the plugin until run1 is loaded, then ask for its workers and views."""
    deadline, runs = time.monotonic() + WAIT_S, None
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / "tensorboard.log").read_text()
        try:
            runs = _get(f"{base}/runs")
            if "run1" in runs["runs"] and not runs.get("loading"):
                break
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    assert runs is not None and "run1" in runs["runs"], runs
    q = urllib.parse.urlencode({"run": "run1", "view": "Overview"})
    assert _get(f"{base}/workers?{q}") == [worker]
    assert "Trace" in _get(f"{base}/views?run=run1")
