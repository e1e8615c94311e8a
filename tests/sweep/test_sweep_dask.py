"""Sweeps under Dask: a 2-worker LocalCluster runs a grid with a failing and a
timing-out cell and gives the same table as the local executor; a worker killed mid-cell
costs a retry or a failed record, never a lost or doubled one; the Slurm recipe renders."""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from mtplab.core import ConfigError
from mtplab.sweep import RESULTS_JSONL, DaskExecutor, grid_from_dict, main_sweep, run_sweep

pytest.importorskip("distributed")

TINY = {"model": "random-tiny", "device": "cpu", "context_len": 64, "batch_size": 1,
        "prompt_len_tokens": 4, "output_len_tokens": 6, "warmup_output_len_tokens": 0,
        "draft": "frozen_kv_mtp", "simulate_accept_len": 2.0}
GRID = {"base": TINY, "timeout_s": 300,
        "grid": {"page_size": [1, 2, 3]},                     # page_size 3: dropped
        "arms": [{}, {"fail": True, "page_size": 1},          # fails
                 {"sleep_s": 60, "timeout_s": 3, "page_size": 1}]}   # times out
# Columns that hold times, or which worker ran a cell: all else (paths relative to the out dir)
# must not depend on the executor.
TIMING = re.compile(r"(_ms|_s|_us|_frac|_per_s|per_step)$|^(stage_|bubble_|worker$)")


def _table(out: Path) -> pd.DataFrame:
    df = pd.read_parquet(out / "results.parquet").set_index("cell_id").sort_index()
    for c in df.columns:
        if not pd.api.types.is_numeric_dtype(df[c]):
            df[c] = df[c].map(lambda v: v.replace(str(out), "<out>") if isinstance(v, str) else v)
    return df


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("dask")
    cells = grid_from_dict(GRID).cells()
    run_sweep(cells, root / "local", progress=False)
    with DaskExecutor(workers=2) as ex:
        run_sweep(cells, root / "dask", progress=False, executor=ex)
    return _table(root / "local"), _table(root / "dask"), root


@pytest.mark.slow
def test_dask_runs_failing_and_timing_out_cells(both):
    _, dask, root = both
    assert dask["status"].value_counts().to_dict() == {"ok": 2, "failed": 2, "dropped": 1}
    bad = dask[dask["status"] == "failed"]["error"]
    assert bad.str.contains("fail=True").sum() == 1
    assert bad.str.contains("timed out after 3 s").sum() == 1
    ran = dask[dask["status"] != "dropped"]
    assert set(ran["worker"]) <= {"0", "1"}             # worker names of the LocalCluster
    ids = [json.loads(ln)["cell_id"] for ln in (root / "dask" / RESULTS_JSONL).read_text()
           .splitlines()]
    assert len(ids) == len(set(ids)) == 5               # one record per cell, from the driver
    for cid in ran.index:
        assert (root / "dask" / "cells" / cid / "spec.json").is_file()


@pytest.mark.slow
def test_results_do_not_depend_on_the_executor(both):
    local, dask, _ = both
    assert list(local.index) == list(dask.index)
    assert local["status"].to_dict() == dask["status"].to_dict()
    cols = sorted(c for c in set(local.columns) | set(dask.columns) if not TIMING.search(c))
    assert {"tokens", "steps", "accept_len", "cfg.page_size", "error", "trace_path"} <= set(cols)
    pd.testing.assert_frame_equal(local.reindex(columns=cols), dask.reindex(columns=cols),
                                  check_dtype=False)


def _cell_pids(out: Path) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        try:
            argv = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"mtplab.sweep.child" in argv and str(out).encode() in argv and state != "Z":
            pids.append(int(d.name))
    return pids


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError):
        return -1


@pytest.mark.slow
def test_a_worker_killed_mid_cell_costs_a_retry_never_a_record(tmp_path):
    cells = grid_from_dict({"base": {**TINY, "sleep_s": 5}, "timeout_s": 300,
                            "grid": {"page_size": [1, 2]}}).cells()
    out = tmp_path / "out"
    with DaskExecutor(workers=2) as ex:
        result = {}
        t = threading.Thread(target=lambda: result.setdefault(
            "df", run_sweep(cells, out, progress=False, executor=ex)))
        t.start()
        deadline = time.monotonic() + 180
        while len(_cell_pids(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        busy = {a: ks for a, ks in ex.client.processing().items() if ks}
        addr = next(iter(busy))
        pid = ex.client.run(os.getpid, workers=[addr])[addr]
        mine = [p for p in _cell_pids(out) if _ppid(p) == pid]
        assert mine, "no cell process under the worker"
        os.kill(pid, signal.SIGKILL)                     # the worker, mid-cell
        deadline = time.monotonic() + 30               # (a poll: ends when the cell is gone)
        while set(mine) & set(_cell_pids(out)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not set(mine) & set(_cell_pids(out))     # its cell died with it
        t.join(timeout=300)
        assert not t.is_alive()
    recs = [json.loads(ln) for ln in (out / RESULTS_JSONL).read_text().splitlines()]
    assert sorted(r["cell_id"] for r in recs) == sorted(c.cell_id for c in cells)  # once each
    for r in recs:
        assert r["status"] == "ok" or "KilledWorker" in r["error"], r["error"]
    assert not _cell_pids(out)


def test_slurm_recipe_renders_its_job_script():
    pytest.importorskip("dask_jobqueue")
    from mtplab.sweep.executors import CELL_SLOT, slurm_cluster

    cluster = slurm_cluster(partition="gpu", walltime="02:00:00", account="lab", cores=8,
                            memory="64GB", python="/opt/venv/bin/python")
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    for line in ("#SBATCH -p gpu", "#SBATCH -A lab", "#SBATCH -t 02:00:00",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --gres=gpu:1"):
        assert line in script, script
    cmd = script.strip().splitlines()[-1]
    assert cmd.startswith("/opt/venv/bin/python -m distributed.cli.dask_worker tcp://")
    assert "--nthreads 1" in cmd and f"--resources {CELL_SLOT}=1" in cmd and "--nanny" in cmd


@pytest.mark.parametrize("kw,message", [
    ({"workers": 0}, "--workers must be >= 1"),
    ({"workers": 2, "scheduler": "tcp://127.0.0.1:1"}, "give one of --workers"),
])
def test_dask_executor_argument_errors(kw, message):
    with pytest.raises(ConfigError, match=message):
        DaskExecutor(**kw)


def test_unreachable_scheduler_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("mtplab.sweep.executors.CONNECT_TIMEOUT", "2s")
    grid = tmp_path / "g.yaml"
    grid.write_text(json.dumps({"base": TINY}))
    rc = main_sweep([str(grid), "--out", str(tmp_path / "out"), "--executor", "dask",
                     "--scheduler", "tcp://127.0.0.1:9", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "cannot reach the Dask scheduler tcp://127.0.0.1:9" in err


def test_join_a_running_cluster_with_a_timing_out_cell(tmp_path, capsys):
    """--scheduler: a cluster started elsewhere (its workers without the `cell` resource); a
    cell that sleeps past its limit is killed on the worker and recorded failed, once. The
    cell imports no torch before it sleeps, so this runs in seconds."""
    from distributed import LocalCluster

    grid = tmp_path / "g.yaml"
    grid.write_text(json.dumps({"base": {**TINY, "sleep_s": 60, "timeout_s": 1},
                                "grid": {"page_size": [1, 3]}}))       # 3: dropped
    out = tmp_path / "out"
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0") as cluster:
        rc = main_sweep([str(grid), "--out", str(out), "--executor", "dask", "--scheduler",
                         cluster.scheduler_address, "--no-progress"])
    recs = [json.loads(ln) for ln in (out / RESULTS_JSONL).read_text().splitlines()]
    assert rc == 1 and sorted(r["status"] for r in recs) == ["dropped", "failed"]
    failed = next(r for r in recs if r["status"] == "failed")
    assert failed["error"].startswith("timed out after 1 s") and failed["worker"] == "0"
    assert "1 failed, 1 dropped" in capsys.readouterr().out.replace("0 ok, ", "")


@pytest.mark.slow
def test_kill_9_of_a_dask_driver_stops_its_cells_on_a_cluster_that_stays(tmp_path):
    """The driver joins a cluster that outlives it (its workers keep running): its cells see
    the out-dir lock released and stop within a second or two, so a resumed sweep never
    shares a cell folder with an orphan."""
    import subprocess
    import sys

    from distributed import LocalCluster

    grid = tmp_path / "g.yaml"
    grid.write_text(json.dumps({"base": {**TINY, "sleep_s": 120}, "timeout_s": 300,
                                "grid": {"page_size": [1, 2]}}))
    out = tmp_path / "out"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster:
        driver = subprocess.Popen([sys.executable, "-m", "mtplab.cli", "sweep", str(grid),
                                   "--out", str(out), "--executor", "dask", "--scheduler",
                                   cluster.scheduler_address, "--no-progress"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while len(_cell_pids(out)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(_cell_pids(out)) == 2, "the cells did not start"
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 30               # (a poll: ends when the cells are gone)
        while _cell_pids(out) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _cell_pids(out)
        assert len(cluster.scheduler_info["workers"]) == 2      # the workers stayed
