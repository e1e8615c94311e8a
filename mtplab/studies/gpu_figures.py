"""What the GPU figure runners share (decode_floor/kernel_figures, long_context/*, bench_moe,
attention_figures): the report, the time-boxed figure loop, freeing the device between engines
and `graph_us`, a call's device time by CUDA graph replay.

    rep = Report(budget_s)                    rep.add(figure, value, target, ok) prints a row
    run_figures(rep, [(name, fn), ...], only, reserve_s)
        each figure named in `only`, in order; one that `reserve_s` of the budget no longer
        covers is SKIPPED (a MISS row), one that raises is an ERROR row and the device is
        freed: a failing figure never hides the others
    rep.table()  -> figure | value | target | verdict, then `rep.notes` (kernel tables, ...)
"""
from __future__ import annotations

import gc
import time

import numpy as np
import torch

from mtplab.nogc import gc_paused


class Report:
    def __init__(self, budget_s: float):
        self.rows: list[tuple] = []
        self.notes: list[str] = []             # lines after the table
        self.deadline = time.perf_counter() + budget_s

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def add(self, figure: str, value: str, target: str = "", ok: bool | None = None) -> None:
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        self.rows.append((figure, value, target, verdict))
        print(f"{figure}: {value}" + (f"  (target {target}) {verdict}" if target else ""),
              flush=True)

    def table(self) -> str:
        lines = ["| figure | value | target | verdict |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in self.rows]
        return "\n".join(lines + ([""] + self.notes if self.notes else []))


def free(*engines) -> None:
    """Close `engines`, then give the device's cached memory back (between figures)."""
    for e in engines:
        e.close()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def run_figures(rep: Report, figures: list, only, reserve_s: float) -> None:
    """The module doc's loop over (name, fn) pairs."""
    for name, fn in figures:
        if name not in only:
            continue
        if rep.left() < reserve_s:
            rep.add(name, "SKIPPED (time box)", "", False)
            continue
        try:
            fn()
        except Exception as e:     # one figure failing must not hide the others
            rep.add(name, f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:200]}", "",
                    False)
            free()


def graph_us(fn, reps: int = 20, replays: int = 50) -> float:
    """Median device µs of one fn() call: fn captured `reps` times in one CUDA graph, the graph
    replayed `replays` times, each replay between two CUDA events."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):                 # compile / autotune / allocator warm-up
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b) / reps)
    del g
    return float(np.median(times))
