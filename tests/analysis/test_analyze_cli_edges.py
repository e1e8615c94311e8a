"""`mtplab analyze` / `mtplab plot` edge cases: a reader that closes the pipe,
bad traces through the command line, `plot --out` errors naming the user's path."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mtplab.analysis.cli import main_plot
from test_bubbles import planted


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    s, _ = planted()
    return s.write(tmp_path_factory.mktemp("edges") / "w.pt.trace.json")


@pytest.mark.parametrize("json", [False, True])
def test_closed_pipe_is_quiet(trace, json):
    """`mtplab analyze ... | head`: the reader is gone before the output is written."""
    cmd = [sys.executable, "-m", "mtplab.cli", "analyze", str(trace)] + (["--json"] if json else [])
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()                   # no reader: the write gets EPIPE
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_bad_trace_times_one_line_on_the_command_line(tmp_path):
    p = tmp_path / "nan.json"
    p.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                  b'"tid": 7, "ts": NaN, "dur": 2, "args": {"stream": 18446744073709551619}}]}')
    r = subprocess.run([sys.executable, "-m", "mtplab.cli", "analyze", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and str(p) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("case", ["folder", "parent_is_file", "write_fails"])
def test_plot_out_errors_name_the_users_path(trace, tmp_path, capsys, monkeypatch, case):
    if case == "folder":
        out = tmp_path / "plots.png"
        out.mkdir()
    elif case == "parent_is_file":
        out = trace / "x.png"
    else:                                 # the save itself fails: the temp file is not named
        import mtplab.analysis.plots as plots

        def fail(fig, path, **kw):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(plots.Figure, "savefig", fail)
        out = tmp_path / "t.png"
    assert main_plot([str(trace), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and ".tmp" not in err and len(err.strip().splitlines()) == 1, err
