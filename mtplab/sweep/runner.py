"""Run a sweep's cells, one process each, and keep the results table.

    <out>/.lock                the out-dir lock (lock.py): one driver per folder
    <out>/results.jsonl        one JSON line per finished or dropped cell (append, flush, fsync)
    <out>/results.parquet      the last record of every cell id, rewritten atomically after
                               each cell (results.py)
    <out>/traces/<cell_id>/    the measured run's folder (manifest.json, Kineto trace,
                               timeline.parquet); `tensorboard --logdir <out>/traces`
    <out>/cells/<cell_id>/     spec.json, result.json, cell.log (and `out/` of a notebook)
    <out>/notebooks/<cell_id>.ipynb   executed notebooks (notebook sweeps)

One code path for every executor (executors.py): this driver takes the lock, sets a torn
journal tail aside, decides what runs, hands the executor one `CellJob` per cell, and records
each `CellOutcome` as it comes back. Only *where* a cell's process runs differs: here, one
after another (`local`), or on Dask workers (`dask`), several at once.

Isolation: every cell runs in a fresh `python -m mtplab.sweep.child` process (own session,
killed with its process group at the timeout, dead with its parent), so a crash, an OOM or a
hang in one cell never touches the others (process.py). The cell processes get
OMP_NUM_THREADS=1 unless it is set: the engine's host work is small-tensor dispatch, and
intra-op threads on a busy machine stall it (steps 100x slower).
Resume: a cell whose last record is `ok` (or `dropped`) is skipped; failed cells run again
unless `retry_failed=False`. Only this driver writes results.jsonl / results.parquet.
"""
from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import RunConfig
from .executors import Executor, LocalExecutor
from ..progress import tqdm
from .grid import Cell, Workload, place
from .kernel import local_kernel
from .lock import hold_out_dir
from .process import CellJob, CellOutcome
from .results import (
    RESULTS_JSONL,
    RESULTS_PARQUET,
    append_record,
    last_records,
    set_aside_torn_tail,
    write_parquet,
)

__all__ = ["RESULTS_JSONL", "RESULTS_PARQUET", "run_sweep", "base_row", "cell_row"]


def run_sweep(cells: Sequence[Cell], out_dir: str | Path, *, notebook: str | None = None,
              timeout_s: float = 600.0, kernel_name: str | None = None,
              retry_failed: bool = True, progress: bool = True,
              executor: Executor | None = None, label: str = "sweep") -> pd.DataFrame:
    """Run every cell not done yet; return the results table (also in results.parquet).
    The progress bar reads `<label> (<executor>)`. Raises lock.OutDirLocked when another
    driver holds `out_dir`."""
    out = Path(out_dir).resolve()
    executor = executor or LocalExecutor()
    with hold_out_dir(out) as token:
        jsonl = out / RESULTS_JSONL
        set_aside_torn_tail(jsonl)
        last = last_records(jsonl)
        skip = {"ok", "dropped"} | (set() if retry_failed else {"failed"})
        env: dict[str, str] = {}
        if notebook is not None and kernel_name is None:
            kernel_name, env = local_kernel(out / "jupyter", env={
                k: v for k, v in os.environ.items() if k == "JUPYTER_PATH"})
        todo: dict[str, Cell] = {}
        for c in cells:
            if c.cell_id in todo or last.get(c.cell_id, {}).get("status") in skip:
                continue
            if c.dropped is not None:
                append_record(jsonl, {**base_row(c), "status": "dropped", "error": c.dropped})
            else:
                todo[c.cell_id] = c
        jobs = [executor.adapt(make_job(c, out, notebook=notebook, timeout_s=timeout_s,
                                        kernel_name=kernel_name, env=env), token)
                for c in todo.values()]
        bar = tqdm(total=len(jobs), desc=f"{label} ({executor.name})", unit="cell",
                   disable=not progress)
        if executor.dashboard_link:
            bar.write(f"mtplab sweep: Dask dashboard {executor.dashboard_link}")
        try:
            for job, outcome in executor.run(jobs, status=bar.set_postfix_str):
                row = cell_row(todo[job.cell_id], job, outcome)
                append_record(jsonl, row)
                write_parquet(jsonl, out / RESULTS_PARQUET)
                bar.update(1)
        finally:
            bar.close()
        return write_parquet(jsonl, out / RESULTS_PARQUET)


def make_job(cell: Cell, out: Path, *, notebook: str | None, timeout_s: float,
             kernel_name: str | None, env: dict[str, str]) -> CellJob:
    """The cell as a job any executor can run (its spec.json content and its limit)."""
    cid = cell.cell_id
    cfg = place(cell.config, out / "traces", cid)
    nb_out = str(out / "notebooks" / f"{cid}.ipynb") if notebook else None
    spec = {"cell_id": cid, "config": asdict(cfg), "workload": asdict(cell.workload),
            "params": cell.params, "settings": cell.settings,
            "cell_dir": str(out / "cells" / cid),
            "notebook": str(Path(notebook).resolve()) if notebook else None,
            "notebook_out": nb_out, "kernel_name": kernel_name}
    return CellJob(cell_id=cid, out_dir=str(out), spec=spec,
                   timeout_s=cell.timeout_s or timeout_s, env=env)


def cell_row(cell: Cell, job: CellJob, outcome: CellOutcome) -> dict[str, Any]:
    """The results row of a cell that was handed to an executor (status ok or failed)."""
    cfg = place(cell.config, Path(job.out_dir) / "traces", cell.cell_id)
    log = job.log_path
    row = {**base_row(cell, cfg), "cell_wall_s": outcome.wall_s, "worker": outcome.worker,
           "log_path": str(log), "notebook_path": job.spec["notebook_out"]}
    rc = outcome.rc
    if outcome.result is not None:
        row.update(outcome.result)
    elif outcome.lost is not None:
        row.update(status="failed", error=outcome.lost)
    elif rc is None:
        row.update(status="failed",
                   error=f"timed out after {job.timeout_s:g} s (killed); see {log}")
    elif rc < 0:
        row.update(status="failed", error=f"killed by {signal.Signals(-rc).name} "
                                          f"(out of memory?); see {log}")
    else:
        row.update(status="failed", error=f"exited with code {rc}: {_last_line(log)}")
    row.setdefault("error", "")
    return row


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return f"(no log at {path})"
    return lines[-1][:500] if lines else "(no output)"


def base_row(cell: Cell, cfg: RunConfig | None = None) -> dict[str, Any]:
    """Identity, settings and workload columns of a cell (known before it runs)."""
    cfg = cfg or cell.config
    row: dict[str, Any] = {"cell_id": cell.cell_id, "status": "", "error": "",
                           "settings_json": json.dumps(cell.settings, sort_keys=True, default=str)}
    if cfg is not None:
        row.update({f"cfg.{k}": v for k, v in asdict(cfg).items()})
        row.update(kv_alloc_per_decode_tokens=cfg.alloc_len_per_decode,
                   kv_reserved_per_req_tokens=cfg.reserve_per_decode,
                   kv_row_width_tokens=cfg.row_width)
    else:
        row.update({f"cfg.{k}": v for k, v in cell.settings.items()
                    if k in RunConfig.field_names()})
    wl_names = Workload.field_names()
    if cell.workload is not None:
        row.update(asdict(cell.workload))
    else:
        row.update({k: v for k, v in cell.settings.items() if k in wl_names})
    row.update({f"param.{k}": v for k, v in cell.params.items()})
    return row
