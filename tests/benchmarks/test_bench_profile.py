"""The stage-agreement arithmetic of benchmarks/bench_profile.py (timeline vs profiler)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from mtplab.studies.meter_trust.profile_bench import (RESOLUTION_US, fit_stages,
                                                     stage_agreement)
from mtplab.instrument.timeline import COLUMNS
from mtplab.analysis.trace_io import load_trace
from tests.analysis.test_bubbles import Synth


def _timeline(rows):
    return pd.DataFrame([(step, stage, stream, 0.0, 1.0, g0, g1)
                         for step, stage, stream, g0, g1 in rows], columns=COLUMNS)


def test_stage_agreement_ratio_floor_and_window(tmp_path):
    s = Synth()
    for x in (0, 100):                     # verify: 40 µs per step in the trace
        s.gpu_ann("verify", x, 40)
        s.gpu_ann("publish", x + 50, 2.0)  # publish: 2 µs of kernels per step
    s.gpu_ann("accept", 60, 10)            # accept: 10 µs in the trace, 20 in the timeline
    tr = load_trace(s.write(tmp_path / "t.json"))
    tl = _timeline([
        (3, "verify", "forward", 0.0, 41.0), (4, "verify", "forward", 100.0, 141.0),
        (3, "publish", "forward", 50.0, 52.9), (4, "publish", "forward", 150.0, 152.9),
        (3, "accept", "forward", 60.0, 80.0),
        (4, "verify", "host", 0.0, 1e6),              # host lanes are not GPU time
        (5, "verify", "forward", 200.0, 900.0),       # outside the profiled steps [3, 5)
    ])
    got = {r["stage"]: r for r in stage_agreement(tl, tr, 3, 5,
                                                  stages=("verify", "publish", "accept", "tree"))}
    v = got["verify"]
    assert (v["n"], v["n_trace"]) == (2, 2)
    assert v["timeline_us"] == pytest.approx(41.0) and v["profiler_us"] == pytest.approx(40.0)
    assert v["ratio"] == pytest.approx(80 / 82) and v["agrees"]          # 2.4% off
    p = got["publish"]                  # 31% off, but 0.9 µs per occurrence: under the floor
    assert p["delta_us"] == pytest.approx(0.9) and 0.9 < RESOLUTION_US and p["agrees"]
    a = got["accept"]                   # 10 µs per occurrence apart: neither test passes
    assert a["ratio"] == pytest.approx(0.5) and not a["agrees"]
    t = got["tree"]                     # in neither: not "agreeing" by vacuity
    assert t["n"] == 0 and math.isnan(t["ratio"]) and not t["agrees"]
    # the pair's fixed cost (per stage) comes off the timeline before the comparison
    shifted = {r["stage"]: r["agrees"] for r in stage_agreement(
        tl, tr, 3, 5, stages=("verify", "accept"), offsets={"verify": 10.0, "accept": 10.0})}
    assert shifted == {"verify": False, "accept": True}


def test_fit_stages_recovers_slope_and_fixed_cost():
    rows = [dict(n=8, n_trace=8, profiler_us=p, timeline_us=p + 3.9) for p in (1.7, 8.5, 43, 730)]
    rows.append(dict(n=0, n_trace=0, profiler_us=0.0, timeline_us=0.0))   # not seen: left out
    slope, icpt, resid = fit_stages(rows)
    assert slope == pytest.approx(1.0) and icpt == pytest.approx(3.9) and resid < 1e-9
    rows[1]["timeline_us"] += 2.0                                          # one stage off by 2 µs
    assert fit_stages(rows)[2] > 1.0
    with pytest.raises(ValueError, match="fewer than two"):
        fit_stages(rows[:1])
