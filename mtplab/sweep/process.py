"""One cell's process, started and watched wherever the cell runs (the driver itself or a
Dask worker): the only code that touches a cell's folders while it runs.

    run_job(job):  clear cells/<id>/ and traces/<id>/  ->  write spec.json  ->
                   python -m mtplab.sweep.child spec.json --parent <pid>   (own session,
                   stdin a pipe from here, stdout+stderr to cell.log)  ->  wait (timeout)  ->
                   read result.json  ->  CellOutcome

Everything a retry needs is in the job, so running it again (a Dask worker died mid-cell and
the scheduler resubmits it) starts from clean folders. The child dies with this process
(`child.tie_to_parent`: PR_SET_PDEATHSIG on Linux, and EOF on its stdin pipe everywhere), and
its whole session is killed at the timeout. With `job.lock_token` set (Dask), the watcher
also stops the cell once the driver that submitted it no longer holds the out-dir lock.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..atomic import atomic_write_text, open_in_place
from .lock import driver_alive

POLL_S = 1.0          # how often a Dask-run cell checks that its driver is still there


@dataclass(frozen=True)
class CellJob:
    """What it takes to run one cell anywhere that sees the out dir (pure data, picklable)."""

    cell_id: str
    out_dir: str
    spec: dict[str, Any]                 # spec.json (see child.py)
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)   # on top of the runner's environment
    lock_token: str | None = None        # Dask: stop the cell when this driver is gone
    pin_gpu: bool = False                # Dask: the cell sees only its worker's first GPU

    @property
    def cell_dir(self) -> Path:
        return Path(self.out_dir) / "cells" / self.cell_id

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir) / "traces" / self.cell_id

    @property
    def log_path(self) -> Path:
        return self.cell_dir / "cell.log"


@dataclass
class CellOutcome:
    """How the cell's process ended. `rc`: its exit code, None when killed at the timeout;
    `result`: result.json (None when the process died before writing it); `lost`: set by an
    executor when the cell never ran to an end (e.g. its Dask worker kept dying)."""

    rc: int | None
    wall_s: float
    result: dict[str, Any] | None = None
    worker: str = "local"
    lost: str | None = None


def run_job(job: CellJob) -> CellOutcome:
    """Run the cell's process to its end; return how it ended."""
    for d in (job.cell_dir, job.run_dir):          # a retried cell starts clean
        shutil.rmtree(d, ignore_errors=True)
    job.cell_dir.mkdir(parents=True)
    if job.spec.get("notebook_out"):
        Path(job.spec["notebook_out"]).parent.mkdir(parents=True, exist_ok=True)
    spec_path = atomic_write_text(job.cell_dir / "spec.json", json.dumps(job.spec, default=str))
    env = {"OMP_NUM_THREADS": "1", **os.environ, **job.env}
    if job.pin_gpu and env.get("CUDA_VISIBLE_DEVICES"):
        env["CUDA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"].split(",")[0]
    alive = None
    if job.lock_token is not None:
        alive = lambda: driver_alive(job.out_dir, job.lock_token)  # noqa: E731
    argv = [sys.executable, "-m", "mtplab.sweep.child", str(spec_path), "--parent",
            str(os.getpid())]
    t0 = time.perf_counter()
    rc = run_process(argv, job.log_path, job.timeout_s, env, alive)
    wall = time.perf_counter() - t0
    result_path = job.cell_dir / "result.json"
    result = json.loads(result_path.read_text()) if result_path.is_file() else None
    return CellOutcome(rc=rc, wall_s=wall, result=result)


def run_on_worker(job: CellJob) -> CellOutcome:
    """The Dask task of one cell: run its process here; say where it ran."""
    from distributed import get_worker

    out = run_job(job)
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
    out.worker = f"{get_worker().name}" + (f"/gpu{gpu}" if gpu else "")
    return out


def run_process(argv: list[str], log: Path, timeout_s: float, env: dict[str, str],
                alive: Callable[[], bool] | None = None) -> int | None:
    """Exit code of argv (stdout+stderr to `log`), None when killed at the timeout (or when
    `alive()` turned False). Its stdin is a pipe held open here until it ends: the child's
    watchdog sees EOF when this process dies."""
    deadline = time.monotonic() + timeout_s
    with open_in_place(log, "wb") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                             env=env, start_new_session=True)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or (alive is not None and not alive()):
                    break
                try:
                    return p.wait(timeout=min(left, POLL_S) if alive is not None else left)
                except subprocess.TimeoutExpired:
                    continue
            _kill_session(p)
            return None
        except BaseException:                      # interrupted: never leave the cell behind
            _kill_session(p)
            raise
        finally:
            p.stdin.close()


def _kill_session(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
