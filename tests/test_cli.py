"""The CLI end to end (subprocess, like a user), and its parsing table-driven (in process)."""
import subprocess
import sys
from dataclasses import fields

import pytest

from mtplab import cli
from mtplab.analysis.cli import plot_source
from mtplab.config import RunConfig


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "mtplab.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def parse_run(*argv):
    return cli.build_parser().parse_args(["run", *argv])


def test_run_prints_results_table():
    r = run("run", "--model", "random-tiny", "--page-size", "16", "--prompts", "4",
            "--max-new-tokens", "8", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "tok_per_s" in r.stdout and "decode_steps" in r.stdout
    assert "page_size=16" in r.stdout


def test_demo_runs_on_cpu_and_writes_the_run_folder(tmp_path):
    r = run("demo", "--device", "cpu", "--max-new-tokens", "8", "--trace-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "mtplab demo on cpu" in r.stdout and "model tiny-code" in r.stdout
    assert "device bubble: none on CPU" in r.stdout and "mtplab plot --example" in r.stdout
    assert "bubble_frac=nan" not in r.stdout
    assert "profiled steps:" in r.stdout and "skipped" in r.stdout      # the warm-up rule, stated
    assert "USDT" not in r.stderr + r.stdout                           # Kineto's log is silenced
    (run_dir,) = tmp_path.iterdir()
    names = {p.name for p in run_dir.iterdir()}
    assert {"manifest.json", "steps.parquet", "gaps.parquet", "timeline.png",
            "timeline.parquet"} <= names
    assert any(n.endswith(".pt.trace.json.gz") for n in names)
    fig = plot_source(run_dir, path=tmp_path / "again.png")          # `mtplab plot RUN_DIR`
    lanes = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert lanes[0] == "host" and "forward" in lanes
    assert (tmp_path / "again.png").read_bytes()[:4] == b"\x89PNG"


def test_bad_flag_value_is_one_clear_error():
    r = run("run", "--page-size", "3", "--device", "cpu")
    assert r.returncode == 2
    assert "not a power of two" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("text, value", [("true", True), ("TRUE", True), ("1", True),
                                         ("yes", True), ("Yes", True), ("false", False),
                                         ("False", False), ("0", False), ("no", False),
                                         ("NO", False)])
def test_bool_flags_accept(text, value):
    assert parse_run("--overlap", text).overlap is value
    assert parse_run("--cuda-graphs", text).cuda_graphs is value


@pytest.mark.parametrize("text", ["ture", "", "2", "on", "y", "None", "falsey"])
def test_bool_flags_refuse_in_one_line(text, capsys):
    with pytest.raises(SystemExit) as e:
        parse_run("--overlap", text)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("mtplab run: error: argument --overlap: expected true/false/1/0/yes/no")


@pytest.mark.parametrize("text, value", [("0.5,0.5,0.5", (0.5, 0.5, 0.5)), ("1,0.25", (1.0, 0.25)),
                                         ("0.9", (0.9,))])
def test_simulate_accept_rates_parse(text, value):
    args = parse_run("--simulate-accept-rates", text, "--draft", "frozen_kv_mtp",
                     "--device", "cpu", "--num-steps", str(len(value)))
    assert args.simulate_accept_rates == value
    assert cli._config_from_args(args).simulate_accept_rates == value


@pytest.mark.parametrize("argv, message", [
    (["--simulate-accept-rates", "0.5;0.5"], "comma-separated numbers"),
    (["--simulate-accept-rates", "a,b"], "comma-separated numbers"),
    (["--draft", "medusa"], "invalid choice: 'medusa'"),
    (["--page-size", "1.5"], "invalid int value"),
])
def test_bad_values_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_run(*argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv, message", [
    (["--min-prompt-len", "9", "--max-prompt-len", "3"],
     "--min-prompt-len 9 is larger than --max-prompt-len 3"),
    (["--min-prompt-len", "0"], "--min-prompt-len must be >= 1"),
    (["--prompts", "0"], "--prompts and --max-new-tokens must be >= 1"),
])
def test_bad_workload_is_one_clear_error(argv, message, capsys):
    assert cli.main(["run", "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("mtplab run: error: ")


def test_run_help_documents_every_knob(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")                  # argparse wraps at hyphens too
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())        # argparse wraps lines
    assert "--draft {none,frozen_kv_mtp,eagle}" in text
    assert "--attention-backend {auto,torch,triton}" in text
    assert "--overlap {true,false}" in text and "--simulate-accept-rates X,Y,..." in text
    for f in fields(RunConfig):
        doc = f.metadata.get("help")
        assert doc, f"RunConfig.{f.name} has no help metadata"
        assert " ".join(doc.split()) in text, f.name
    assert "(default: none)" in text and "(default: 32)" in text


def test_external_commands_dispatch_without_argparse(capsys):
    """analyze/plot/sweep/bench own their parsers: `mtplab analyze --help` is theirs."""
    assert cli.main(["analyze", "--help"]) == 0
    assert "usage: mtplab analyze" in capsys.readouterr().out
    assert set(cli.EXTERNAL) >= {"analyze", "plot", "sweep", "bench"}
