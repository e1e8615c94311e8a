"""Bad command-line input, every command: exit 2 with one line on stderr naming the flag and
the fix (never a traceback, never a silently ignored value), and nothing written or created."""
from __future__ import annotations

from pathlib import Path

import pytest

from mtplab import cli
from tests.helpers import Synth


def main(argv: list[str]) -> int:
    """cli.main as the `mtplab` script runs it (argparse's exit is the exit code)."""
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code or 0)


@pytest.fixture
def stepless_trace(tmp_path) -> Path:
    """Two kernels 1 ms apart and no step span: the analyser cuts fixed windows."""
    s = Synth()
    for x in (0.0, 1000.0):
        s.gpu(s.launch(x), x + 5, 10.0)
    return s.write(tmp_path / "w.pt.trace.json", gz=False)


def _grid(tmp_path: Path, text: str) -> str:
    p = tmp_path / "g.yaml"
    p.write_text(text)
    return str(p)


# (argv with {file} = an existing file, {tmp} = tmp_path, {trace} = a stepless trace, {grid} =
# a grid file whose every cell is dropped; the message stderr must hold)
CASES = [
    # -- analyze
    (["analyze", "{trace}", "--window-us", "1e-9"], "--window-us 1e-09 cuts this trace's"),
    (["analyze", "{trace}", "--window-us", "0"], "--window-us: must be a positive finite"),
    (["analyze", "{trace}", "--kernel-delay-us", "-1"], "--kernel-delay-us: must be a non-negat"),
    (["analyze", "{trace}", "--kernel-delay-us", "nan"], "--kernel-delay-us: must be a non-nega"),
    (["analyze", "{trace}", "--kernel-delay-us", "inf"], "--kernel-delay-us: must be a non-nega"),
    # -- run / demo
    (["run", "--device", "cpu", "--trace-dir", "{file}"], "{file} is a file, not a folder"),
    (["demo", "--device", "cpu", "--trace-dir", "{file}"], "{file} is a file, not a folder"),
    (["demo", "--device", "cpu", "--max-new-tokens", "0"],
     "argument --max-new-tokens: must be a positive integer, got '0'"),
    (["demo", "--device", "tpu"], "device='tpu' is not a device"),
    (["demo", "--device", "cpu", "--max-new-tokens", "1", "--trace-dir", "{tmp}/t"],
     "--max-new-tokens 1 is too few for the demo"),
    # -- bench
    (["bench", "--smoke", "--dir", "{file}"], "argument --dir: folder {file}: {file} is a file"),
    (["bench", "--smoke", "--out", "/proc/nope/x.md"], "/proc/nope does not exist"),
    (["bench", "--smoke", "--repeats", "-1"], "argument --repeats: must be a positive integer"),
    (["bench", "--smoke", "--repeats", "0"], "argument --repeats: must be a positive integer"),
    (["bench", "--smoke", "--device", "tpu"], "argument --device: device='tpu' is not a device"),
    (["bench", "--smoke", "--bs", "0"], "argument --bs: must be a positive integer, got '0'"),
    (["bench", "--smoke", "--timeout", "-5"], "argument --timeout: must be a positive finite"),
    (["bench", "--smoke", "--timeout", "0"], "argument --timeout: must be a positive finite"),
    (["bench", "--groups", "{grid}", "--dir", "{tmp}/b"], "group g: every cell is dropped"),
    # -- output paths, every command (validate.check_out_dir / check_out_file)
    (["run", "--trace-dir", "/proc/nope"], "folder /proc/nope: nothing can be written in /proc"),
    (["run", "--trace-dir", "/sys/nope/x"], "nothing can be written in /sys"),
    (["run", "--trace-dir", "{tmp}/" + "a" * 300], "has 300 bytes and this file system allows"),
    (["run", "--trace-dir", "{tmp}", "--run-name", "a" * 300], "has 300 bytes and a folder name"),
    (["run", "--out", "/proc/nope"], "folder /proc/nope: nothing can be written in /proc"),
    (["run", "--out", "{file}/x"], "{file} is a file, not a folder"),
    (["demo", "--trace-dir", "/proc/nope"], "nothing can be written in /proc"),
    (["bench", "--smoke", "--dir", "/proc/nope"], "nothing can be written in /proc"),
    (["bench", "--smoke", "--out", "/proc/nope.md"], "nothing can be written in /proc"),
    (["bench", "--smoke", "--out", "{tmp}"], "file {tmp} is a folder"),
    (["bench", "--smoke", "--out", "{tmp}/" + "a" * 300], "has 300 bytes"),
    (["sglang", "models", "--out", "/proc/nope"], "nothing can be written in /proc"),
    (["sglang", "models", "--out", "{file}/x"], "{file} is a file, not a folder"),
]


@pytest.mark.parametrize("argv,message", CASES, ids=[" ".join(c[0][:3]) + " " + c[1][:20]
                                                      for c in CASES])
def test_bad_input_is_one_line_and_makes_nothing(tmp_path, stepless_trace, capsys, argv,
                                                 message):
    afile = tmp_path / "afile"
    afile.write_text("x")
    grid = _grid(tmp_path, "base: {page_size: 3, device: cpu}\narms: [{overlap: false}]\n")
    fill = dict(file=str(afile), tmp=str(tmp_path), trace=str(stepless_trace), grid=grid)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main([a.format(**fill) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message.format(**fill) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before       # nothing made


def test_plot_out_in_a_missing_folder_is_refused_without_making_it(tmp_path, stepless_trace,
                                                                  capsys):
    out = tmp_path / "no" / "dir" / "x.png"
    assert main(["plot", str(stepless_trace), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'no' / 'dir'} does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "no").exists()
