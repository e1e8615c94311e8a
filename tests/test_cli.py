"""The CLI end to end (subprocess, like a user), and its parsing table-driven (in process)."""
import json
import subprocess
import sys
from dataclasses import fields

import pytest

from mtplab import cli
from mtplab.analysis.cli import plot_source
from mtplab.config import RunConfig


def run(*args, timeout=300, cwd=None):
    return subprocess.run([sys.executable, "-m", "mtplab.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd)


def parse_run(*argv):
    return cli.build_parser().parse_args(["run", *argv])


def test_run_prints_results_table():
    r = run("run", "--model", "random-tiny", "--page-size", "16", "--prompts", "4",
            "--max-new-tokens", "8", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert "tok_per_s" in r.stdout and "decode_steps" in r.stdout
    assert "  set: page_size=16" in r.stdout


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
    (["--min-prompt-len", "0"], "argument --min-prompt-len: must be a positive integer"),
    (["--prompts", "0"], "argument --prompts: must be a positive integer"),
    (["--max-new-tokens", "-2"], "argument --max-new-tokens: must be a positive integer"),
    (["--temperature", "nan"], "argument --temperature: must be a non-negative finite"),
])
def test_bad_workload_is_one_clear_error(argv, message, capsys):
    try:
        rc = cli.main(["run", "--device", "cpu", *argv])
    except SystemExit as e:                       # argparse's own refusal
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("mtplab run: error: ")


def test_run_help_documents_every_knob(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")                  # argparse wraps at hyphens too
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())        # argparse wraps lines
    assert "--draft {none,frozen_kv_mtp,eagle,gemma4_assistant}" in text
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


# ------------------------------------------------------------------ mtplab run --out, the header
def test_run_out_writes_results_and_manifest_and_explains_its_table(tmp_path):
    out = tmp_path / "o"
    r = run("run", "--model", "random-tiny", "--page-size", "16", "--prompts", "3",
            "--max-new-tokens", "6", "--device", "cpu", "--draft", "frozen_kv_mtp", "--topk", "2",
            "--overlap", "true", "--simulate-accept-len", "2.5", "--out", str(out))
    assert r.returncode == 0, r.stderr
    head = r.stdout[r.stdout.index("mtplab run:"):].splitlines()
    assert head[0] == "mtplab run: model=random-tiny draft=frozen_kv_mtp device=cpu dtype=float32"
    assert head[1].split() == ["set:", "topk=2", "page_size=16", "overlap=True",
                               "simulate_accept_len=2.5"]            # every knob given
    assert head[2].startswith("  resolved:") and "attention_backend=torch" in head[2]
    assert "- overshoot_rows: batch rows the overlap loop ran for a request" in r.stdout
    assert "the prefill-to-first-decode gap is left out" in r.stdout
    res = json.loads((out / "results.json").read_text(), parse_constant=_no_nan)
    man = json.loads((out / "manifest.json").read_text(), parse_constant=_no_nan)
    assert res["stats"]["tokens"] == 18 and res["workload"]["prompts"] == 3
    assert man["config"]["topk"] == 2 and man["config"]["overlap"] is True
    assert {"versions", "git_commit", "device_name"} <= set(man)
    assert f"wrote results: {out / 'results.json'}" in r.stdout


def test_run_out_holds_the_whole_run(tmp_path):
    """--out DIR is the run folder: the meter tables, the step profile, results.json and the
    manifest go there and nowhere else, and whatif / analyze / plot take DIR."""
    r = run("run", "--model", "random-tiny", "--prompts", "2", "--max-new-tokens", "8",
            "--device", "cpu", "--draft", "frozen_kv_mtp", "--simulate-accept-len", "2.5",
            "--overlap", "true", "--step-profile", "true", "--out", "runs/a", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "runs" / "a"
    assert {"manifest.json", "results.json", "meter_stages.parquet", "host_steps.parquet",
            "whatif.json"} <= {p.name for p in out.iterdir()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]      # no ./traces
    assert f"what if: mtplab whatif {out}" in r.stdout
    w = run("whatif", "runs/a", "--what", "host:loop=0", cwd=tmp_path)
    assert w.returncode == 0, w.stderr
    assert "self error" in w.stdout and "| host:loop=0 |" in w.stdout
    a = run("analyze", "runs/a", cwd=tmp_path)
    assert a.returncode == 2 and a.stderr.count("\n") == 1
    assert "is a run folder without a Kineto trace" in a.stderr and "--profile true" in a.stderr
    p = run("plot", "runs/a", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (out / "timeline.png").is_file()


def test_a_field_name_with_underscores_is_its_flag(capsys):
    # --page_size is --page-size: the refusal names the flag, so the alias was parsed
    assert cli.main(["run", "--device", "cpu", "--page_size", "3"]) == 2
    assert "--page-size 3 is not a power of two" in capsys.readouterr().err
    assert cli.dashed_flags(["--page_size=16", "--", "--keep_me"]) == ["--page-size=16", "--",
                                                                       "--keep_me"]


def test_an_unknown_flag_names_the_subcommand_and_the_nearest_flag(capsys):
    assert cli.main(["run", "--device", "cpu", "--page-sise", "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("mtplab run: error: unrecognized arguments: --page-sise 16; did you "
                          "mean --page-size? (see mtplab run --help)")


def test_run_out_with_another_run_folder_is_refused(tmp_path, capsys):
    assert cli.main(["run", "--device", "cpu", "--out", str(tmp_path / "o"), "--trace-dir",
                     str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert "--out DIR is the run folder, and --trace-dir would name another" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "t").exists()


def test_run_names_the_meter_clock_of_its_bubble_on_cpu(tmp_path):
    """On CPU the bubble meter stamps the host clock: `mtplab run`'s table names it so, its
    legend says what that is, and results.json (Engine.stats()) carries meter_clock."""
    out = tmp_path / "o"
    r = run("run", "--model", "random-tiny", "--prompts", "2", "--max-new-tokens", "6",
            "--device", "cpu", "--bubble-meter", "true", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines() if line.startswith("  bubble_")]
    assert [row[:4] for row in rows] == [["bubble_frac", "(meter,", "host", "clock)"],
                                         ["bubble_us_per_step", "(meter,", "host", "clock)"]]
    assert "  meter_clock" in r.stdout and "- bubble_frac: " in r.stdout
    assert "on CPU the host clock" in r.stdout
    stats = json.loads((out / "results.json").read_text(), parse_constant=_no_nan)["stats"]
    assert stats["meter_clock"] == "host" and 0 <= stats["bubble_frac"] <= 1


def _no_nan(name):
    raise ValueError(f"not strict JSON: {name}")


def test_a_refused_run_makes_no_out_folder(tmp_path, capsys):
    assert cli.main(["run", "--device", "cpu", "--page-size", "3", "--out",
                     str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--page-size 3 is not a power of two" in err          # the flag, not page_size=3
    assert not (tmp_path / "o").exists()


def test_itl_leaves_out_the_prefill_to_first_decode_gap():
    """Deliveries at 0 (prefill), 100 (first decode), 110, 120 ms: ITL is 10 ms, not 100."""
    from types import SimpleNamespace

    from mtplab.sched.scheduler import StepStats
    from mtplab.stats import collect_stats
    req = SimpleNamespace(output_ids=[1, 2, 3, 4], arrivals=[(0.0, 1), (0.1, 1), (0.11, 1),
                                                             (0.12, 1)], finished_reason="length")
    st = collect_stats([req], StepStats(), 1.0, num_steps=3, speculative=False, simulated=False)
    assert st["itl_p50_ms"] == pytest.approx(10.0) and st["itl_p99_ms"] == pytest.approx(10.0)
    assert st["tpot_p50_ms"] == pytest.approx(40.0)                 # TPOT keeps the whole span
    from mtplab.sglang.client import chunk_itl
    # SGLang chunks: prefill at 0, then 2 tokens at 0.1, 2 more at 0.12: 10 ms per token
    assert chunk_itl([0.0, 0.1, 0.12], [1, 3, 5]) == pytest.approx([0.01, 0.01])


# ------------------------------------------------------------------ smaller points
def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    from mtplab import __version__
    assert capsys.readouterr().out == f"mtplab {__version__}\n"


@pytest.mark.parametrize("value,text", [(1432.7, "1,433"), (14300.2, "14,300"), (143.2, "143"),
                                        (14.32, "14.3"), (5.0, "5"), (0.01234, "0.0123"),
                                        (2e-5, "2e-05"), (7, "7"), (123456, "123,456"),
                                        (float("nan"), "-"), (None, "-")])
def test_numbers_are_printed_readably(value, text):
    from mtplab.fmt import readable
    assert readable(value) == text


@pytest.mark.parametrize("cores,threads,workers,fix", [
    (2, 1, None, "use --workers 1 (or --executor local)."),   # the default on a 2-core machine
    (2, 1, 3, "use --workers 1 (or --executor local)."),
    (8, 2, 4, "use --workers 3, or fewer torch threads per cell"),
    (4, 1, 4, "use --workers 3."),
])
def test_dask_cpu_workers_that_fill_the_cores_are_one_warning(monkeypatch, caplog, cores,
                                                               threads, workers, fix):
    """Cells running at once on every core (workers x torch threads per cell >= cores, the
    default of one worker per core included) get one line naming the fix."""
    from mtplab.sweep import executors
    monkeypatch.setattr(executors, "usable_cores", lambda: cores)
    monkeypatch.setattr(executors, "cell_threads", lambda: threads)
    with caplog.at_level("WARNING", logger="mtplab.sweep"):
        assert executors.cpu_workers(workers) == (workers or cores)
    (rec,) = caplog.records
    msg = rec.getMessage()
    assert f"{workers or cores} Dask CPU workers x {threads} torch thread(s) per cell on " \
           f"{cores} cores" in msg and fix in msg and "\n" not in msg


@pytest.mark.parametrize("cores,threads,workers", [(2, 1, 1), (4, 1, 3), (8, 2, 3), (1, 1, None),
                                                   (16, 4, 1)])
def test_dask_cpu_workers_that_leave_a_core_are_silent(monkeypatch, caplog, cores, threads,
                                                        workers):
    from mtplab.sweep import executors
    monkeypatch.setattr(executors, "usable_cores", lambda: cores)
    monkeypatch.setattr(executors, "cell_threads", lambda: threads)
    with caplog.at_level("WARNING", logger="mtplab.sweep"):
        executors.cpu_workers(workers)
    assert not caplog.records


def test_cell_threads_are_those_the_dask_nanny_gives(monkeypatch):
    import dask
    from mtplab.sweep.executors import cell_threads
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert cell_threads() == 1          # distributed's default pre-spawn-environ sets 1
    with dask.config.set({"distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": 4}}):
        assert cell_threads() == 4
    with dask.config.set({"distributed.nanny.pre-spawn-environ": {}}):
        assert cell_threads() == 6      # the worker inherits this environment


def test_bench_smoke_calls_its_ratios_path_checks():
    import pandas as pd

    from mtplab.studies.bench import SMOKE_NOTE, SMOKE_RATIO, header, table
    doc = {"grid": {"repeat": [0]}, "arms": [{"overlap": False}, {"overlap": True}]}
    assert SMOKE_RATIO in table(pd.DataFrame(), doc, smoke=True)
    assert SMOKE_RATIO not in table(pd.DataFrame(), doc)
    assert header({}, True, None).endswith(SMOKE_NOTE) and "not results" in SMOKE_NOTE
    assert SMOKE_NOTE not in header({}, False, None)


def test_save_target_files_have_the_umask_mode(tmp_path):
    """safetensors creates its file 0600; the saved model gets what open() would give."""
    import os
    import stat

    from mtplab.atomic import FILE_MODE
    mask = os.umask(0)
    os.umask(mask)
    assert FILE_MODE == 0o666 & ~mask
    from mtplab import Engine, RunConfig
    Engine(RunConfig(model="random-tiny", device="cpu")).save_target(tmp_path / "m")
    for name in ("model.safetensors", "config.json"):
        assert stat.S_IMODE((tmp_path / "m" / name).stat().st_mode) == 0o666 & ~mask, name
