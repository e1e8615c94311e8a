"""Run a sweep's cells, one process each, and keep the results table.

    <out>/results.jsonl        one JSON line per finished or dropped cell (append, flush, fsync)
    <out>/results.parquet      the last record of every cell id, rewritten atomically after
                               each cell
    <out>/traces/<cell_id>/    the measured run's folder (manifest.json, Kineto trace,
                               timeline.parquet); `tensorboard --logdir <out>/traces`
    <out>/cells/<cell_id>/     spec.json, result.json, cell.log (and `out/` of a notebook)
    <out>/notebooks/<cell_id>.ipynb   executed notebooks (notebook sweeps)

Isolation: every cell runs in a fresh `python -m mtplab.sweep.child` process (own session,
killed with its process group at the timeout), so a crash, an OOM or a hang in one cell never
touches the others. Cells run one after another: timings of concurrent cells would interfere.
The cell processes get OMP_NUM_THREADS=1 unless it is set: the engine's host work is
small-tensor dispatch, and intra-op threads on a busy machine stall it (steps 100x slower).
Resume: a cell whose last record is `ok` (or `dropped`) is skipped; failed cells run again
unless `retry_failed=False`.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import RunConfig
from ..atomic import atomic_path, atomic_write_text
from ..progress import tqdm
from .grid import Cell, Workload, place
from .kernel import local_kernel

RESULTS_JSONL = "results.jsonl"
RESULTS_PARQUET = "results.parquet"


def run_sweep(cells: Sequence[Cell], out_dir: str | Path, *, notebook: str | None = None,
              timeout_s: float = 600.0, kernel_name: str | None = None,
              retry_failed: bool = True, progress: bool = True) -> pd.DataFrame:
    """Run every cell not done yet; return the results table (also in results.parquet)."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / RESULTS_JSONL
    last = last_records(jsonl)
    skip = {"ok", "dropped"} | (set() if retry_failed else {"failed"})
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    if notebook is not None and kernel_name is None:
        kernel_name, env = local_kernel(out / "jupyter", env=env)
    todo = []
    for c in cells:
        if last.get(c.cell_id, {}).get("status") in skip:
            continue
        if c.dropped is not None:
            append_record(jsonl, {**base_row(c), "status": "dropped", "error": c.dropped})
        else:
            todo.append(c)
    bar = tqdm(todo, desc="sweep", unit="cell", disable=not progress)
    for c in bar:
        row = run_cell(c, out, notebook=notebook, timeout_s=timeout_s, kernel_name=kernel_name,
                       env=env)
        append_record(jsonl, row)
        write_parquet(jsonl, out / RESULTS_PARQUET)
        bar.set_postfix_str(f"{c.cell_id} {row['status']}")
    return write_parquet(jsonl, out / RESULTS_PARQUET)


def run_cell(cell: Cell, out: Path, *, notebook: str | None, timeout_s: float,
             kernel_name: str | None, env: dict[str, str]) -> dict[str, Any]:
    """Run one cell in its own process; return its results row (status ok or failed)."""
    cid = cell.cell_id
    cell_dir, run_dir = out / "cells" / cid, out / "traces" / cid
    for d in (cell_dir, run_dir):           # a retried cell starts clean
        shutil.rmtree(d, ignore_errors=True)
    cell_dir.mkdir(parents=True)
    cfg = place(cell.config, out / "traces", cid)
    nb_out = str(out / "notebooks" / f"{cid}.ipynb") if notebook else None
    if nb_out:
        Path(nb_out).parent.mkdir(parents=True, exist_ok=True)
    spec = {"cell_id": cid, "config": asdict(cfg), "workload": asdict(cell.workload),
            "params": cell.params, "settings": cell.settings, "cell_dir": str(cell_dir),
            "notebook": str(Path(notebook).resolve()) if notebook else None,
            "notebook_out": nb_out, "kernel_name": kernel_name}
    spec_path = atomic_write_text(cell_dir / "spec.json", json.dumps(spec, default=str))
    log = cell_dir / "cell.log"
    t0 = time.perf_counter()
    rc = _run_process([sys.executable, "-m", "mtplab.sweep.child", str(spec_path)], log,
                      timeout_s, env)
    row = {**base_row(cell, cfg), "cell_wall_s": time.perf_counter() - t0,
           "log_path": str(log), "notebook_path": nb_out}
    result_path = cell_dir / "result.json"
    if result_path.is_file():
        row.update(json.loads(result_path.read_text()))
    elif rc is None:
        row.update(status="failed", error=f"timed out after {timeout_s:g} s (killed); see {log}")
    elif rc < 0:
        row.update(status="failed", error=f"killed by {signal.Signals(-rc).name} "
                                          f"(out of memory?); see {log}")
    else:
        row.update(status="failed", error=f"exited with code {rc}: {_last_line(log)}")
    row.setdefault("error", "")
    return row


def _run_process(argv: list[str], log: Path, timeout_s: float, env: dict[str, str]) -> int | None:
    """Exit code of argv (stdout+stderr to `log`), None when killed at the timeout."""
    with open(log, "wb") as f:
        p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env=env, start_new_session=True)
        try:
            return p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return None


def _last_line(path: Path) -> str:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
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


def append_record(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync) before returning."""
    line = json.dumps(row, default=str)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every complete line of results.jsonl (a torn last line, from a crash, is ignored)."""
    if not path.is_file():
        return []
    out = []
    for ln in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(ln))
        except json.JSONDecodeError:
            continue
    return out


def last_records(jsonl: Path) -> dict[str, dict[str, Any]]:
    """cell id -> its last record, in first-seen order of the ids."""
    return {r["cell_id"]: r for r in read_records(jsonl)}


def collect(jsonl: Path) -> pd.DataFrame:
    """The last record of every cell id, in first-seen order, one row each."""
    return pd.DataFrame(list(last_records(jsonl).values()))


def write_parquet(jsonl: Path, path: Path) -> pd.DataFrame:
    df = _arrow_safe(collect(jsonl))
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    return df


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns mixing value types (e.g. a dropped cell's invalid setting) become strings."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {type(v) for v in df[c] if v is not None and not _is_nan(v)}
            if len(kinds) > 1 and not kinds <= {int, float}:
                df[c] = df[c].map(lambda v: v if v is None else str(v))
    return df
