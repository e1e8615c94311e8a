"""Shared parts of the studies' runners: run a grid through the sweep, print a table."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import pandas as pd

from mtplab.atomic import atomic_write_text
from mtplab.sweep import grid_from_dict, run_sweep


class TimeBox:
    """A runner's time box: `left()` is what remains of `budget_s` seconds from its start."""

    def __init__(self, budget_s: float):
        self.deadline = time.perf_counter() + budget_s

    def left(self) -> float:
        return self.deadline - time.perf_counter()


def emit(table: str, out: Optional[str]) -> None:
    """Print the markdown table and, given `out`, write it there atomically."""
    print(table)
    if out:
        atomic_write_text(out, table + "\n")


def sweep(doc: dict[str, Any], out: Path | str) -> pd.DataFrame:
    """Run a grid (a grid file's mapping) with mtplab.sweep.run_sweep, the one measurement
    procedure (one process per cell, resumable in `out`); return its cells' rows, in the
    grid's order, with the settings of each cell as columns `s.<key>`. A failed or dropped cell
    raises with its reason: a benchmark's figures need every cell."""
    cells = grid_from_dict(doc).cells()
    df = run_sweep(cells, out, timeout_s=float(doc.get("timeout_s", 600)))
    df = df.set_index("cell_id").loc[[c.cell_id for c in cells]].reset_index()
    bad = df[df["status"] != "ok"]
    if len(bad):
        raise RuntimeError(f"{len(bad)} cell(s) not ok, first: {bad.iloc[0]['error']} "
                           f"(see {out})")
    settings = pd.DataFrame([json.loads(s) for s in df["settings_json"]]).add_prefix("s.")
    return pd.concat([df, settings], axis=1)


def sleep_cycles(ms: float) -> int:
    """GPU clock cycles of torch.cuda._sleep that take about `ms` (measured once)."""
    import torch
    torch.cuda._sleep(1000)            # loads the kernel (lazy module loading) outside the timing
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(1_000_000)
    b.record()
    b.synchronize()
    return int(ms * 1_000_000 / a.elapsed_time(b))


class _NoMarks:
    """An eager segment's marks with no spans: the future map's tail runs as its ops."""
    captured = False

    def __call__(self, stage: str) -> None:
        pass


def target_decode_fn(eng, max_kv: int):
    """The target worker's greedy decode forward + argmax for lanes of up to `max_kv` KV
    entries, eager: the one-node verify segment a greedy decode step runs (publish and stash
    of the lanes' rows included), called as fn(input_ids=, rows=, kv_lens=)."""
    call = eng.target_worker.plan(False, True)[-1]
    fn = call.make(call, max_kv)
    return lambda **args: fn(**args, mark=_NoMarks())
