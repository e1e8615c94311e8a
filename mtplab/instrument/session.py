"""Profiler session: torch.profiler with a wait/warmup/active schedule, one `step()` per engine
step, traces written atomically under the run folder with the name the TensorBoard plugin
reads:  <run_dir>/<worker>.<time_ns>.pt.trace.json.gz

Start it before CUDA graph capture (so CUPTI sees the captured kernels when they replay).
`hooks`: callbacks `fn(step_index)` run right after each profiler step boundary (work that
must fall between profiled steps); `Engine.on_step` hooks run before it, inside the step.
`held()`: while inside, engine steps do not advance the schedule (it stays in `wait`, nothing is
collected), so timed work can run in the same engine before the profiled steps; the schedule
must still be in `wait` when it is entered.
A run shorter than the schedule (wait + warmup + active steps) writes what the active window
recorded, or nothing when it never reached it; `stop()` then returns one line saying so. A
session still open at interpreter exit is stopped by an atexit hook (an open Kineto profiler
torn down at exit can crash the process).
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import gzip
import os
import socket
import tempfile
import time
import weakref
from pathlib import Path
from typing import Callable, Optional

import torch

from ..atomic import atomic_write_bytes
from ..nogc import import_on_bare_thread


class ProfilerSession:
    def __init__(self, run_dir: Path, *, wait: int, warmup: int, active: int, cuda: bool,
                 worker: Optional[str] = None):
        self.run_dir = Path(run_dir)
        self.worker = worker or f"{socket.gethostname()}_{os.getpid()}"
        self.traces: list[Path] = []
        self.hooks: list[Callable[[int], None]] = []
        self.steps = 0
        # Kineto logs every profiler_start/stop on stderr at its USDT level, above ERROR;
        # level 6 is above all its levels. Read when Kineto first starts; a user's value wins.
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        # the writer holds the folder and the trace list, not the session: no reference cycle
        self.prof = torch.profiler.profile(
            activities=acts,
            schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=functools.partial(_write_trace, self.run_dir, self.worker,
                                             self.traces))
        self._open = False
        # this session's own atexit entry (a weak reference: the registry keeps nothing alive),
        # removed by stop()
        self._at_exit = functools.partial(_stop_at_exit, weakref.ref(self))
        self.wait = wait
        self.last_step = wait + warmup + active   # the step() that ends `active` writes the trace
        self._held = False

    @property
    def done(self) -> bool:
        """The active window has ended and its trace is written."""
        return self.steps > self.last_step

    @contextlib.contextmanager
    def held(self):
        if self.steps >= self.wait:
            raise RuntimeError(f"the profiler is past its wait phase (step {self.steps} of "
                               f"wait={self.wait}); hold it before the profiled steps begin.")
        self._held = True
        try:
            yield self
        finally:
            self._held = False

    def start(self) -> None:
        # the profiler's first trace imports torch._inductor (prepare_trace), which imports
        # torch._dynamo: done now, off the engine's stack (nogc.py)
        import_on_bare_thread("torch._inductor.config")
        self.prof.__enter__()
        self._open = True
        atexit.register(self._at_exit)

    def step(self) -> None:
        if not self._open or self._held:
            return
        self.prof.step()
        for h in self.hooks:
            h(self.steps)
        self.steps += 1

    def stop(self) -> Optional[str]:
        """End the session (the active window's trace is written if it had begun). Returns
        None when a trace was written, else one line on why not."""
        if self._open:
            self._open = False
            atexit.unregister(self._at_exit)
            self.prof.__exit__(None, None, None)
        if self.traces:
            return None
        need = self.last_step
        return (f"no profiler trace: the run had {self.steps} engine step(s), fewer than the "
                f"schedule's wait+warmup+active = {need}; lower profile_wait/profile_warmup "
                "or run more steps.")



def _write_trace(run_dir: Path, worker: str, traces: list, prof) -> None:
    """on_trace_ready: export JSON to a temp file, gzip it into place atomically."""
    path = run_dir / f"{worker}.{time.time_ns()}.pt.trace.json.gz"
    run_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=run_dir)
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        atomic_write_bytes(path, gzip.compress(Path(tmp).read_bytes(), compresslevel=6))
    finally:
        os.unlink(tmp)
    traces.append(path)


def _stop_at_exit(ref) -> None:
    session = ref()
    if session is not None:
        session.stop()
