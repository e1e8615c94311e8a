"""`mtplab analyze` / `mtplab plot` through the module entry point (subprocess) and in-process."""
from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

from mtplab.analysis.cli import main_analyze, main_plot
from test_bubbles import planted


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtplab.analysis.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    s, expected = planted()
    return s.write(tmp_path_factory.mktemp("cli") / "w.pt.trace.json.gz", gz=True), expected


def test_analyze_json_subprocess(trace):
    path, expected = trace
    r = run_cli("analyze", path, "--json")
    assert r.returncode == 0, r.stderr
    obj = orjson.loads(r.stdout)  # exactly one JSON object on stdout
    assert set(obj) == {"steps", "gaps", "streams", "summary"}
    assert set(obj["steps"][0]) == {"step", "start_us", "dur_us", "busy_us", "bubble_us", "bubble_frac"}
    assert set(obj["gaps"][0]) == {"step", "start_us", "gap_us", "cause", "before", "after"}
    assert set(obj["streams"][0]) == {"stream", "busy_us", "idle_us", "idle_host_wait_us",
                                      "idle_kernel_wait_us", "idle_other_us"}
    assert {"wall_us", "busy_us", "bubble_us", "bubble_frac", "n_steps"} <= set(obj["summary"])
    got = [(g["step"], g["start_us"], g["gap_us"], g["cause"]) for g in obj["gaps"]]
    assert got == [(k, g0, g1 - g0, c) for k, g0, g1, c, *_ in expected]


def test_analyze_human_out_and_skip(trace, tmp_path, capsys):
    path, _ = trace
    assert main_analyze([str(path.parent), "--out", str(tmp_path / "o"), "--skip-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert "steps   3 from step spans, first 1 skipped" in out and "causes  sync" in out
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
    assert main_plot([str(p)]) == 2
    assert "no GPU activity" in capsys.readouterr().err


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
    assert out.exists() and r.stdout.strip() == str(out)
    r = run_cli("plot", path, "--steps", "2:")
    assert r.returncode == 0 and (path.parent / "timeline.png").exists()
