"""`.ci/run` runs the README's test command as written, and fails when any test run in it
fails (a failing command inside an && list does not stop a `set -e` script by itself)."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    quick = ROOT.joinpath("README.md").read_text()
    return next(line for line in quick.splitlines() if "pytest -q tests" in line).strip()


def ci_line() -> str:
    cmd = readme_test_command()
    lines = [line for line in ROOT.joinpath(".ci/run").read_text().splitlines()
             if cmd in line and not line.lstrip().startswith("#")]
    assert len(lines) == 1, f".ci/run does not run the README's test command `{cmd}` once"
    return lines[0]


def fake_bin(tmp_path: Path, failing: str) -> Path:
    """pip and python that succeed, except python for argument lists matching `failing` (a
    shell case pattern)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in {"pip": "exit 0",
                       "python": f'case "$*" in {failing}) exit 1;; esac; exit 0'}.items():
        p = bin_ / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bin_


def run_ci_line(tmp_path: Path, failing: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{fake_bin(tmp_path, failing)}:{os.environ['PATH']}")
    return subprocess.run(["bash", "-c", f"set -euo pipefail\n{ci_line()}\necho REACHED"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_ci_stops_when_the_fast_set_fails(tmp_path):
    r = run_ci_line(tmp_path, '"-m pytest -q tests"')
    assert r.returncode != 0 and "REACHED" not in r.stdout


def test_ci_stops_when_the_slow_set_fails(tmp_path):
    r = run_ci_line(tmp_path, '*"-m slow"*')
    assert r.returncode != 0 and "REACHED" not in r.stdout


def test_ci_goes_on_when_both_pass(tmp_path):
    r = run_ci_line(tmp_path, '"never matches"')
    assert r.returncode == 0 and "REACHED" in r.stdout
