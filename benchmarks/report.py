"""What the time-boxed GPU figure scripts share (bench_kernels, bench_long_context,
bench_moe): the report, the figure loop and freeing the device between engines.

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
    import torch
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
