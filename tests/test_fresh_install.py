"""The Quick start on a machine with nothing installed: mtplab's wheel, without extras, in a
new venv (torch's CPU build first, as the README says), then `mtplab demo`. torch's CPU build
does not bring Triton, so this also checks that CPU runs never need it (mtplab/lazy_triton.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# a fresh shell's environment: nothing points at this checkout or turns the interpreter on
ENV = {k: v for k, v in os.environ.items()
       if k not in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV")}


def run(cmd: list, cwd: Path, timeout: int = 900) -> str:
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=ENV)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n" \
                              f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.mark.slow
def test_wheel_without_extras_runs_the_demo_in_a_fresh_venv(tmp_path):
    src, wheels = tmp_path / "src", tmp_path / "wheels"       # a clean copy: no build/ here
    files = run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], REPO)
    for f in files.splitlines():
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, src / f)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, src], tmp_path)
    wheel, = wheels.glob("mtplab-*.whl")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    py, pip = venv / "bin" / "python", [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    run(pip + [f"torch=={torch.__version__.split('+')[0]}"], tmp_path)   # the CPU build
    run(pip + [wheel], tmp_path)
    assert subprocess.run([py, "-c", "import triton"], capture_output=True,
                          env=ENV).returncode != 0, \
        "triton is installed in the fresh venv; the test would not show that CPU runs lack it"
    work = tmp_path / "run"
    work.mkdir()
    out = run([venv / "bin" / "mtplab", "demo"], work)
    assert "wrote traces/" in out
    assert (next((work / "traces").iterdir()) / "timeline.png").is_file()
