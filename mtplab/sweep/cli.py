"""`mtplab sweep GRID.yaml [--notebook NB.ipynb] [--out DIR] [--executor local|dask] ...`"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes
from ..errors import ConfigError
from ..flags import FlagParser, out_dir, positive_int, positive_number
from ..validate import check_out_dir
from ..yamlfile import load_yaml
from .executors import DaskExecutor, LocalExecutor, visible_gpus
from .grid import Cell, load_grid
from .lock import OutDirLocked, hold_out_dir
from .results import RESULTS_JSONL, RESULTS_PARQUET, BadJournal, last_records
from .runner import run_sweep


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="mtplab sweep",
        description="Run a grid of configurations, one process per cell; results go to "
                    "<out>/results.jsonl and <out>/results.parquet (see examples/grids/).")
    p.add_argument("grid", help="grid file (YAML: base, arms, grid, exclude, out, timeout_s)")
    p.add_argument("--out", default=None, type=out_dir,
                   help="output folder (default: the grid's `out`, else traces/sweeps/<grid name>)")
    p.add_argument("--notebook", default=None,
                   help="run this notebook per cell with papermill instead of the built-in "
                        "measurement; executed copies go to <out>/notebooks/<cell_id>.ipynb")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a base setting (YAML value), e.g. --set device=cuda; repeatable")
    p.add_argument("--timeout-s", type=positive_number, default=None,
                   help="per-cell limit in seconds (default: the grid's timeout_s, else 600)")
    p.add_argument("--kernel", default=None,
                   help="Jupyter kernel for --notebook (default: one for this interpreter)")
    p.add_argument("--no-retry-failed", dest="retry_failed", action="store_false",
                   help="on a re-run, skip failed cells too (default: run them again)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cells (id, run/skip/dropped, settings) and exit")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="where cells run: local (here, one after another; default) or dask "
                        "(Dask workers, one cell per worker at a time; docs/sweeps.md)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="dask: start a local cluster of N workers (CPU processes, or one per "
                        "visible GPU when the cells use CUDA; default: every core / GPU)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="dask: join a running cluster (tcp://host:8786 or a scheduler file)")
    return p


def _overrides(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}.")
        out[key.strip()] = load_yaml(value, f"the value of --set {item!r}", empty_ok=True)
    return out


def _check_executor_args(args: argparse.Namespace) -> None:
    if args.executor == "local" and (args.workers is not None or args.scheduler is not None):
        raise ConfigError("--workers and --scheduler need --executor dask.")


def _executor(args: argparse.Namespace, cells: Sequence[Cell]) -> contextlib.AbstractContextManager:
    if args.executor == "local":
        return contextlib.nullcontext(LocalExecutor())
    uses_cuda = any(c.config is not None and c.config.device.startswith("cuda") for c in cells)
    gpus = visible_gpus() if uses_cuda and args.scheduler is None else []
    return DaskExecutor(workers=args.workers, scheduler=args.scheduler, gpus=gpus)


def _copy_grid(src: str, dest: Path) -> None:
    """Keep the grid file beside the results (re-running from that copy is fine), written
    atomically: a link at `dest` is replaced, never written through."""
    if dest.exists() and os.path.samefile(src, dest):
        return
    atomic_write_bytes(dest, Path(src).read_bytes())


def main_sweep(argv: list[str] | None = None) -> int:
    """Entry point of `mtplab sweep`. Exit 0 when every cell of the grid is ok or dropped
    (run now or done before), 1 when one is failed, 2 on a bad grid file or argument."""
    args = build_parser().parse(sys.argv[1:] if argv is None else argv)
    if isinstance(args, int):
        return args
    try:
        grid = load_grid(args.grid, _overrides(args.overrides))
        _check_executor_args(args)
        if args.notebook and not Path(args.notebook).is_file():
            raise ConfigError(f"notebook {args.notebook} not found.")
        out = check_out_dir(args.out or grid.out or Path("traces") / "sweeps" /
                            Path(args.grid).stem, "the sweep's out folder")
        cells = grid.cells(notebook=args.notebook)
        done = {cid: r["status"] for cid, r in last_records(out / RESULTS_JSONL).items()}
    except (ConfigError, BadJournal, OSError) as e:
        print(f"mtplab sweep: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        for c in cells:
            state = "dropped: " + c.dropped if c.dropped else (
                "done" if done.get(c.cell_id) == "ok" else "run")
            print(f"{c.cell_id}  {state}  {c.settings}")
        return 0
    try:
        # the executor first: a refused one (a scheduler it cannot reach) makes no out folder
        with _executor(args, cells) as ex, hold_out_dir(out):
            _copy_grid(args.grid, out / "grid.yaml")
            if isinstance(ex, DaskExecutor):
                n = len(ex.client.scheduler_info(n_workers=-1)["workers"])
                print(f"mtplab sweep: Dask {ex.cluster_kind}, {n} workers", file=sys.stderr)
            df = run_sweep(cells, out, notebook=args.notebook,
                           timeout_s=args.timeout_s or grid.timeout_s, kernel_name=args.kernel,
                           retry_failed=args.retry_failed, progress=args.progress, executor=ex)
    except (ConfigError, OutDirLocked, BadJournal, OSError) as e:   # OSError: e.g. a full disk
        print(f"mtplab sweep: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:             # the running cell is already killed (process.py)
        print(f"mtplab sweep: interrupted; the finished cells are kept in "
              f"{out / RESULTS_JSONL}, and running the same command again resumes.",
              file=sys.stderr)
        return 130
    ids = {c.cell_id for c in cells}
    mine = df[df["cell_id"].isin(ids)] if len(df) else df
    counts = mine["status"].value_counts().to_dict() if len(mine) else {}
    print(f"mtplab sweep: {len(cells)} cells: " +
          ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "failed", "dropped")) +
          f"; table {out / RESULTS_PARQUET}")
    for r in mine[mine["status"] != "ok"].itertuples() if len(mine) else []:
        print(f"  {r.cell_id} {r.status}: {r.error}")
    if len(mine):
        from .results import results_table
        print(results_table(mine))
    return 1 if counts.get("failed") else 0
