"""`mtplab analyze` / `mtplab plot` through the module entry point (subprocess) and in-process."""
from __future__ import annotations

from pathlib import Path
import subprocess
import sys

import orjson
import pandas as pd
import pytest

from mtplab.analysis.bubbles import analyze, analyze_run
from mtplab.analysis.cli import (WARMUP_STEPS, format_report, main_analyze,
                                 main_plot, plot_source, time_unit)
from mtplab.analysis.example import EXAMPLE_DIR, EXAMPLE_TRACE
from test_bubbles import planted
from tests.helpers import assert_drawn_png, assert_drawn_svg, event_timeline_frame



@pytest.fixture(autouse=True)
def _close_figures():
    """Each test's figures are closed after it (pyplot keeps every figure it opened)."""
    yield
    import matplotlib.pyplot as plt
    plt.close("all")

def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtplab.analysis.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    s, expected = planted()
    return s.write(tmp_path_factory.mktemp("cli") / "w.pt.trace.json.gz", gz=True), expected


def test_analyze_json_subprocess(trace):
    path, expected = trace
    r = run_cli("analyze", path, "--json", "--skip-steps", "0")
    assert r.returncode == 0, r.stderr
    obj = orjson.loads(r.stdout)  # exactly one JSON object on stdout
    assert set(obj) == {"steps", "gaps", "streams", "summary"}
    assert set(obj["steps"][0]) == {"step", "name", "start_us", "dur_us", "busy_us", "bubble_us",
                                    "bubble_frac", "launch_lead_us"}
    assert obj["steps"][0]["name"] == "step[decode bs=4]"
    assert set(obj["gaps"][0]) == {"step", "start_us", "gap_us", "cause", "before", "after"}
    assert set(obj["streams"][0]) == {"stream", "busy_us", "idle_us", "idle_host_wait_us",
                                      "idle_kernel_wait_us", "idle_other_us"}
    assert {"wall_us", "busy_us", "bubble_us", "bubble_frac", "n_steps", "run_ahead_frac",
            "launch_lead_p10_us", "launch_lead_p50_us", "launch_lead_p90_us",
            "run_ahead_steps"} <= set(obj["summary"])
    got = [(g["step"], g["start_us"], g["gap_us"], g["cause"]) for g in obj["gaps"]]
    assert got == [(k, g0, g1 - g0, c) for k, g0, g1, c, *_ in expected]


def test_analyze_human_out_and_skip(trace, tmp_path, capsys):
    path, _ = trace
    assert main_analyze([str(path.parent), "--out", str(tmp_path / "o"), "--skip-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "steps   3 from step spans, first 1 skipped (--skip-steps 1)" in out
    assert "causes  sync" in out
    assert {p.name for p in (tmp_path / "o").iterdir()} == {
        "steps.parquet", "gaps.parquet", "streams.parquet", "summary.json"}
    assert orjson.loads((tmp_path / "o" / "summary.json").read_bytes())["n_steps"] == 3


def test_cpu_only_json_has_null_fraction(tmp_path, capsys):
    p = tmp_path / "cpu.json"
    p.write_bytes(orjson.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1,
         "ts": 0.5, "dur": 10.25},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 5}]}))
    assert main_analyze([str(p), "--json"]) == 0
    obj = orjson.loads(capsys.readouterr().out)
    assert obj["summary"]["bubble_frac"] is None and obj["gaps"] == [] and obj["streams"] == []
    assert obj["steps"][0]["dur_us"] == 10.25
    fig = plot_source(p, path=tmp_path / "cpu.png")      # a CPU trace: its host lane, no bubbles
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["host"]
    assert "no device bubbles" in fig.axes[0].get_title()
    assert main_plot([str(p)]) == 0 and (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_default_warmup_skip_is_stated_and_shared(trace, capsys):
    """No --skip-steps: the first WARMUP_STEPS steps are left out (4 > 2 steps), and said so."""
    path, _ = trace
    assert WARMUP_STEPS == 1
    assert main_analyze([str(path), "--json"]) == 0
    obj = orjson.loads(capsys.readouterr().out)
    assert [s["step"] for s in obj["steps"]] == [1, 2, 3] and obj["summary"]["skip_steps"] == 1
    assert analyze_run(path).summary["skip_steps"] == 1      # the demo's call: the same rule
    assert main_analyze([str(path)]) == 0
    out = capsys.readouterr().out
    assert "first 1 skipped as warm-up (default; --skip-steps 0 keeps it)" in out
    assert main_analyze([str(path), "--skip-steps", "0"]) == 0
    assert "steps   4 from step spans, no step skipped" in capsys.readouterr().out


@pytest.mark.parametrize("values, unit", [([0.0], "us"), ([5.0, 999.0], "us"), ([1500.0], "ms"),
                                          ([9.9e6], "ms"), ([2.5e7], "s"),
                                          ([float("nan"), 20.0], "us")])
def test_time_unit_by_magnitude(values, unit):
    assert time_unit(values)[0] == unit


def test_report_uses_ms_for_ms_steps():
    res = analyze_run(EXAMPLE_TRACE)
    text = format_report(res, EXAMPLE_TRACE)
    assert "dur_ms" in text and "busy_ms" in text and "dur_us" not in text
    first_us = float(res.steps["dur_us"].iloc[0])    # 4689 us, shown as ms
    assert f"{first_us / 1e3:.3f}" in text and f"{first_us:.1f}" not in text
    assert not any(len(tok.split(".")[0]) >= 5 for line in text.splitlines()[4:]
                   for tok in line.split() if tok.replace(".", "").isdigit())


def test_example_run_is_shipped_with_its_analysis(tmp_path):
    """The package's H100 example: the pre-computed files are what the analyser gives now."""
    fresh = analyze_run(EXAMPLE_TRACE)
    shipped = orjson.loads((EXAMPLE_DIR / "summary.json").read_bytes())
    assert shipped["device"] is not None and shipped["skip_steps"] == WARMUP_STEPS
    assert {k: v for k, v in shipped.items() if k != "bubble_frac"} == \
        {k: v for k, v in fresh.summary.items() if k != "bubble_frac"}
    assert shipped["bubble_frac"] == pytest.approx(fresh.summary["bubble_frac"])
    pd.testing.assert_frame_equal(pd.read_parquet(EXAMPLE_DIR / "steps.parquet"), fresh.steps,
                                  check_dtype=False)
    out = tmp_path / "ex.png"
    assert main_plot(["--example", "--out", str(out)]) == 0
    fig = plot_source(EXAMPLE_TRACE)
    lanes = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert lanes == ["host", "schedule (stream 85)", "forward (stream 89)", "copy (stream 93)"]
    legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"bubble: sync", "bubble: host"} <= legend
    assert main_analyze(["--example", str(EXAMPLE_TRACE)]) == 2     # one or the other


def test_plot_example_writes_under_traces_not_the_current_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main_plot(["--example"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["traces"]
    out = tmp_path / "traces" / "example" / "timeline.png"
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert (capsys.readouterr().out.splitlines()[-1]
            == str(Path("traces", "example", "timeline.png")))


def test_example_has_steps_enough_for_a_slider_and_is_a_faithful_cut(tmp_path):
    """The shipped example gives notebook 05's step slider 10 decode steps after the warm-up
    skip, and the cut that made it moves nothing: a shorter cut of it analyses step for step
    as the example does (the example is itself such a cut of an H100 run)."""
    from mtplab.analysis.example import EXAMPLE_STEPS, cut_steps
    res = analyze_run(EXAMPLE_TRACE)
    assert res.summary["n_steps"] == EXAMPLE_STEPS - 1 >= 8
    assert res.steps["name"].str.startswith("step[decode").all()
    assert res.steps["bubble_frac"].max() - res.steps["bubble_frac"].min() > 0.03   # steps differ
    short = analyze_run(cut_steps(EXAMPLE_TRACE, tmp_path / "cut.pt.trace.json.gz", 6))
    cols = ["step", "dur_us", "busy_us", "bubble_us", "n_gaps"]
    pd.testing.assert_frame_equal(short.steps[cols], res.steps[cols].iloc[:5],
                                  check_dtype=False)
    with pytest.raises(ValueError, match="fewer than the 12 asked"):
        cut_steps(EXAMPLE_TRACE, tmp_path / "no.pt.trace.json.gz", 12)


def test_plot_and_analyze_give_the_same_bubble_figure(tmp_path, capsys):
    """One warm-up rule: `plot` prints `analyze`'s wall/bubble line, and its title names the
    same bubble percentage (the example: 11 steps, the first skipped)."""
    assert main_analyze(["--example"]) == 0
    report = capsys.readouterr().out.splitlines()
    assert main_plot(["--example", "--out", str(tmp_path / "p.png")]) == 0
    printed = capsys.readouterr().out.splitlines()
    wall = next(line for line in report if line.startswith("wall"))
    assert printed == [wall, str(tmp_path / "p.png")]
    frac = analyze_run(EXAMPLE_TRACE).summary["bubble_frac"]
    assert frac != analyze(EXAMPLE_TRACE).summary["bubble_frac"]        # the rule matters here
    title = plot_source(EXAMPLE_TRACE).axes[0].get_title()
    assert f"bubble {frac:.1%} of device wall time (first 1 skipped as warm-up)" in title


def test_plot_timeline_parquet_and_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    event_timeline_frame(3).to_parquet(run / "timeline.parquet")
    for arg in (run, run / "timeline.parquet"):
        fig = plot_source(arg)
        assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["host", "copy", "forward"]
    assert main_plot([str(run)]) == 0
    assert_drawn_png(run / "timeline.png")
    assert capsys.readouterr().out.strip() == str(run / "timeline.png")
    bad = tmp_path / "other.parquet"
    pd.DataFrame({"x": [1]}).to_parquet(bad)
    assert main_plot([str(bad)]) == 2
    assert main_plot([str(tmp_path / "empty_dir_missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert main_plot([str(tmp_path / "empty")]) == 2
    assert main_plot([]) == 2
    err = capsys.readouterr().err
    assert "not an event timeline" in err and "no Kineto trace" in err and "--example" in err
    assert "Traceback" not in err


BAD = {"empty.json": b"", "truncated.json": b'{"traceEvents": [{"ph": "X", "ts": 1',
       "other.json": b'{"hello": "world"}', "garbage.json.gz": b"\x1f\x8b\x08garbage"}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_exit_2_one_line_no_traceback(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(BAD[name])
    for cmd in ("analyze", "plot"):
        r = run_cli(cmd, p)
        assert r.returncode == 2, (cmd, r.stderr)
        assert "Traceback" not in r.stderr and r.stdout == ""
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"mtplab {cmd}: error: ")


def test_bad_arguments_exit_2(trace, tmp_path, capsys):
    path, _ = trace
    assert main_analyze([str(tmp_path / "missing.json")]) == 2
    assert main_analyze([str(path), "--skip-steps", "-1"]) == 2
    assert main_plot([str(path), "--steps", "5"]) == 2
    assert main_plot([str(path), "--steps", "3:1"]) == 2
    assert main_analyze([str(tmp_path)]) == 2  # a folder without a trace
    (tmp_path / "a.pt.trace.json").write_bytes(path.read_bytes())
    (tmp_path / "b.pt.trace.json").write_bytes(path.read_bytes())
    assert main_analyze([str(tmp_path)]) == 2  # ambiguous folder
    err = capsys.readouterr().err
    assert "Traceback" not in err and "holds 2 traces" in err
    assert main_analyze(["--no-such-flag", str(path)]) == 2


def test_plot_subprocess(trace, tmp_path):
    path, _ = trace
    out = tmp_path / "tl.svg"
    r = run_cli("plot", path, "--steps", "1:2", "--out", out)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == str(out)
    assert_drawn_svg(out)
    assert r.stdout.startswith("wall ")
    r = run_cli("plot", path, "--steps", "2:")
    assert r.returncode == 0
    assert_drawn_png(path.parent / "timeline.png")
