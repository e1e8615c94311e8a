"""benchmarks/bench_ab.py (mtplab/studies/host_path/ab.py) without a GPU or a sweep: the grid
it runs in both trees is the host study's, one repeat, with the arms, granularities and batch
sizes asked for; both trees' sweeps run under one string hash seed; each ratio's bootstrap
interval over the repeats."""
from __future__ import annotations

import pandas as pd
import pytest

from mtplab.errors import ConfigError
from mtplab.studies.host_path import ab
from mtplab.studies.host_path.ab import host_grid, host_label, ratio_cell, ratio_interval
from mtplab.studies.reports import REPO as ROOT


def test_host_grid_is_the_host_studys_with_one_repeat_and_the_arms_asked_for():
    full = host_grid(ROOT)
    assert full["grid"]["repeat"] == [0] and len(full["arms"]) == 2
    zb = host_grid(ROOT, [1])
    assert zb["arms"] == [full["arms"][1]] and zb["arms"][0]["zero_bubble"] is True
    assert zb["grid"]["batch_size"] == [1, 32]
    assert set(zb["grid"]["draft"]) == {"none", "frozen_kv_mtp"}


def test_host_grid_keeps_the_batch_sizes_and_granularities_asked_for():
    full = host_grid(ROOT)
    one = host_grid(ROOT, bs=[32], granularity=["step"])
    assert one["grid"]["batch_size"] == [32] and one["grid"]["graph_granularity"] == ["step"]
    assert {k: v for k, v in one["grid"].items() if k not in ("batch_size",
                                                               "graph_granularity")} == \
        {k: v for k, v in full["grid"].items() if k not in ("batch_size", "graph_granularity")}
    assert host_grid(ROOT, bs=[32, 1])["grid"]["batch_size"] == [1, 32]     # the grid's order


def test_a_batch_size_the_host_grid_lacks_is_one_clear_error(capsys):
    with pytest.raises(ConfigError, match=r"--bs 8: the host grid's batch sizes are \[1, 32\]"):
        host_grid(ROOT, bs=[1, 8])
    assert ab.main(["--commit", "HEAD", "--group", "host", "--bs", "8"]) == 2
    assert "bench_ab: --bs 8" in capsys.readouterr().err


def test_host_label_names_draft_granularity_batch_and_loop():
    row = {"cfg.draft": "none", "cfg.graph_granularity": "step", "batch_size": 32,
           "cfg.overlap": True}
    assert host_label(row) == "target-only step bs32 overlap+zb"


def test_both_trees_sweep_under_one_hash_seed(tmp_path, monkeypatch):
    seen = []

    def run(argv, cwd, env, **kw):
        seen.append(env["PYTHONHASHSEED"])
        pd.DataFrame({"status": ["ok"]}).to_parquet(tmp_path / "results.parquet")
        return type("P", (), {"returncode": 0})()

    monkeypatch.setenv("PYTHONHASHSEED", "random")
    monkeypatch.setattr(ab.subprocess, "run", run)
    for tree in (tmp_path / "old", ROOT):
        ab.sweep_in(tree, tmp_path / "grid.yaml", tmp_path)
    assert seen == ["0", "0"]


def test_ratio_interval_resamples_each_trees_medians():
    # identical repeats: no noise, the interval is the ratio itself
    assert ratio_interval([100.0] * 3, [50.0] * 3) == (2.0, 2.0)
    # num's repeats {1, 2, 3} against a constant: the resampled median is 1 with probability
    # 7/27 and 3 with 7/27, both above the 5% tails: the interval is [1, 3]
    assert ratio_interval([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == (1.0, 3.0)
    # the den's noise enters the other way round
    assert ratio_interval([1.0, 1.0, 1.0], [1.0, 2.0, 4.0]) == (0.25, 1.0)
    # seeded: one table, one interval; a wider level holds the narrower
    xs, ys = [10.0, 11.0, 12.5, 9.5, 10.2], [9.0, 9.8, 11.0, 10.1, 8.7]
    assert ratio_interval(xs, ys) == ratio_interval(xs, ys)
    lo90, hi90 = ratio_interval(xs, ys)
    lo99, hi99 = ratio_interval(xs, ys, level=0.99)
    assert lo99 <= lo90 < 10.2 / 9.8 < hi90 <= hi99
    assert max(xs) / min(ys) >= hi99 and lo99 >= min(xs) / max(ys)


def test_ratio_cell_prints_the_interval_beside_the_ratio():
    assert ratio_cell([100.0, 100.0], [50.0, 50.0], 3) == "2.000x [2.000-2.000]"
    assert ratio_cell([1.0, 2.0, 3.0], [1.0] * 3, 2) == "2.00x [1.00-3.00]"
    assert ratio_cell([110.0], [100.0], 3) == "1.100x (one repeat)"


def test_a_budget_stops_before_a_repeat_that_would_not_fit(tmp_path, monkeypatch, capsys):
    """Each sweep takes 10 s of a fake clock: with --budget-s 45, repeat 1 (old + new: 20 s)
    and repeat 2 (ends at 40 s) run, and repeat 3 (40 + 20 > 45) does not; the host table's
    header counts the 2 that finished."""
    clock = [0.0]
    monkeypatch.setattr(ab.time, "perf_counter", lambda: clock[0])

    def sweep(tree, grid, out):
        clock[0] += 10.0
        return pd.DataFrame([{"status": "ok", "cfg.draft": "none",
                              "cfg.graph_granularity": "step", "batch_size": 1,
                              "cfg.overlap": True, "host_step_us": 100.0}])

    monkeypatch.setattr(ab, "sweep_in", sweep)
    out = tmp_path / "ab.md"
    a = ab.argparse.Namespace(commit="abc", repeats=5, budget_s=45.0, old_tree=str(tmp_path),
                              out=str(out))
    assert [(r, n) for r, n, _ in ab.alternating_sweeps(a, ROOT, {})] == [
        (0, "abc"), (0, "working tree"), (1, "abc"), (1, "working tree")]
    assert "2 of 5 repeats fit in --budget-s 45" in capsys.readouterr().err
    clock[0] = 0.0
    assert ab.host_main(a, ROOT, {}) == 0
    assert "; 2 alternating sweeps, one process per cell" in out.read_text()


def test_the_cells_file_keeps_the_device_side_beside_the_host_columns(tmp_path, monkeypatch):
    """OUT.cells.csv holds each cell's host columns and the meter's wall and idle per step,
    and nothing else of the row: a slower GPU is told from a slower host."""
    def sweep(tree, grid, out):
        return pd.DataFrame([{"status": "ok", "cfg.draft": "none",
                              "cfg.graph_granularity": "stage", "batch_size": 32,
                              "cfg.overlap": True, "host_step_us": 200.0, "host_sync_us": 50.0,
                              "meter_wall_us_per_step": 480.0, "bubble_us_per_step": 12.0,
                              "bubble_frac": 0.025, "tok_per_s": 9000.0, "accept_len": 1.0}])

    monkeypatch.setattr(ab, "sweep_in", sweep)
    out = tmp_path / "ab.md"
    a = ab.argparse.Namespace(commit="abc", repeats=1, budget_s=float("inf"),
                              old_tree=str(tmp_path), out=str(out))
    assert ab.host_main(a, ROOT, {}) == 0
    cells = pd.read_csv(out.with_suffix(".cells.csv"))
    assert list(cells["tree"]) == ["abc", "working tree"]
    assert set(cells.columns) == {"tree", "repeat", "cell", "host_step_us", "host_sync_us",
                                  "meter_wall_us_per_step", "bubble_us_per_step",
                                  "bubble_frac", "tok_per_s"}
    assert list(cells["meter_wall_us_per_step"]) == [480.0, 480.0]
