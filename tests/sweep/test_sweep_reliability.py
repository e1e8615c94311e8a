"""Sweeps that survive kill -9 and each other, driven as real processes where
it matters: a killed driver takes its cell with it, a second driver on one out dir is refused,
a torn journal line is set aside before the next append, and grid-file errors are one line."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from mtplab.sweep import RESULTS_JSONL, grid_from_dict, main_sweep, run_sweep
from mtplab.sweep.results import set_aside_torn_tail

REPO = Path(__file__).resolve().parents[2]
TINY = {"model": "random-tiny", "device": "cpu", "context_len": 64, "batch_size": 1,
        "prompt_len_tokens": 4, "output_len_tokens": 4, "warmup_output_len_tokens": 0}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def _sweep_proc(grid: Path, out: Path, *extra: str) -> subprocess.Popen:
    """`mtplab sweep` as a terminal starts it: SIGINT at its default (a test run started in the
    background, `cmd &`, inherits it ignored, and Ctrl-C would then never reach the sweep)."""
    return subprocess.Popen([sys.executable, "-m", "mtplab.cli", "sweep", str(grid), "--out",
                             str(out), "--no-progress", *extra], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _cell_pids(out: Path) -> list[int]:
    """Pids of live cell processes of this out dir (their argv names the cell's spec.json)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if b"mtplab.sweep.child" in argv and any(str(out).encode() in a for a in argv) \
                and state != "Z":
            pids.append(int(d.name))
    return pids


def _wait_for(pred, timeout_s: float, what: str):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _write_grid(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_kill_9_of_the_driver_takes_the_cell_with_it(tmp_path):
    grid = _write_grid(tmp_path / "g.yaml", {"base": {**TINY, "sleep_s": 4}, "timeout_s": 300})
    out = tmp_path / "out"
    driver = _sweep_proc(grid, out)
    cells = _wait_for(lambda: _cell_pids(out), 120, "the cell process")
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    _wait_for(lambda: not _cell_pids(out), 30, "the orphaned cell to die")
    assert not any(_alive(p) for p in cells)
    # a resumed sweep runs the cell from clean folders, to the end
    rc = main_sweep([str(grid), "--out", str(out), "--no-progress"])
    recs = [json.loads(ln) for ln in (out / RESULTS_JSONL).read_text().splitlines()]
    assert rc == 0 and [r["status"] for r in recs] == ["ok"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_second_driver_on_one_out_dir_is_refused(tmp_path):
    grid = _write_grid(tmp_path / "g.yaml", {"base": {**TINY, "sleep_s": 60}, "timeout_s": 300})
    out = tmp_path / "out"
    first = _sweep_proc(grid, out)
    try:
        _wait_for(lambda: _cell_pids(out), 120, "the first sweep's cell")
        second = _sweep_proc(grid, out)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err, err
        assert f"pid {first.pid} on " in lines[0] and "in use by another mtplab sweep" in lines[0]
        assert first.poll() is None and _cell_pids(out)      # the first one was not disturbed
    finally:
        first.kill()
        first.wait()


def test_lock_holder_is_named_in_one_line(tmp_path, capsys):
    """The lock alone (a holder process that imports no torch): fast enough for every run."""
    from mtplab.sweep.lock import LOCK_NAME

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        import importlib.util
        spec = importlib.util.spec_from_file_location(
            "lock", {str(REPO / 'mtplab/sweep/lock.py')!r})
        lock = importlib.util.module_from_spec(spec); spec.loader.exec_module(lock)
        with lock.hold_out_dir({str(out)!r}):
            print("held", flush=True); sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        grid = _write_grid(tmp_path / "g.yaml", {"base": {**TINY, "page_size": 3}})
        assert main_sweep([str(grid), "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"pid {holder.pid} on " in err[0], err
        assert not (out / RESULTS_JSONL).exists()          # nothing written by the refused one
    finally:
        holder.communicate("")
    # released at exit: the next driver gets it
    assert main_sweep([str(grid), "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_a_torn_last_line_is_set_aside_before_the_next_append(tmp_path, caplog):
    out = tmp_path / "out"
    out.mkdir()
    good = json.dumps({"cell_id": "aaaaaaaaaaaa", "status": "ok", "error": ""})
    torn = b'{"cell_id": "bbbbbbbbbbbb", "status": "o'
    (out / RESULTS_JSONL).write_bytes(good.encode() + b"\n" + torn)
    cells = grid_from_dict({"base": {**TINY, "page_size": 3}}).cells()      # one dropped cell
    with caplog.at_level("WARNING", logger="mtplab.sweep"):
        df = run_sweep(cells, out, progress=False)
    lines = (out / RESULTS_JSONL).read_text().splitlines()
    assert [json.loads(ln)["status"] for ln in lines] == ["ok", "dropped"]   # nothing glued
    aside = list(out.glob(f"{RESULTS_JSONL}.torn-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == torn
    assert "torn line" in caplog.text and str(aside[0]) in caplog.text
    assert set(df["status"]) == {"ok", "dropped"}


def test_a_whole_record_missing_its_newline_is_kept(tmp_path):
    path = tmp_path / RESULTS_JSONL
    rec = json.dumps({"cell_id": "aaaaaaaaaaaa", "status": "ok"})
    path.write_text(rec)
    assert set_aside_torn_tail(path) is None
    assert path.read_text() == rec + "\n" and not list(tmp_path.glob("*.torn-*"))


BAD_GRIDS = [
    ("timeout_s: abc\nbase: {device: cpu}\n", [], "timeout_s must be a positive number"),
    ("timeout_s: -1\n", [], "timeout_s must be a positive number"),
    ("exclude: [none]\n", [], "exclude must be a list of non-empty mappings"),
    ("base: [1, 2]\n", [], "base must be a mapping"),
    ("grid: [1, 2]\n", [], "grid must be a mapping"),
    ("grid: {page_size: 4}\n", [], "grid axis 'page_size' must be a non-empty list"),
    ("arms: {overlap: true}\n", [], "arms must be a list of mappings"),
    ("out: [a]\n", [], "out must be a folder path"),
    ("base: {device: cpu\n", [], "cannot read grid file"),
    ("[1, 2]\n", [], "a grid file is a mapping"),
    ("bogus: 1\n", [], "unknown grid-file keys ['bogus']"),
    ("base: {device: cpu}\n", ["--set", "page_size=["], "cannot read the value of --set 'page_"),
    ("base: {device: cpu}\n", ["--set", "page_size"], "--set expects KEY=VALUE"),
    ("base: {device: cpu}\n", ["--timeout-s", "0"], "--timeout-s: must be a positive finite"),
    ("base: {device: cpu}\n", ["--timeout-s", "nan"], "--timeout-s: must be a positive finite"),
    ("base: {device: cpu}\n", ["--workers", "0"], "--workers: must be a positive integer"),
    ("timeout_s: .nan\n", [], "timeout_s must be a positive number"),
    # PyYAML keeps the last of two equal keys: settings would be dropped silently
    ("base: {device: cpu, page_size: 2, page_size: 4}\n", [],
     "key 'page_size' is given twice in one mapping"),
    ("base: {device: cpu}\nbase: {model: random-tiny}\n", [], "key 'base' is given twice"),
    ("base: &b {device: cpu, x: *b}\n", [], "the alias at base.x refers to a node that contains"),
    ("base: {device: cpu}\ngrid: {timeout_s: [10, 20]}\n", [], "differ only in timeout_s"),
    # 10^9 cells: refused before a single one is made (--dry-run would exhaust memory)
    ("grid: {seed: %s, topk: %s, num_steps: %s}\n" % ((list(range(1000)),) * 3), ["--dry-run"],
     "the grid expands to 1,000,000,000 cells (1000 x 1000 x 1000), more than the limit"),
    ("base: {device: cpu}\n", ["--workers", "2"], "--workers and --scheduler need --executor"),
]


@pytest.mark.parametrize("text,extra,message", BAD_GRIDS, ids=[b[2][:30] for b in BAD_GRIDS])
def test_grid_file_errors_are_one_line(tmp_path, capsys, text, extra, message):
    grid = tmp_path / "g.yaml"
    grid.write_text(text)
    assert main_sweep([str(grid), "--out", str(tmp_path / "out"), "--no-progress", *extra]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("mtplab sweep: error: ") and message in err, err


@pytest.mark.slow
def test_grid_file_errors_through_the_real_cli(tmp_path):
    """The same, as a user sees it: a process, exit 2, one line on stderr."""
    grid = tmp_path / "g.yaml"
    grid.write_text("exclude: [none]\n")
    p = subprocess.run([sys.executable, "-m", "mtplab.cli", "sweep", str(grid)], env=_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_rerun_from_the_copied_grid_file(tmp_path, capsys):
    grid = _write_grid(tmp_path / "g.yaml", {"base": {**TINY, "page_size": 3}})
    out = tmp_path / "out"
    assert main_sweep([str(grid), "--out", str(out), "--no-progress"]) == 0
    assert main_sweep([str(out / "grid.yaml"), "--out", str(out), "--no-progress"]) == 0
    assert "error" not in capsys.readouterr().err
    assert len((out / RESULTS_JSONL).read_text().splitlines()) == 1        # dropped once


def test_per_cell_timeout_and_sleep_validation():
    from mtplab.sweep import make_cell

    a, b = make_cell(TINY), make_cell({**TINY, "timeout_s": 2.5})
    assert a.timeout_s is None and b.timeout_s == 2.5
    assert b.cell_id == a.cell_id         # the limit is not part of the cell id: one cell
    assert "timeout_s must be a positive number" in make_cell({**TINY, "timeout_s": "x"}).dropped
    assert "sleep_s must be at least 0, got -1" in make_cell({**TINY, "sleep_s": -1}).dropped


@pytest.mark.parametrize("setting,message", [
    ({"fail": "no"}, "fail is a boolean but got the string 'no'"),
    ({"check_lossless": "false"}, "check_lossless is a boolean but got the string 'false'"),
    ({"num_requests": True}, "num_requests must be an integer, got a boolean"),
    ({"temperature": "hot"}, "temperature is a number but got the string 'hot'"),
    ({"temperature": float("nan")}, "temperature must be a finite number, got nan"),
    ({"sleep_s": float("inf")}, "sleep_s must be a finite number, got inf"),
    ({"batch_size": 2.0}, "batch_size must be an integer"),
])
def test_workload_fields_are_type_checked_and_the_cell_dropped(setting, message):
    """A YAML value of the wrong type is dropped up front with its reason, never run: `fail:
    "no"` would fail the cell, `check_lossless: "false"` would run the check."""
    from mtplab.sweep import make_cell

    assert message in (make_cell({**TINY, **setting}).dropped or "")


@pytest.mark.parametrize("line", ['{"a": 1}', "[1, 2]", '{"cell_id": "x"}', "not json"])
def test_a_journal_line_that_is_no_record_is_one_sentence(tmp_path, capsys, line):
    grid = _write_grid(tmp_path / "g.yaml", {"base": TINY})
    out = tmp_path / "out"
    out.mkdir()
    (out / RESULTS_JSONL).write_text(line + "\n")
    for extra in (["--dry-run"], []):
        assert main_sweep([str(grid), "--out", str(out), "--no-progress", *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "line 1 is not a cell record" in err, err
    assert (out / RESULTS_JSONL).read_text() == line + "\n"         # left as it was


def test_refused_sweeps_make_no_out_folder(tmp_path, capsys):
    grid = _write_grid(tmp_path / "g.yaml", {"base": TINY})
    for extra in (["--workers", "2"], ["--executor", "dask", "--scheduler", "/nonexistent/s.json"]):
        out = tmp_path / "out"
        assert main_sweep([str(grid), "--out", str(out), "--no-progress", *extra]) == 2
        assert not out.exists(), extra
    err = capsys.readouterr().err
    assert "cannot reach the Dask scheduler /nonexistent/s.json" in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_ends_a_sweep_in_one_line_and_resumes(tmp_path):
    """SIGINT (Ctrl-C) while a cell runs: the cell is killed, the finished cells stay, and the
    driver says so in one line instead of a KeyboardInterrupt traceback."""
    grid = _write_grid(tmp_path / "g.yaml", {"base": TINY, "grid": {"sleep_s": [0, 60]}})
    out = tmp_path / "out"
    p = _sweep_proc(grid, out)
    for _ in range(600):
        if (out / RESULTS_JSONL).is_file() and _cell_pids(out):
            break
        time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "Traceback" not in err and "interrupted; the finished cells are kept" in err, err
    assert len((out / RESULTS_JSONL).read_text().splitlines()) == 1 and not _cell_pids(out)
