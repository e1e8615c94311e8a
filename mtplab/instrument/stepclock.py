"""Host spans of each decode step, kept per step, for the what-if predictor
(analysis/whatif.py): what HostClock sums over steps, with each iteration's start, each span's
parent and whether it launched a graph.

    clock = StepClock(first_step=meter.step + 1); spans.host_clock = clock
    ... steps (spans paused, the meter on) ...
    clock.frame()   -> one row per decode step: step (the meter's), period_us, a column per
                       outermost span name (µs, summed), NAME@PARENT for nested ones
    clock.eager     -> device-lane spans that launched kernel by kernel (no graph, no single
                       self-stamping kernel): the predictor lets their GPU work start while
                       the call goes on

An iteration runs from its first span (`schedule`, before its step span opens) to the next
iteration's first span: `period_us` holds everything the host did in it, on_step hooks and the
loop's own Python included. Iterations are numbered as the meter numbers steps (one per step
span, from `first_step`), so the two tables join on `step`; the last decode step of a run has
no next iteration and is left out. Cost per span: two perf_counter_ns reads, a list push and
pop and one tuple append.

`launch_latency_us` measures, in this process, half of a launch's round trip beyond the host
call: a one-kernel graph replayed, an event recorded after it and waited for, minus the
replay call itself (the predictor's L and W; 0 on CPU).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np
import pandas as pd
import torch

from ..nogc import gc_paused
from ..stages import HOST_STAGES
from .hostclock import StepSpan

_now = time.perf_counter_ns


class _Span:
    __slots__ = ("clock", "name", "inner", "graphed", "t0", "parent")

    def __init__(self, clock: "StepClock", name: str, inner, graphed: bool):
        self.clock, self.name, self.inner, self.graphed = clock, name, inner, graphed

    def __enter__(self):
        c = self.clock
        self.t0 = t = _now()
        if c.t_iter is None:
            c.t_iter = t
        stack = c.stack
        self.parent = stack[-1] if stack else None
        stack.append(self.name)
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        c = self.clock
        c.stack.pop()
        c.pending.append((self.name, self.parent, _now() - self.t0, self.graphed))
        return False


class StepClock:
    """Per decode iteration: its start and its spans (module doc)."""

    def __init__(self, first_step: int = 0):
        self.first_step = first_step
        self.index = 0                    # iterations closed so far (step spans)
        self.stack: list[str] = []
        self.pending: list = []           # (name, parent, ns, graphed) of the iteration
        self.t_iter: Optional[int] = None
        self.starts: list[int] = []       # every iteration's start, in order
        self.records: list = []           # (index, spans) of decode iterations
        self.eager: set[str] = set()

    def span(self, name: str, inner, graphed: bool = False) -> _Span:
        return _Span(self, name, inner, graphed)

    def step(self, name: str, inner) -> StepSpan:
        return StepSpan(self, name, inner)

    def close_iteration(self, decode: bool) -> None:
        self.starts.append(self.t_iter)
        if decode:
            self.records.append((self.index, list(self.pending)))
            for name, _, _, graphed in self.pending:
                if not graphed and name not in HOST_STAGES:
                    self.eager.add(name)
        self.index += 1
        self.pending.clear()
        self.t_iter = None

    def frame(self) -> pd.DataFrame:
        """One row per decode step that has a next iteration (module doc)."""
        rows = []
        for i, spans in self.records:
            if i + 1 >= len(self.starts) and self.t_iter is None:
                continue
            nxt = self.starts[i + 1] if i + 1 < len(self.starts) else self.t_iter
            row: dict = {"step": self.first_step + i,
                         "period_us": (nxt - self.starts[i]) / 1e3}
            for name, parent, ns, _ in spans:
                key = name if parent is None else f"{name}@{parent}"
                row[key] = row.get(key, 0.0) + ns / 1e3
            rows.append(row)
        df = pd.DataFrame(rows)
        if df.empty:
            return pd.DataFrame({"step": pd.Series(dtype=np.int64), "period_us": []})
        return df.fillna(0.0).astype({"step": np.int64})


def launch_latency_us(device: torch.device, n: int = 200) -> float:
    """Half of a launch's round trip beyond its host call, median (module doc); 0 on CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0.0
    x = torch.zeros(16, device=device)
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        x.add_(1)
    ev = torch.cuda.Event()
    call, trip = [], []
    for _ in range(n):
        torch.cuda.synchronize(device)
        t0 = _now()
        g.replay()
        t1 = _now()
        ev.record()
        ev.synchronize()
        t2 = _now()
        call.append(t1 - t0)
        trip.append(t2 - t0)
    return max(0.0, (float(np.median(trip)) - float(np.median(call))) / 2e3)
