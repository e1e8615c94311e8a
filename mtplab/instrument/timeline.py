"""Always-on event timeline: per-stage GPU intervals from CUDA event pairs and host intervals
from perf_counter, with no profiler and no host sync per step.

    begin(stage, stream) -> records a start event on the current stream + host t0
    end(mark)            -> records the end event + host t1, queues the record
    flush(block=False)   -> converts every queued record whose end event has completed
                            (event.query(), non-blocking) into rows; block=True waits once
                            for the last event (end of run)
GPU times are `elapsed_time` against one reference event recorded at construction, so they
share one device clock (µs since the reference); host times are perf_counter µs since the
same moment. The two clocks are aligned at the reference only (the GPU may lag the host).
On CPU the events are no-ops and only host intervals are recorded (gpu columns NaN).

What a GPU interval holds: the stream's time from reaching the span's start event to reaching
its end event. Against Kineto's gpu_user_annotation (first kernel start to last kernel end)
it also holds (a) a fixed cost per pair, the stream's dispatch of the stage's first command
(measured in docs/results/meter_trust/), and
(b) when the host is behind the GPU, the stream's waits for the launches inside the stage.
With the stream backlogged the two agree to (a), slope 1.000; in a host-bound run (b) is the
launch latency the analyser reports as bubbles.

Columns of `to_frame()` / timeline.parquet:
    step, stage, stream, host_start_us, host_end_us, gpu_start_us, gpu_end_us
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import pandas as pd
import torch

from ..device import current_cuda_stream

COLUMNS = ["step", "stage", "stream", "host_start_us", "host_end_us", "gpu_start_us",
           "gpu_end_us"]


@dataclass
class _Mark:
    step: int
    stage: str
    stream: str
    t0: float
    ev0: object
    t1: float = 0.0
    ev1: object = None


class EventTimeline:
    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.step = -1
        self._pending: list[_Mark] = []
        self.rows: list[tuple] = []
        self._pool: list = []                 # completed events, reused (no re-creation)
        self._t_ref = time.perf_counter()
        self._ref = self._event()
        if self._ref is not None:
            self._ref.record()

    def _event(self):
        if not self.cuda:
            return None
        return self._pool.pop() if self._pool else torch.cuda.Event(enable_timing=True)

    def next_step(self) -> int:
        self.step += 1
        if len(self._pending) > 256:
            self.flush()
        return self.step

    def begin(self, stage: str, stream: str) -> _Mark:
        ev = self._event()
        if ev is not None:
            ev.record(current_cuda_stream())
        return _Mark(self.step, stage, stream, time.perf_counter(), ev)

    def end(self, m: _Mark) -> None:
        m.ev1 = self._event()
        if m.ev1 is not None:
            m.ev1.record(current_cuda_stream())
        m.t1 = time.perf_counter()
        self._pending.append(m)

    def flush(self, block: bool = False) -> None:
        if block and self.cuda and self._pending:
            self._pending[-1].ev1.synchronize()
        keep = []
        for m in self._pending:
            if m.ev1 is not None and not m.ev1.query():
                keep.append(m)
                continue
            g0 = g1 = math.nan
            if m.ev0 is not None:
                g0 = self._ref.elapsed_time(m.ev0) * 1e3
                g1 = self._ref.elapsed_time(m.ev1) * 1e3
                self._pool += (m.ev0, m.ev1)
            self.rows.append((m.step, m.stage, m.stream, (m.t0 - self._t_ref) * 1e6,
                              (m.t1 - self._t_ref) * 1e6, g0, g1))
        self._pending = keep

    def to_frame(self) -> pd.DataFrame:
        self.flush(block=True)
        return pd.DataFrame(self.rows, columns=COLUMNS)
