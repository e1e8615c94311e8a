"""The what-if predictor on real (CPU) runs: the step profile's tables, `mtplab whatif`, and
the validation table a sweep's cells give (studies/whatif/check.py). Timing accuracy is a GPU
claim (docs/results/); on CPU these check the path and the tables' meaning."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from mtplab import Engine, RunConfig
from mtplab.analysis.whatif import load_run, predict, replay, WhatIfError
from mtplab.analysis.whatif_cli import main_whatif
from mtplab.sweep import grid_from_dict, run_sweep
from mtplab.sweep import step_profile
from mtplab.studies.whatif.check import validate, summary
from mtplab.instrument.stepclock import StepClock
from tests.helpers import random_prompts


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("wi")
    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", simulate_accept_len=2.5,
                    overlap=True, zero_bubble=True, bubble_meter=True, device="cpu",
                    trace_dir=str(d), run_name="r", debug_invariants=True)
    with Engine(cfg) as eng:
        ps = random_prompts(3, [12, 20, 16], eng.model.config.vocab_size)
        eng.generate(ps, max_new_tokens=24, ignore_eos=True)
        files = step_profile.record(eng, ps, 24, 0.0, eng.stats()["meter_tok_per_s"])
        eng.check_invariants()
        eng.finish()
        meter = eng.meter_frame()
    return files["host_steps"].parent, meter


def test_host_table_names_the_meters_decode_steps(run_dir):
    d, meter = run_dir
    host = pd.read_parquet(d / "host_steps.parquet")
    names = meter.set_index("step")["name"]
    assert len(host) >= 5
    assert all(names[s].startswith("step[decode") for s in host["step"])
    # the period holds every outermost span of the iteration
    spans = [c for c in host.columns if c not in ("step", "period_us") and "@" not in c]
    assert (host["period_us"] >= host[spans].sum(axis=1) - 1e-6).all()
    anchor = json.loads((d / "whatif.json").read_text())
    assert anchor["seed_forward"] and anchor["latency_us"] == 0.0 and anchor["steps"] == len(host)


def test_load_run_replays_the_run_itself(run_dir):
    m = load_run(run_dir[0])
    assert m.loop.overlap and m.loop.draft_preexec and m.loop.host_runs_device
    # the launches are the zero-bubble plan's: the draft runs after commit
    stages = [la.stage for la in m.launches]
    assert stages.index("draft") > stages.index("commit")
    # on CPU everything runs in series: the replay is the measured period but for the sync
    # spans' own time (the replay recomputes waits, and nothing waits on CPU)
    assert replay(m).period_us == pytest.approx(m.measured_period_us, rel=2e-3)
    df = predict(m, ["overlap=off", "zero_bubble=off", "host:loop=0", "gpu:verify*2"])
    assert df.loc[df["what"] == "host:loop=0", "ratio"].iloc[0] > 1.0
    assert df.loc[df["what"] == "gpu:verify*2", "ratio"].iloc[0] < 1.0
    # overlap cannot hide host time where the host runs the device's work
    assert df.loc[df["what"] == "overlap=off", "ratio"].iloc[0] == pytest.approx(1.0, abs=0.02)


def test_whatif_cli(run_dir, capsys):
    assert main_whatif([str(run_dir[0]), "--what", "overlap=off", "--what", "host:loop=0"]) == 0
    out = capsys.readouterr().out
    assert "| overlap=off |" in out and "bubble causes" in out and "host_prep" in out
    assert main_whatif([str(run_dir[0]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["whatifs"][0]["what"] == "(run)" and doc["causes"]


def test_whatif_cli_refuses_in_one_line(tmp_path, capsys):
    assert main_whatif([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--step-profile true" in err
    with pytest.raises(WhatIfError, match="not a folder"):
        load_run(tmp_path / "nothing")


def test_step_clock_periods_and_nesting():
    class Null:
        def __enter__(self):
            return self

        def __exit__(self, *e):
            return False

    c = StepClock(first_step=7)
    for kind in ("prefill", "decode", "decode", "decode"):
        with c.span("schedule", Null()):
            pass
        with c.step(f"step[{kind} bs=1]", Null()):
            with c.span("prepare", Null()):
                with c.span("sync", Null()):
                    pass
            with c.span("verify", Null(), graphed=True):
                pass
            with c.span("draft.seed", Null()):
                pass
    df = c.frame()
    assert list(df["step"]) == [8, 9]            # the last decode step has no next start
    assert {"sync@prepare", "prepare", "verify", "draft.seed"} <= set(df.columns)
    assert c.eager == {"draft.seed"}
    assert (df["period_us"] > 0).all()


@pytest.mark.slow
def test_validation_table_from_a_sweep(tmp_path):
    """Cells differing in overlap and a planted host delay: the table pairs them, predicts
    each ratio from the baseline's run, and judges it against the repeats' spread."""
    doc = {"base": {"model": "random-tiny", "device": "cpu", "draft": "frozen_kv_mtp",
                    "simulate_accept_len": 2.5, "fold_seed": True, "prompt_len_tokens": 16,
                    "output_len_tokens": 24, "warmup_output_len_tokens": 2, "batch_size": 2,
                    "event_timeline": False, "step_profile": True},
           "grid": {"repeat": [0, 1]},
           "arms": [{"overlap": False}, {"overlap": True},
                    {"overlap": False, "host_delay_us": 20000}]}
    df = run_sweep(grid_from_dict(doc).cells(), tmp_path / "sw", progress=False)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    v = validate(df)
    assert set(v["whatif"]) >= {"overlap=on", "overlap=off", "host:loop+20000",
                                "host:loop-20000"}
    delay = v[v["whatif"] == "host:loop+20000"].iloc[0]
    assert delay["predicted"] < 0.9 and delay["ratio"] < 0.9      # a 20 ms delay shows
    assert not math.isnan(delay["error"]) and delay["n"] == 2
    assert delay["judged"] in ("within 10%", "off")
    ov = v[v["whatif"] == "overlap=on"].iloc[0]
    assert ov["predicted"] == pytest.approx(1.0, abs=0.05)         # CPU: nothing to hide
    # the hosts' speeds from the runs' process_result, both repeats paired
    assert 0.2 < ov["host_speed"] < 5.0 and not math.isnan(ov["error_at_speed"])
    assert delay["judged_at_speed"] in ("within 10%", "off")
    assert "predicted ratios within 10%" in summary(v) or "nothing to judge" in summary(v)
