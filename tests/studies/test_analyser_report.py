"""The study `analyser` (mtplab/studies/analyser): its report rendered from a small synthetic
results doc with known figures (the ratio, its noise, the verdict, the target's check, the
idle agreement, the answer line), a malformed results file refused with one ConfigError, a
tree with changes refused before anything runs, and a short real run of the runner
(benchmarks/bench_analyzer.py --out-dir) that `mtplab report analyser` regenerates byte for
byte."""
from __future__ import annotations

import json
import time

import pytest

from mtplab.errors import ConfigError
from mtplab.studies import analyser as S
from mtplab.studies import reports as R
from mtplab.studies.cli import main_report


def _doc(hta=(6.0, 6.3, 6.1), mtplab=(1.0, 1.1, 1.05), **kw) -> dict:
    arms = {S.MTPLAB: list(mtplab), S.HTA: list(hta), S.FLOOR: [0.5, 0.5, 0.5]}
    idle = [S.idle_row(7, 100.0, 100.0, 110.0, {"host_wait": 60.0, "kernel_wait": 30.0,
                                                "other": 10.0}, {"host_wait": 66.0}),
            S.idle_row(20, 50.0, 50.5, 52.0, None, None)]
    return S.results_doc(mode=S.IN_PROCESS, arms=arms, idle=idle,
                         trace={"what": "synthetic", "mb": 81.1, "events": 267200,
                                "x_events": 201449},
                         date="2026-12-03", device="cpu", device_name="AMD EPYC, 2 CPU cores",
                         commit="abc1234def", command="python -m benchmarks.bench_analyzer",
                         **kw)


def test_the_report_of_known_figures():
    """HTA median 6.1 s, mtplab 1.05 s: 5.810x; noise the larger spread, mtplab's 1.1 / 1.0 - 1
    = 10%; stream 7's idle equals the exact sum, stream 20's does not (50.0 vs 50.5); HTA's
    total 162 over mtplab's 150: +8.00%."""
    md = S.render(_doc())
    answer = [ln for ln in md.splitlines() if ln.startswith(R.ANSWER)]
    assert answer == [f"{R.ANSWER} HTA takes 5.81 times mtplab's time on a 81.1 MB trace: "
                      "5.810x ±10.0%, pays (target >= 3x: met); mtplab's idle time equals "
                      "HTA's definition summed exactly on 1 of 2 streams, HTA's own rounding "
                      "adds +8.00%."]
    assert ("| HTA TraceAnalysis + get_idle_time_breakdown | 6.10 | 6.00 6.30 6.10 | "
            "5.810x ±10.0%, pays |") in md
    assert "| orjson.loads only, GC paused (parse floor) | 0.50 | 0.50 0.50 0.50 | " \
           "0.476x ±10.0%, costs |" in md
    assert "| 7 | 100.0 | 100.0 | 110.0 | +10.00% | yes | 60/30/10 | 66/0/0 |" in md
    assert "| 20 | 50.0 | 50.5 | 52.0 | +4.00% | no | - | - |" in md
    assert "| all | 150.0 | 150.5 | 162.0 | +8.00% |" in md
    assert "- command: `python -m benchmarks.bench_analyzer`" in md


def test_verdicts_follow_the_noise_and_the_repeats():
    near = S.render(_doc(hta=(1.0, 1.1, 1.05)))                       # 1.000x: within noise
    assert "1.000x ±10.0%, within the noise (target >= 3x: missed)" in near
    one = S.render(_doc(hta=(6.0,), mtplab=(1.0,)))
    assert "6.000x ±2.0%, one repeat, no verdict" in one


def test_from_process_start_has_cpu_seconds_and_its_own_target():
    doc = S.results_doc(mode=S.PROCESS_START, arms={S.CLI_MTPLAB: [1.4, 1.5], S.HTA: [6.0, 6.0]},
                        cpu_seconds={S.CLI_MTPLAB: [1.5, 1.5], S.HTA: [5.9, 5.9]},
                        import_s=0.119, idle=[], trace={"what": "`plain.json`", "mb": 51.6},
                        date="2026-12-03", device="cpu", device_name="", commit="abc1234",
                        command="python -m benchmarks.bench_analyzer --cli")
    md = S.render(doc)
    assert "on a 51.6 MB trace from process start (wall): 4.138x ±7.1%, pays " \
           "(target >= 4x: met)." in md
    assert "| mtplab analyze --json | 1.45 | 1.50 | 1.40 1.50 | baseline | baseline |" in md
    assert "3.933x ±2.0%, pays |" in md                              # CPU: 5.9 / 1.5
    assert "import of mtplab.analysis.cli 0.119 s" in md


@pytest.mark.parametrize("breakage", ["no_arms", "bad_seconds", "no_baseline", "bad_mode"])
def test_a_malformed_results_file_is_one_config_error(tmp_path, capsys, breakage):
    doc = _doc()
    if breakage == "no_arms":
        del doc["arms"]
    elif breakage == "bad_seconds":
        doc["arms"][1]["seconds"] = ["fast"]
    elif breakage == "no_baseline":
        doc["arms"] = doc["arms"][1:]
    else:
        doc["mode"] = "gpu"
    with pytest.raises(ConfigError, match="analyser results 2026-12-03_cpu_abc1234: .*"
                                          "write them again with"):
        S.render(doc)
    d = tmp_path / "analyser"
    d.mkdir()
    (d / "2026-12-03_cpu_abc1234.json").write_text(json.dumps(doc))
    assert main_report(["analyser", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtplab report: error: analyser results")


def test_a_tree_with_changes_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    from benchmarks import bench_analyzer
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234-dirty")
    assert bench_analyzer.main(["--steps", "3", "--out-dir", str(tmp_path)]) == 2
    assert "one commit of a clean tree" in capsys.readouterr().err
    assert not list(tmp_path.rglob("*"))


def test_a_short_run_writes_a_report_that_regenerates(tmp_path, monkeypatch, capsys):
    pytest.importorskip("hta")
    from benchmarks import bench_analyzer
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def5678")
    assert bench_analyzer.main(["--steps", "8", "--repeats", "2", "--out-dir",
                                str(tmp_path)]) == 0
    stem = f"{time.strftime('%Y-%m-%d')}_cpu_abc1234"
    md, js = tmp_path / "analyser" / f"{stem}.md", tmp_path / "analyser" / f"{stem}.json"
    doc = json.loads(js.read_text())
    assert [a["name"] for a in doc["arms"]] == [S.MTPLAB, S.HTA, S.FLOOR, S.GC_ON]
    assert all(len(a["seconds"]) == 2 for a in doc["arms"])
    assert {r["stream"] for r in doc["idle"]} == {7, 20, 24}
    assert all(S.idle_agrees(r) for r in doc["idle"])     # the synthetic trace: exact sums
    assert "- command: `python -m benchmarks.bench_analyzer --steps 8 --repeats 2 " \
           "--out-dir " in md.read_text()
    assert R.regenerate("analyser", S.render, tmp_path, check=True) == []
    md.write_text(md.read_text() + "edited\n")
    assert main_report(["analyser", "--root", str(tmp_path), "--check"]) == 1
    assert main_report(["analyser", "--root", str(tmp_path)]) == 0
    assert R.regenerate("analyser", S.render, tmp_path, check=True) == []
