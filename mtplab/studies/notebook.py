"""What the ablation notebooks (01-04) share, so that their cells hold only their own question.

    out, on_gpu = start(out_dir, device)      # the output folder; whether the cells use a GPU
    df = run_arms(base, arms, axes, out, repeats=3, probe={"profile": True})

`run_arms` sweeps base x axes x arms (`repeated_cells`: `repeats` interleaved rounds, round 0
with the `probe` settings added) under `<out>/sweep`, one process per cell, and returns the
results table. Every arm's RunConfig is built first, so an arm that cannot run fails before
any cell starts, with its one-sentence reason; a cell that did not run raises naming it.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import RunConfig
from .effects import repeated_cells
from ..sweep.runner import run_sweep
from .figures import notebook_out


def start(out_dir: str | Path, device: str) -> tuple[Path, bool]:
    """The notebook's output folder (created, `notebook_out`) and whether `device` resolves to
    a GPU; prints both."""
    out = notebook_out(out_dir)
    resolved = RunConfig(device=device).device
    print("device:", resolved, "| output:", out.resolve())
    return out, resolved.startswith("cuda")


def run_arms(base: dict[str, Any], arms: list[dict[str, Any]], axes: dict[str, list],
             out: Path, *, repeats: int = 1, probe: dict[str, Any] | None = None,
             resume: bool = False, timeout_s: float = 600) -> pd.DataFrame:
    """Run the arms' sweep under `out/sweep` and return its results table (module doc).
    `resume=False` starts the sweep afresh; True keeps the cells an earlier run finished."""
    fields = RunConfig.field_names()
    for arm in arms:
        RunConfig(**{k: v for k, v in {**base, **arm}.items() if k in fields})
    sweep_dir = Path(out) / "sweep"
    if not resume:
        shutil.rmtree(sweep_dir, ignore_errors=True)
    df = run_sweep(repeated_cells(base, arms, axes, repeats, probe=probe), sweep_dir,
                   timeout_s=timeout_s)
    failed = df[df["status"] != "ok"]
    if len(failed):
        raise RuntimeError("cells did not run: " + "; ".join(failed["error"]))
    return df
