"""Profiler sessions that end early: short runs, exit without finish(), `mtplab run`."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mtplab import Engine, RunConfig


def test_short_run_says_why_there_is_no_trace_and_still_writes_the_manifest(tmp_path):
    eng = Engine(RunConfig(model="random-tiny", profile=True, profile_wait=5, profile_warmup=2,
                           profile_active=4, trace_dir=str(tmp_path), run_name="r"))
    eng.generate([[5, 6, 7]], max_new_tokens=3, ignore_eos=True)       # 3 steps < 11
    written = eng.finish()
    assert "fewer than the schedule's wait+warmup+active = 11" in eng.profile_note
    assert set(written) == {"manifest"} and written["manifest"].exists()
    eng.check_invariants()


@pytest.mark.slow
def test_a_run_inside_the_active_window_writes_the_steps_it_has(tmp_path):
    eng = Engine(RunConfig(model="random-tiny", profile=True, profile_wait=0, profile_warmup=1,
                           profile_active=50, trace_dir=str(tmp_path), run_name="r"))
    eng.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True)
    written = eng.finish()
    assert eng.profile_note is None and "trace0" in written
    eng.check_invariants()


@pytest.mark.slow
def test_exit_without_finish_stops_the_profiler_and_writes_the_trace(tmp_path):
    code = textwrap.dedent(f"""
        from mtplab import Engine, RunConfig
        eng = Engine(RunConfig(model="random-tiny", profile=True, profile_wait=0,
                               profile_warmup=1, profile_active=50,
                               trace_dir={str(tmp_path)!r}, run_name="r"))
        eng.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True)
        # no finish(): the atexit hook stops the session
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert list((tmp_path / "r").glob("*.pt.trace.json.gz"))


@pytest.mark.slow
def test_mtplab_run_profiled_finishes_and_writes_the_manifest(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mtplab.cli", "run", "--model", "random-tiny",
                        "--prompts", "2", "--max-new-tokens", "3", "--device", "cpu",
                        "--profile", "true", "--trace-dir", str(tmp_path), "--run-name", "r"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "r" / "manifest.json").exists()
    assert "no profiler trace" in r.stdout and "wrote manifest" in r.stdout
