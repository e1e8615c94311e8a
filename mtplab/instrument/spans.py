"""Stage spans: one call site per stage, up to four outputs at once.

    with spans.stage("verify"):          # a name from stages.py
        ...
emits (1) an NVTX range (Nsight Systems) and (2) `torch.profiler.record_function` (Kineto
shows it on the host and mirrors it on the GPU lane of each stream it launched work on as
`gpu_user_annotation`) when profiling, and (3) a CUDA event pair on the current stream plus
host perf_counter times into the EventTimeline (when one is attached), and (4) with a
BubbleMeter attached, device time stamps at the stage's boundaries (instrument/meter.py; the
meter runs on every step, independent of `enabled` and of timeline sampling), and (5) with a
HostClock attached while spans are off (`host_clock`, instrument/hostclock.py), the host
time of the span. Disabled spans without a meter or a clock return one shared nullcontext:
no allocation, no call into torch.

Inside a CUDA graph nothing of this runs (a replay is one host call): the graph replay itself
is wrapped as its stage (e.g. `draft` covers the whole draft graph, the folded seed included;
`graphed=True` says so, and the meter's stamps are then inside the graph instead),
and Kineto still lists every replayed kernel on its stream. Stage boundaries inside a graph
are therefore not visible; split a segment into its own graph to see it.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..stages import STAGES, STEP_RE

_NULL = contextlib.nullcontext()


_checked: tuple = (set(), set())         # names checked as a stage, as a step span


def _check(name: str, step: bool = False) -> None:
    """A stage name for `stage`, a step span name for `step` (checked once per name)."""
    if name in _checked[step]:
        return
    if step and not STEP_RE.match(name):
        raise ValueError(f"{name!r} is not a step span name (step[decode bs=N]).")
    if not step and STEP_RE.match(name):
        raise ValueError(f"{name!r} is a step span: open it with Spans.step, not stage.")
    if not step and name not in STAGES:
        raise ValueError(f"{name!r} is not a stage name of docs/design.md (mtplab/stages.py).")
    _checked[step].add(name)


class _Span:
    """One enabled span (a plain context manager: cheaper than a generator-based one)."""

    __slots__ = ("spans", "name", "stream", "rec", "mark", "meter")

    def __init__(self, spans: "Spans", name: str, stream: str, meter):
        self.spans, self.name, self.stream, self.meter = spans, name, stream, meter

    def __enter__(self):
        sp = self.spans
        if sp.nvtx:
            torch.cuda.nvtx.range_push(self.name)
        self.rec = torch.profiler.record_function(self.name) if sp.annotate else None
        if self.rec is not None:
            self.rec.__enter__()
        tl = sp.timeline
        self.mark = tl.begin(self.name, self.stream) if tl is not None else None
        self.meter.__enter__()
        return self

    def __exit__(self, *exc):
        sp = self.spans
        self.meter.__exit__(None, None, None)
        if self.mark is not None:
            sp.timeline.end(self.mark)
        if self.rec is not None:
            self.rec.__exit__(None, None, None)
        if sp.nvtx:
            torch.cuda.nvtx.range_pop()
        return False


class Spans:
    """`annotate`: emit NVTX + record_function (for a profiler / Nsight); off for a
    timeline-only run, whose spans then cost two pooled event records and two clock reads.
    `sample_every` N > 1 (timeline-only runs): spans are emitted on every N-th engine step
    only (`begin_step`); the other steps pay one attribute test per span."""

    def __init__(self, enabled: bool = False, timeline=None, annotate: bool = True,
                 stream_name: str = "forward", sample_every: int = 1, meter=None):
        self.enabled = enabled
        self.meter = meter
        self.timeline = timeline
        self.annotate = annotate
        self.nvtx = annotate and torch.cuda.is_available()
        self.stream_name = stream_name
        self.sample_every = 1 if annotate else max(1, sample_every)
        self._master = enabled
        self.host_clock = None      # a HostClock (instrument/hostclock.py): host µs per stage

    def begin_step(self, step: int) -> None:
        """Called by the scheduler at the start of engine step `step` (sampling)."""
        if self.sample_every > 1:
            self.enabled = self._master and step % self.sample_every == 0

    @contextlib.contextmanager
    def paused(self, keep_meter: bool = False):
        """No spans inside, sampled steps included (CUDA graph capture: event records and
        ranges must not be captured; timed runs: no instrumentation cost). `keep_meter`: the
        bubble meter keeps stamping (a timed run that reports the meter's bubble)."""
        was = self.enabled, self._master, self.meter
        self.enabled = self._master = False
        if not keep_meter:
            self.meter = None
        try:
            yield
        finally:
            self.enabled, self._master, self.meter = was

    @contextlib.contextmanager
    def clocked(self, clock):
        """Spans paused with the meter kept (`paused(keep_meter=True)`) and `clock` (a
        HostClock or StepClock, instrument/hostclock.py, stepclock.py) timing every span
        inside; detached on the way out, an error included."""
        with self.paused(keep_meter=True):
            self.host_clock = clock
            try:
                yield clock
            finally:
                self.host_clock = None

    def stage(self, name: str, stream: Optional[str] = None, graphed: bool = False):
        """Context manager for one stage span; `stream` labels the timeline lane.
        `graphed`: the body is one replay of a graph captured with the meter's stamps."""
        if not self.enabled:
            m, hc = self.meter, self.host_clock
            if m is None or graphed or stream == "host":
                inner = _NULL    # a graph (or kernel) carries its stamps; host is not GPU work
            else:
                inner = m.span(name, stream or self.stream_name)
            return inner if hc is None else hc.span(name, inner, graphed)
        _check(name)
        stream = stream or self.stream_name
        m = self.meter
        return _Span(self, name, stream, m.span(name, stream, graphed) if m is not None else _NULL)

    def mark_launch(self) -> None:
        """The host is about to issue this step's forward work: the bubble meter's launch
        time of the step (its run-ahead figures); nothing without a meter."""
        m = self.meter
        if m is not None:
            m.mark_launch()

    def step(self, name: str):
        """Context manager for one engine step's span (`step[decode bs=N]`, on the host lane):
        it also opens the bubble meter's next step."""
        if not self.enabled:
            m, hc = self.meter, self.host_clock
            inner = _NULL if m is None else m.step_span(name)
            return inner if hc is None else hc.step(name, inner)
        _check(name, step=True)
        m = self.meter
        return _Span(self, name, "host", m.step_span(name) if m is not None else _NULL)


NO_SPANS = Spans(enabled=False)
