"""bench_moe_spec (studies/moe/moe_spec_runner.py) without a GPU: one engine per model, routing
and arm gives a row per window at every batch size, the study's report renders from the file
byte for byte, a second call at the same stamp adds its engines to the report, an engine a
later call skipped keeps what an earlier one measured, and a bad arm index is one error."""
from __future__ import annotations

import json

import pytest

from mtplab.errors import ConfigError
from mtplab.studies import reports as R
from mtplab.studies.moe import moe_spec_runner as run
from mtplab.studies.moe import render

ARGS = ["--device", "cpu", "--dtype", "float32", "--arms", "1", "--batches", "1", "2",
        "--steps-per-level", "6", "--windows", "2"]


def test_arms_are_the_grids_with_target_only_first():
    got = run.arms([2, 1])
    assert got[0] == {"draft": "none"} and [a.get("num_steps") for a in got] == [None, 4, 2]
    with pytest.raises(ConfigError, match="--arms 9: moe_spec.yaml has arms 0-4"):
        run.arms([9])


def test_a_cpu_run_writes_the_study_report_and_a_second_call_adds_to_it(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def")
    out = tmp_path / "results"
    assert run.main([*ARGS, "--models", "random-tiny-gemma4", "--routings", "uniform",
                     "--out-dir", str(out)]) == 0
    (js,) = (out / "moe").glob("*_cpu_abc1234.json")
    doc = json.loads(js.read_text())
    assert [e["status"] for e in doc["engines"]] == ["ok", "ok"]      # target-only, K=4
    pts = {(r["point"]["batch_size"], r["arm"], r["repeat"]) for r in doc["rows"]}
    assert len(pts) == len(doc["rows"]) == 2 * 2 * 2       # bs x arms x windows
    assert all(r["decode_tok_per_s"] > 0 for r in doc["rows"])
    ex = {(e["k"], e["bs"]): e for e in doc["experts_per_verify"]}
    assert sorted(ex) == [(0, 1), (0, 2), (4, 1), (4, 2)]       # K x bs, each K's own pass
    assert all(e["verifies"] > 0 and 0 < e["experts"] <= 16 for e in ex.values())
    for (k, bs), e in ex.items():             # random-tiny-gemma4: 16 experts, top-4
        assert e["uniform"] == pytest.approx(16 * (1 - (1 - 4 / 16) ** (bs * (k + 1))))
    assert run.main([*ARGS, "--models", "random-tiny-gemma4", "--routings", "zipf:1.2",
                     "--out-dir", str(out), "--note", "A CPU path check."]) == 0
    doc = json.loads(js.read_text())
    assert {r["point"]["moe_routing"] for r in doc["rows"]} == {"uniform", "zipf:1.2"}
    assert len(doc["engines"]) == 4 and " --routings zipf:1.2 " in doc["command"]
    md = js.with_suffix(".md").read_text()
    assert "- measured by one engine per model, routing and arm" in md
    assert "- batch sizes measured: random-tiny-gemma4 1, 2\n" in md
    assert "A CPU path check." in md
    assert "## What zipf routing changes" in md
    assert {e["routing"] for e in doc["experts_per_verify"]} == {"uniform", "zipf:1.2"}
    assert "## Experts touched per verify" in md and "of uniform routing's expectation" in md
    assert R.regenerate("moe", render, out, check=True) == []


def test_the_kv_holds_what_the_shrinking_batch_holds_at_once_not_lanes_times_the_longest():
    from mtplab.studies.batch_levels import request_tokens
    tokens = request_tokens([1, 2, 4, 8, 16, 32, 64], 64, 24, 3.1)
    cfg = run.config("gemma4-31b-like@60", "uniform", run.GRID["arms"][1], tokens, "cpu",
                     "float32")
    assert (cfg.max_running_requests, cfg.cuda_graph_max_bs) == (64, 64)
    assert cfg.context_len == 64 + max(tokens) + 16
    assert cfg.max_total_tokens == sum(tokens) + 64 * (64 + 32 + 16) < 64 * max(tokens) / 2


def test_a_failed_experts_pass_keeps_the_timed_rows_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def")

    def boom(*_):
        raise RuntimeError("out of memory")
    monkeypatch.setattr(run, "experts_pass", boom)
    out = tmp_path / "results"
    assert run.main([*ARGS, "--models", "random-tiny-gemma4", "--routings", "uniform",
                     "--out-dir", str(out)]) == 0
    (js,) = (out / "moe").glob("*.json")
    doc = json.loads(js.read_text())
    assert [e["status"] for e in doc["engines"]] == ["ok", "ok"] and len(doc["rows"]) == 8
    assert [e["reason"] for e in doc["experts_errors"]] == ["RuntimeError: out of memory"] * 2
    assert "- experts pass not measured for random-tiny-gemma4, uniform, draft=none: " \
        "RuntimeError: out of memory" in js.with_suffix(".md").read_text()


def test_an_engine_a_later_call_skipped_keeps_the_earlier_rows():
    def doc(engines, rows, command):
        return {"engines": engines, "rows": rows, "arms": ["a"], "command": command,
                "arm_keys": [{"arm": "a", "draft": "none", "k": None}],
                "experts": {"m": 16}}
    e_ok = {"model": "m", "routing": "uniform", "arm": "a", "status": "ok"}
    e_skip = dict(e_ok, status="skipped", reason="time box (10 s left)")
    row = {"point": {"model": "m", "moe_routing": "uniform", "batch_size": 1}, "arm": "a",
           "repeat": 0, "decode_tok_per_s": 5.0}
    got = run.merge(doc([e_ok], [row], "x"), doc([e_skip], [], "y"))
    assert got["rows"] == [row] and got["engines"] == [e_ok] and got["command"] == "x; y"
    new_row = dict(row, decode_tok_per_s=6.0)
    got = run.merge(doc([e_ok], [row], "x"), doc([e_ok], [new_row], "x"))
    assert got["rows"] == [new_row] and got["command"] == "x"


def test_the_moe_schedule_grid_runs_the_schedule_group_on_the_moe_target(tmp_path):
    """moe_schedule.yaml: the schedule runner at gemma4-26b-a4b-like@30 with its Frozen-KV
    draft, acceptance at the field's first-position rate; --smoke runs its path on CPU (the
    dense random-tiny stands in) and writes a schedule file."""
    import yaml

    from mtplab.studies.spec_schedule.runner import run_group
    path = run.moe_spec.GRID.with_name("moe_schedule.yaml")
    doc = yaml.safe_load(path.read_text())
    assert doc["runner"] == "schedule" and doc["accept_rate"] == 0.844
    assert doc["models"] == [{"model": "gemma4-26b-a4b-like", "layers": 30,
                              "draft": "frozen_kv_mtp"}]
    md = run_group(doc, tmp_path / "moe_schedule", device="cpu", smoke=True)
    assert "schedule" in md and list((tmp_path / "moe_schedule").glob("*.schedule.yaml"))
