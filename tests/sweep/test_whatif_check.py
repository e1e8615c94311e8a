"""The validation table on synthetic runs with known answers (studies/whatif/check.py): each
cell's run folder stands for a StepModel, so the measured tok/s are the replays' own."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from mtplab.analysis.whatif import Launch, Loop, StepModel, apply, replay
from mtplab.studies.whatif import check as whatif_check

HOST = {"schedule": 10.0, "prepare": 20.0, "process_result": 30.0, "loop": 40.0}


def model(overlap: bool) -> StepModel:
    """Host 100 µs of its own work per step, a verify graph (5 µs host, 100 µs GPU), d2h."""
    return StepModel(host=dict(HOST),
                     launches=(Launch("verify", 5.0, "forward", (("verify", 100.0),)),
                               Launch("d2h", 2.0, "copy", (("d2h", 3.0),))),
                     loop=Loop(overlap=overlap), graphs=True, d2h_gpu_us=3.0,
                     anchor_tok_s=1000.0, measured_period_us=208.0)


def cells(models: dict, delays: dict) -> pd.DataFrame:
    """One row per (arm, repeat) -> its model; tok/s = 1e6 / the model's replayed period."""
    rows = []
    for (overlap, rep), m in models.items():
        d = delays.get(overlap, 0)
        rows.append({"status": "ok", "cell_id": f"c{int(overlap)}{rep}",
                     "run_dir": f"run/{overlap}/{rep}",
                     "settings_json": json.dumps({"repeat": rep, "overlap": overlap,
                                                  "host_delay_us": d}),
                     "cfg.overlap": overlap, "cfg.zb_async_d2h": True, "host_delay_us": d,
                     "meter_tok_per_s": 1e6 / replay(m).period_us, "bubble_frac": 0.0})
    return pd.DataFrame(rows)


@pytest.fixture
def runs(monkeypatch):
    """Patch the run loader: a run folder names its model in `made`."""
    made: dict = {}
    monkeypatch.setattr(whatif_check, "load_run", lambda p: made[str(p)])
    return made


def test_a_slower_arm_host_is_taken_out_at_its_speed(runs):
    # the overlap arm's host ran 1.5x slower than the baseline's in both repeats: the replay
    # from the baseline predicts 208 / 107 = 1.94x, measured is 208 / 160.5 = 1.30x
    base = model(False)
    slow_on = apply(model(True), "host:all*1.5")
    models = {(False, 0): base, (False, 1): base, (True, 0): slow_on, (True, 1): slow_on}
    for (ov, rep), m in models.items():
        runs[f"run/{ov}/{rep}"] = m
    v = whatif_check.validate(cells(models, {}), pairs=[
        ("ov=1 async=1 dsl=0 pre=0 fold=0 delay=0", "ov=0 async=1 dsl=0 pre=0 fold=0 delay=0")])
    assert len(v) == 1
    r = v.iloc[0]
    assert r["whatif"] == "overlap=on"
    assert r["ratio"] == pytest.approx(208.0 / 160.5)
    assert r["predicted"] == pytest.approx(208.0 / 107.0)
    assert r["judged"] == "off"
    assert r["host_speed"] == pytest.approx(1.5)
    assert r["error_at_speed"] == pytest.approx(0.0, abs=1e-9)
    assert r["judged_at_speed"] == "within 10%"
    s = whatif_check.summary(v)
    assert "0 of 1 predicted ratios within 10%" in s
    assert "at the arm's host speed: 1 of 1 within 10%" in s and "1.50x" in s


def test_a_planted_delay_is_not_scaled_with_the_host(runs):
    # baseline: overlap off with a 1,000 µs spin after every step, its host 2x faster than
    # the arm's (no delay): at speed, the replay drops the spin and doubles the rest
    fast = apply(model(False), "host:all*0.5")
    base = replace(fast, host={**fast.host, "loop": fast.host["loop"] + 1000.0})
    arm = model(False)
    models = {(False, 0): base, (False, 1): base}
    df = cells(models, {False: 1000})
    arm_rows = cells({(True, 0): arm, (True, 1): arm}, {})
    arm_rows["cfg.overlap"] = False                   # same loop, only the delay differs
    arm_rows["run_dir"] = ["run/arm/0", "run/arm/1"]
    arm_rows["settings_json"] = [json.dumps({"repeat": i, "overlap": False}) for i in (0, 1)]
    for k, m in models.items():
        runs[f"run/{k[0]}/{k[1]}"] = m
    runs["run/arm/0"] = runs["run/arm/1"] = arm
    v = whatif_check.validate(pd.concat([df, arm_rows], ignore_index=True))
    r = v[v["whatif"] == "host:loop-1000"].iloc[0]
    assert r["host_speed"] == pytest.approx(2.0)
    assert r["error_at_speed"] == pytest.approx(0.0, abs=1e-9)
    assert r["error"] > 0.2                           # raw: the faster baseline host kept
    assert whatif_check.speed_whatif(2.0, 1000) == "host:loop-1000,host:all*2,host:loop+1000"
    assert whatif_check.speed_whatif(1.25) == "host:all*1.25"


def test_a_repeat_without_its_arm_has_no_speed(runs):
    base = model(False)
    models = {(False, 0): base, (True, 1): model(True)}
    for (ov, rep), m in models.items():
        runs[f"run/{ov}/{rep}"] = m
    v = whatif_check.validate(cells(models, {}))
    assert v["host_speed"].isna().all() and v["error_at_speed"].isna().all()
    assert (v["judged_at_speed"] == v["judged"]).all()


def row(ov, asy, dsl, pre, draft="frozen_kv_mtp", delay=0, fold=False) -> dict:
    return {"cfg.overlap": ov, "cfg.zb_async_d2h": asy, "cfg.zb_device_seq_lens": dsl,
            "cfg.zb_draft_preexec": pre, "cfg.fold_seed": fold, "host_delay_us": delay,
            "cfg.draft": draft}


def test_each_arm_flips_each_knob_both_ways():
    on, zb, off = row(1, 1, 0, 0), row(1, 1, 1, 1), row(0, 1, 0, 0)
    flip = whatif_check.flip_between
    assert flip(on, zb) == "zero_bubble=on" and flip(zb, on) == "zero_bubble=off"
    assert flip(on, row(1, 1, 1, 0)) == "zb_device_seq_lens=on"
    assert flip(zb, row(1, 0, 1, 1)) == "zb_async_d2h=off"
    assert flip(off, on) == "overlap=on" and flip(on, off) == "overlap=off"
    assert flip(zb, row(1, 1, 1, 1, fold=True)) == "fold_seed=on"
    assert flip(zb, row(1, 1, 1, 1, delay=1000)) == "host:loop+1000"
    # two knobs, or a sub-knob set that is neither zero_bubble's nor the default: no flip
    assert flip(off, zb) is None and flip(row(1, 0, 1, 0), zb) is None
    assert flip(on, row(1, 1, 1, 1, delay=5)) is None and flip(on, on) is None
    # target-only: the worker's sub-knob has nothing to act on
    t_on, t_zb = row(1, 1, 0, 0, "none"), row(1, 1, 1, 0, "none")
    assert flip(t_on, t_zb) == "zero_bubble=on" and flip(t_zb, t_on) == "zero_bubble=off"


def test_validation_covers_both_directions_with_their_errors(runs):
    """A Frozen-KV ladder point (on, zb and zb without preexec), each arm measured at its own
    replay: every one-knob pair both ways, each predicted exactly but the host-paced seed's,
    whose arm is slower than its prediction."""
    from tests.analysis.test_whatif import host_paced_seed_base
    base = host_paced_seed_base(100.0)
    arms = {"on": (base, row(1, 1, 0, 0)),
            "zb": (apply(base, "zero_bubble=on"), row(1, 1, 1, 1)),
            "zb-pre": (apply(base, "zb_device_seq_lens=on"), row(1, 1, 1, 0))}
    measured = dict(arms)
    measured["zb"] = (apply(base, "zero_bubble=on,gpu:verify*1.2"), row(1, 1, 1, 1))
    rows = []
    for name, (m, r) in arms.items():
        for rep in (0, 1):
            runs[f"run/{name}/{rep}"] = m
            rows.append({**r, "status": "ok", "cell_id": f"{name}{rep}",
                         "run_dir": f"run/{name}/{rep}",
                         "settings_json": json.dumps({"repeat": rep, "arm": name}),
                         "meter_tok_per_s": 1e6 / replay(measured[name][0]).period_us})
    v = whatif_check.validate(pd.DataFrame(rows).assign(settings_json=[
        json.dumps({"repeat": i % 2}) for i in range(len(rows))]), pairs=[], flips=True)
    assert sorted(v["direction"]) == ["zb_device_seq_lens off", "zb_device_seq_lens on",
                                      "zb_draft_preexec off", "zb_draft_preexec on",
                                      "zero_bubble off", "zero_bubble on"]
    d = whatif_check.by_direction(v).set_index("direction")
    # into zb: the arm's verify ran 1.2x longer than the replay has it, so the prediction
    # is above the measured; from zb the error is the other way
    assert d.loc["zero_bubble on", "worst_error"] > 0.1
    assert d.loc["zero_bubble off", "worst_error"] < -0.1
    assert d.loc["zb_device_seq_lens on", "median_abs_error"] == pytest.approx(0.0, abs=1e-9)
    md = whatif_check.direction_md(v)
    assert "| zero_bubble on | 1 |" in md and "| zero_bubble off | 1 |" in md
