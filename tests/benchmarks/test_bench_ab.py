"""benchmarks/bench_ab.py --group host without a GPU: the grid it runs in both trees is the
host study's, one repeat, with the arms asked for."""
from __future__ import annotations

from pathlib import Path

from benchmarks.bench_ab import host_grid, host_label

ROOT = Path(__file__).resolve().parents[2]


def test_host_grid_is_the_host_studys_with_one_repeat_and_the_arms_asked_for():
    full = host_grid(ROOT)
    assert full["grid"]["repeat"] == [0] and len(full["arms"]) == 2
    zb = host_grid(ROOT, [1])
    assert zb["arms"] == [full["arms"][1]] and zb["arms"][0]["zero_bubble"] is True
    assert zb["grid"]["batch_size"] == [1, 32]
    assert set(zb["grid"]["draft"]) == {"none", "frozen_kv_mtp"}


def test_host_label_names_draft_granularity_batch_and_loop():
    row = {"cfg.draft": "none", "cfg.graph_granularity": "step", "batch_size": 32,
           "cfg.overlap": True}
    assert host_label(row) == "target-only step bs32 overlap+zb"
