"""List the host synchronisations left in a loop (CUDA's sync debug mode).

    rec = SyncRecorder(enabled=True)
    with rec.record("decode"):
        ...                      # every synchronizing CUDA call inside is counted
    rec.counts                   # {"decode mtplab/sched/scheduler.py:312": 40, ...}
torch.cuda.set_sync_debug_mode("warn") makes torch warn on synchronizing calls (.item(),
.tolist(), blocking copies, ...); the warning's location is the mtplab line that synced.
Event waits (`copy_done.synchronize()`, the by-design wait on the previous step's results)
are not flagged by torch; the scheduler's `sync` spans show them on the timeline.
"""
from __future__ import annotations

import contextlib
import traceback
import warnings
from collections import Counter

import torch


class SyncRecorder:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.counts: dict = {}
        self._c: Counter = Counter()

    def record(self, label: str):
        if not self.enabled:
            return contextlib.nullcontext()
        return self._record(label)

    @contextlib.contextmanager
    def _record(self, label: str):
        prev = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(prev)
        for w in caught:
            if "synchronizing" in str(w.message):
                self._c[f"{label} {_where(w.filename, w.lineno)}"] += 1
        self.counts = dict(self._c)


def _where(filename: str, lineno: int) -> str:
    i = filename.rfind("mtplab/")
    if i >= 0:
        return f"{filename[i:]}:{lineno}"
    # torch internals: report the innermost mtplab frame of the current stack instead
    for fr in reversed(traceback.extract_stack()):
        j = fr.filename.rfind("mtplab/")
        if j >= 0 and "instrument/syncs.py" not in fr.filename:
            return f"{fr.filename[j:]}:{fr.lineno}"
    return f"{filename}:{lineno}"
