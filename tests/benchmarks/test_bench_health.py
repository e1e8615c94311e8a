"""benchmarks/bench_health.py, the entry point of mtplab/studies/health/runner.py: the checks
on arms with known figures (no engine), a tree with uncommitted changes refused before
anything runs, and (slow) the CPU smoke run writing the report and its results, which `mtplab
report health` renders again byte for byte."""
from __future__ import annotations

import json
import time

import pytest

from benchmarks import bench_health
from mtplab.studies.health import runner
from mtplab.studies import health
from mtplab.studies import reports as R
from mtplab.studies.cli import main_report


def _arm(name, ras, regime="GPU-bound", delay=0.0, **extra):
    return health.arm_record(
        shape="llama3-8b-like@16", model="llama3-8b-like", layers=16, bs=8, regime=regime,
        arm=name, delay_us=delay, trace={},
        repeats=[dict(run_ahead_frac=r, launch_lead_p50_us=100.0 * r,
                      meter_tok_per_s=1000.0 + 10 * i, **extra) for i, r in enumerate(ras)])


def _doc(arms):
    return health.results_doc(arms, date="2026-11-29", device="h200", device_name="NVIDIA H200",
                              commit="abc1234def", command="python -m benchmarks.bench_health",
                              prompt_len=128, out_len=64, repeats=3)


def test_checks_of_known_arms():
    arms = [_arm("overlap+zb", [0.98, 1.0, 0.99]), _arm("overlap off", [0.0, 0.0, 0.0]),
            _arm("overlap+zb + host delay", [0.5, 0.0, 0.02], delay=9000.0)]
    cs = health.checks(_doc(arms))
    assert [c["verdict"] for c in cs] == ["PASS", "PASS", "PASS"]
    assert cs[0]["value"] == 0.99                                 # the median
    assert "9000 µs" in cs[2]["arm"]                              # median 0.02 <= 0.1
    arms[1]["repeats"][1]["run_ahead_frac"] = 0.1                 # overlap off: every generate
    assert [c["verdict"] for c in health.checks(_doc(arms))] == ["PASS", "MISS", "PASS"]
    arms[0]["regime"] = "host-bound"                              # close to 1: GPU-bound only
    assert len(health.checks(_doc(arms))) == 2


def test_not_measured_reads_na():
    arms = [_arm("overlap off", [float("nan")] * 2, run_ahead_note="not available on CPU")]
    doc = _doc(arms)
    assert arms[0]["repeats"][0] == {"launch_lead_p50_us": None, "meter_tok_per_s": 1000.0,
                                     "run_ahead_frac": None,
                                     "run_ahead_note": "not available on CPU"}
    assert health.checks(doc)[0]["verdict"] == health.NA
    md = health.render(doc)
    assert "Notes: not available on CPU" in md
    assert "not measured: llama3-8b-like@16 overlap off." in md


def test_the_script_is_the_studys_runner():
    assert bench_health.main is runner.main


def test_a_tree_with_changes_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234-dirty")
    assert runner.main(["--smoke", "--out-dir", str(tmp_path)]) == 2
    assert "one commit of a clean tree" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*"))


@pytest.mark.slow
def test_the_smoke_run_writes_the_report_and_its_results(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def5678")
    assert runner.main(["--smoke", "--out-dir", str(tmp_path)]) == 0
    stem = f"{time.strftime('%Y-%m-%d')}_cpu_abc1234"
    md, js = tmp_path / "health" / f"{stem}.md", tmp_path / "health" / f"{stem}.json"
    assert md.is_file() and js.is_file()
    doc = json.loads(js.read_text())
    assert [a["arm"] for a in doc["arms"]] == ["overlap+zb", "overlap off",
                                               "overlap+zb + host delay"]
    assert all(len(a["repeats"]) == 2 for a in doc["arms"])
    assert "- command: `python -m benchmarks.bench_health --smoke --out-dir " in md.read_text()
    assert not (tmp_path / "traces").exists()
    assert R.regenerate("health", health.render, tmp_path, check=True) == []
    assert main_report(["health", "--root", str(tmp_path)]) == 0      # the index's row
    assert f"[{stem}.md](health/{stem}.md)" in (tmp_path / R.INDEX).read_text()


def test_the_meter_over_the_traced_steps():
    """Decode steps 3..6 of the frame: the leads of 3, 4 and 5 (6's next launch is not in the
    trace), the wall of all four; the prefill and the steps outside are left out."""
    import pandas as pd
    frame = pd.DataFrame({
        "step": range(8),
        "name": ["step[decode bs=8]"] * 3 + ["step[prefill bs=8]"] + ["step[decode bs=8]"] * 4,
        "launch_lead_us": [900.0, 900.0, 900.0, 900.0, -30.0, 10.0, 900.0, 900.0],
        "wall_us": [1.0, 1.0, 1.0, 1.0, 100.0, 200.0, 300.0, 1.0]})
    got = health.traced_meter_figures(frame, 3, 6)
    assert got == {"meter_run_ahead_frac": 0.5, "meter_launch_lead_p50_us": -10.0,
                   "meter_wall_us_per_step": 200.0}
    nothing = health.traced_meter_figures(frame, 8, 9)
    assert nothing["meter_run_ahead_frac"] != nothing["meter_run_ahead_frac"]      # NaN


@pytest.mark.slow
def test_the_meter_reads_the_steps_the_trace_holds(tmp_path, monkeypatch):
    """A profiled arm on CPU: the meter steps the profiler's window names are the decode
    steps the trace's analysis keeps, one for one."""
    seen = {}
    real = health.traced_meter_figures

    def spy(frame, first, last):
        seen.update(frame=frame, first=first, last=last)
        return real(frame, first, last)

    monkeypatch.setattr(health, "traced_meter_figures", spy)
    arm = runner.run_arm(runner.Arm(runner.SMOKE, health.ZB, dict(overlap=True,
                                                                   zero_bubble=True)),
                         "cpu", 8, 24, 1, True, tmp_path)
    f = seen["frame"]
    kept = f[(f["step"] >= seen["first"]) & (f["step"] <= seen["last"])]
    assert len(kept) == arm.trace["n_steps"] == 7           # 8 recorded, 1 warm-up skipped
    assert kept["name"].str.startswith("step[decode").all()
    assert set(health.TRACE) <= set(arm.trace)
