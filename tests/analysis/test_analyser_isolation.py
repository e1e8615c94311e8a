"""The analyser never imports torch or the engine (startup time; works on any Kineto trace)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

FORBIDDEN = ("torch", "mtplab.engine", "mtplab.sched", "mtplab.spec", "mtplab.models",
             "mtplab.config")


def test_analyser_imports_no_torch_and_no_engine(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import mtplab.analysis.cli as cli
        import mtplab.analysis.bubbles, mtplab.analysis.trace_io, mtplab.atomic
        import mtplab.analysis.plots
        import orjson
        trace = {str(tmp_path / "t.json")!r}
        with open(trace, "wb") as f:
            f.write(orjson.dumps({{"traceEvents": [
                {{"ph": "X", "cat": "user_annotation", "name": "step[decode bs=1]", "pid": 1,
                  "tid": 1, "ts": 0.0, "dur": 50.0}},
                {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                  "ts": 1.0, "dur": 1.0, "args": {{"correlation": 5}}}},
                {{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5.0,
                  "dur": 5.0, "args": {{"stream": 7, "device": 0, "correlation": 5}}}}]}}))
        assert cli.main_analyze([trace, "--json"]) == 0
        assert cli.main_plot([trace, "--out", {str(tmp_path / "t.png")!r}]) == 0
        bad = [m for m in {FORBIDDEN!r} if m in sys.modules]
        assert not bad, bad
        print("CLEAN")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("CLEAN")
