"""Stage spans: one call site per stage, three outputs at once when enabled.

    with spans.stage("verify"):          # a name from stages.py
        ...
emits (1) an NVTX range (Nsight Systems) and (2) `torch.profiler.record_function` (Kineto
shows it on the host and mirrors it on the GPU lane of each stream it launched work on as
`gpu_user_annotation`) when profiling, and (3) a CUDA event pair on the current stream plus
host perf_counter times into the EventTimeline (when one is attached). Disabled spans return one shared
nullcontext: no allocation, no call into torch.

Inside a CUDA graph nothing of this runs (a replay is one host call): the graph replay itself
is wrapped as its stage (e.g. `draft` covers the whole draft graph, the folded seed included),
and Kineto still lists every replayed kernel on its stream. Stage boundaries inside a graph
are therefore not visible; split a segment into its own graph to see it.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from .stages import STAGES, STEP_RE

_NULL = contextlib.nullcontext()


def _check(name: str) -> None:
    if name not in STAGES and not STEP_RE.match(name):
        raise ValueError(f"{name!r} is not a stage name of DESIGN.md (profiling/stages.py).")


class Spans:
    """`annotate`: emit NVTX + record_function (for a profiler / Nsight); off for a
    timeline-only run, whose spans then cost two pooled event records and two clock reads."""

    def __init__(self, enabled: bool = False, timeline=None, annotate: bool = True,
                 stream_name: str = "forward"):
        self.enabled = enabled
        self.timeline = timeline
        self.annotate = annotate
        self.nvtx = annotate and torch.cuda.is_available()
        self.stream_name = stream_name

    @contextlib.contextmanager
    def paused(self):
        """No spans inside (CUDA graph capture: event records and ranges must not be captured)."""
        was, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = was

    def stage(self, name: str, stream: Optional[str] = None):
        """Context manager for one stage (or step) span; `stream` labels the timeline lane."""
        if not self.enabled:
            return _NULL
        return self._span(name, stream or self.stream_name)

    @contextlib.contextmanager
    def _span(self, name: str, stream: str):
        _check(name)
        if self.nvtx:
            torch.cuda.nvtx.range_push(name)
        rec = torch.profiler.record_function(name) if self.annotate else None
        if rec is not None:
            rec.__enter__()
        tl = self.timeline
        mark = tl.begin(name, stream) if tl is not None else None
        try:
            yield
        finally:
            if mark is not None:
                tl.end(mark)
            if rec is not None:
                rec.__exit__(None, None, None)
            if self.nvtx:
                torch.cuda.nvtx.range_pop()


NO_SPANS = Spans(enabled=False)
