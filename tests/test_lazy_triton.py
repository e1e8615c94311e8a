"""Triton is imported at a kernel's first use (mtplab/lazy_triton.py): CPU runs never import
it, TRITON_INTERPRET may be set after `import mtplab`, and a change after the kernels are
loaded, or a missing triton package, is one sentence."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mtplab import lazy_triton
from mtplab.config import ConfigError, RunConfig

REPO = Path(__file__).resolve().parents[1]


def run_script(code: str) -> list[str]:
    """`code` in a fresh interpreter without TRITON_INTERPRET; its stdout lines."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=env, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.splitlines()


def test_a_cpu_engine_never_imports_triton_and_a_late_interpreter_is_one_sentence():
    out = run_script("""
        import os, sys
        from mtplab import Engine, RunConfig, lazy_triton
        eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", overlap=True,
                               bubble_meter=True, event_timeline=True, device="cpu"))
        eng.generate([[1, 2, 3], [4, 5]], max_new_tokens=6)
        eng.check_invariants()
        manifest = eng.cfg.manifest()            # names the installed triton version
        print("imported", "triton" in sys.modules, manifest["versions"]["triton"] is not None)
        lazy_triton.triton.cdiv(3, 2)           # the kernels bound without the interpreter
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            RunConfig(model="random-tiny", attention_backend="triton", device="cpu")
        except Exception as e:
            print(type(e).__name__, e)
    """)
    assert out[0] == "imported False True"
    assert out[1].startswith("ConfigError TRITON_INTERPRET was set after mtplab's Triton "
                             "kernels were loaded without the interpreter") and len(out) == 2


def test_interpreter_set_after_import_runs_the_kernels_and_unsetting_it_is_one_sentence():
    out = run_script("""
        import os
        from mtplab import Engine, RunConfig
        os.environ["TRITON_INTERPRET"] = "1"      # after the import: nothing is bound yet
        outs = []
        for backend in ("triton", "torch"):
            eng = Engine(RunConfig(model="random-tiny", attention_backend=backend,
                                   device="cpu"))
            outs.append(eng.generate([[1, 2, 3]], max_new_tokens=4))
            eng.check_invariants()
        print("same", outs[0] == outs[1])
        del os.environ["TRITON_INTERPRET"]
        try:
            RunConfig(model="random-tiny", attention_backend="triton", device="cpu")
        except Exception as e:
            print(type(e).__name__, e)
    """)
    assert out[0] == "same True"
    assert out[1].startswith("ConfigError TRITON_INTERPRET was unset after mtplab's Triton "
                             "kernels were loaded under the interpreter") and len(out) == 2


def test_without_the_triton_package_cpu_runs_and_kernels_are_refused_in_one_sentence(
        monkeypatch):
    monkeypatch.setattr(lazy_triton, "_found", False)
    assert RunConfig(model="random-tiny", device="cpu").attention_backend == "torch"
    for kw in ({"attention_backend": "triton"}, {"deterministic": True}):
        with pytest.raises(ConfigError, match=r"triton package is not installed: pip install"):
            RunConfig(model="random-tiny", device="cpu", **kw)
    kernel = lazy_triton.triton.jit(lambda x: x)
    with pytest.raises(lazy_triton.TritonMissingError, match="pip install 'triton>="):
        kernel[(1,)]
