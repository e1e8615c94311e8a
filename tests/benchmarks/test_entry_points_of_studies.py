"""A benchmarks/ script moved into its study is a thin entry point: it runs the study module's
`main`, and `python -m benchmarks.<script> --help` still answers with the flags it had."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = {"bench_host": ("mtplab.studies.host_path.host_bench",
                          ("--out-dir", "--only", "--bs", "--granularities", "--diag-draft")),
           "bench_ab": ("mtplab.studies.host_path.ab",
                        ("--commit", "--group", "--arms", "--granularity", "--bs",
                         "--old-tree")),
           "bench_acceptance": ("mtplab.studies.drafts.acceptance",
                                ("--prompts", "--steps", "--package", "--show", "--out")),
           "bench_draft_vocab": ("mtplab.studies.drafts.head_vocab",
                                 ("--prompts", "--new-tokens", "--package", "--out")),
           "bench_health": ("mtplab.studies.health.runner",
                            ("--smoke", "--repeats", "--out-len", "--no-moe", "--out-dir")),
           "bench_nonfinite": ("mtplab.studies.decode_floor.nonfinite",
                               ("--device", "--reps", "--tokens"))}


@pytest.mark.parametrize("script", sorted(ENTRIES))
def test_the_script_runs_its_studys_main(script):
    module, _ = ENTRIES[script]
    entry = importlib.import_module(f"benchmarks.{script}")
    assert entry.main is importlib.import_module(module).main
    body = (ROOT / "benchmarks" / f"{script}.py").read_text()
    assert module.replace(".", "/") + ".py" in body                # its doc names the runner


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(ENTRIES))
def test_the_scripts_flags_answer_from_the_command_line(script):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run([sys.executable, "-m", f"benchmarks.{script}", "--help"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert [f for f in ENTRIES[script][1] if f not in p.stdout] == []


def test_every_benchmarks_script_is_a_thin_entry_point_into_a_study():
    """Every script in benchmarks/ is a docstring, one import of a study module's `main` and
    the `__main__` guard: the runner itself lives in mtplab/studies/."""
    import ast
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.name == "__init__.py":
            continue
        body = ast.parse(path.read_text()).body
        code = [n for n in body if not (isinstance(n, ast.Expr)
                                        and isinstance(n.value, ast.Constant))]
        imports = [n for n in code if isinstance(n, ast.ImportFrom)]
        assert len(code) == 2 and len(imports) == 1 and isinstance(code[1], ast.If), path.name
        assert imports[0].module.startswith("mtplab.studies."), path.name
        assert [a.name for a in imports[0].names] == ["main"], path.name
        entry = importlib.import_module(f"benchmarks.{path.stem}")
        assert entry.main is importlib.import_module(imports[0].module).main, path.name
