"""The check at the end of every test (tests/conftest.py `engine_invariants`, tests/helpers.py
EngineWatch) fails a test that leaves an engine's KV broken, whether the test closed the
engine or left it open, and passes a clean one: a pytest run of planted tests."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLANTED = textwrap.dedent('''
    import pytest
    from mtplab import Engine, RunConfig

    KEPT = []

    def engine():
        eng = Engine(RunConfig(model="random-tiny", page_size=4))
        eng.generate([[5, 6, 7]], max_new_tokens=3)
        return eng

    def test_leak_left_open():
        KEPT.append(engine())
        KEPT[-1].allocator.alloc_pages(1)        # a page nobody owns, engine still open

    def test_leak_then_closed():
        eng = engine()
        eng.allocator.alloc_pages(1)
        eng.close()

    def test_leak_then_dropped():
        eng = engine()
        eng.allocator.alloc_pages(1)             # freed by reference counting: __del__

    @pytest.mark.breaks_engine
    def test_leak_on_purpose():
        eng = engine()
        eng.allocator.alloc_pages(1)

    def test_clean():
        KEPT.append(engine())
''')


def test_a_test_that_leaves_an_engine_leaking_fails(tmp_path):
    (tmp_path / "test_planted.py").write_text(PLANTED)
    env = dict(os.environ, COLUMNS="200",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest",
                        "-p", "no:cacheprovider", "-rA", "-q", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(tmp_path), str(tmp_path / "test_planted.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    for name in ("test_leak_left_open", "test_leak_then_closed", "test_leak_then_dropped"):
        assert f"ERROR test_planted.py::{name} - AssertionError" in out, out
    for name in ("test_leak_on_purpose", "test_clean"):
        assert f"PASSED test_planted.py::{name}" in out, out
    assert out.count("check_invariants() failed for an Engine this test built") >= 3, out
    assert out.count("4 slots (1 pages) leaked") >= 3, out
