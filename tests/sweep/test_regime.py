"""The regime map (studies/regime/ladder.py) on results frames whose answers are known, and the
bench's --quick / --only / --budget-s (a subset of rungs within a time budget)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from mtplab.studies.bench import effective_doc, grid_doc, parse_only
from mtplab.errors import ConfigError
from mtplab.sweep import executors
from mtplab.sweep.grid import grid_from_dict
from mtplab.sweep.process import CellJob, CellOutcome
from mtplab.studies.regime.ladder import (arm_label, crossovers, plot_regime, regime_table,
                                          table_md, validation_pairs)
from tests.helpers import assert_drawn_png


def row(draft="none", overlap=False, zb=False, fold=True, delay=0.0, **kw) -> dict:
    spec = draft != "none"
    return {"cfg.draft": draft, "cfg.overlap": overlap, "cfg.zb_async_d2h": True,
            "cfg.zb_device_seq_lens": zb, "cfg.zb_draft_preexec": zb and spec,
            "cfg.fold_seed": fold and draft == "frozen_kv_mtp", "host_delay_us": delay, **kw}


def test_arm_labels():
    assert arm_label(row()) == "target off"
    assert arm_label(row(overlap=True)) == "target on"
    assert arm_label(row(overlap=True, zb=True)) == "target zb"
    assert arm_label(row(overlap=True, zb=True, delay=1000.0)) == "target zb +1ms"
    assert arm_label(row("frozen_kv_mtp", True, True)) == "frozen_kv_mtp zb"
    assert arm_label(row("frozen_kv_mtp", True, True, fold=False)) == "frozen_kv_mtp zb unfolded"
    assert arm_label({**row("frozen_kv_mtp", True, True), "cfg.zb_draft_preexec": False}) == \
        "frozen_kv_mtp zb-zb_draft_preexec"
    assert arm_label(row("eagle", True, True)) == "eagle zb"          # no seed: never unfolded
    assert ("frozen_kv_mtp zb unfolded", "frozen_kv_mtp zb") in validation_pairs()


def frame():
    """Two rungs, two arms each, two repeats: at the small rung (GPU 100 µs, host 400 µs)
    speculation buys 2.0x, at the large one (GPU 4000, host 500) it costs: 0.5x."""
    recs = []
    for layers, gpu, host, spec in ((4, 100.0, 400.0, 2.0), (16, 4000.0, 500.0, 0.5)):
        for rep, wob in ((0, 1.0), (1, 1.01)):
            base = {"status": "ok", "cfg.model": "llama3-8b-like", "cfg.layers": layers,
                    "batch_size": 8, "prompt_len_tokens": 512, "repeat": rep,
                    "cfg.device": "cuda", "meter_wall_us_per_step": gpu + 50.0,
                    "bubble_us_per_step": 50.0, "bubble_frac": 0.1,
                    "host_busy_p50_us_per_step": host}
            recs.append({**row(overlap=True, zb=True), **base, "meter_tok_per_s": 1000.0 * wob})
            recs.append({**row("frozen_kv_mtp", True, True), **base,
                         "meter_tok_per_s": 1000.0 * spec * wob})
    return pd.DataFrame(recs)


def test_regime_table_places_each_rung_by_its_baseline():
    t = regime_table(frame())
    assert list(t["effect"]) == ["speculation: frozen_kv_mtp"] * 2
    small, large = t.iloc[0], t.iloc[1]                  # in x order
    assert small["x"] == pytest.approx(100.0 / 400.0) and large["x"] == pytest.approx(8.0)
    assert small["ratio"] == pytest.approx(2.0) and large["ratio"] == pytest.approx(0.5)
    assert (small["verdict"], large["verdict"]) == ("faster", "slower")
    md = table_md(t)
    assert "| speculation: frozen_kv_mtp | llama3-8b-like@4 bs8 p512 | 0.25 |" in md


def test_a_rung_has_one_x_from_its_reference_arm_and_a_resolved_name_once(tmp_path):
    """Every effect of a rung sits at the x of its target zb arm (not of the effect's
    baseline); a preset's resolved name (llama3-8b-like@16) is not given its depth twice; a
    row recorded without host_busy_p50_us_per_step takes it from its run folder's host
    table (here: a sweep folder moved since, found through sweep_dir)."""
    from mtplab.analysis.whatif import HOST_STEPS_FILE
    recs = []
    for rep in (0, 1):
        base = {"status": "ok", "cfg.model": "llama3-8b-like@16", "cfg.layers": 16,
                "batch_size": 8, "prompt_len_tokens": 512, "repeat": rep, "cfg.device": "cuda",
                "bubble_us_per_step": 50.0, "bubble_frac": 0.1}
        recs.append({**row(overlap=True, zb=True), **base, "meter_tok_per_s": 1000.0,
                     "meter_wall_us_per_step": 2050.0, "host_busy_p50_us_per_step": 400.0,
                     "cell_id": f"zb{rep}"})
        recs.append({**row(), **base, "meter_tok_per_s": 900.0,       # target off: its own
                     "meter_wall_us_per_step": 2450.0,                # GPU and host differ
                     "host_busy_p50_us_per_step": 900.0, "cell_id": f"off{rep}"})
        d = tmp_path / "traces" / f"frozen{rep}"
        d.mkdir(parents=True)
        # host table: busy = period - sync per step, median 500 (one slow step of 5000)
        pd.DataFrame({"period_us": [2500.0, 2500.0, 7000.0], "sync": [2000.0] * 3,
                      "schedule": [10.0] * 3}).to_parquet(d / HOST_STEPS_FILE)
        recs.append({**row("frozen_kv_mtp", True, True), **base, "meter_tok_per_s": 1500.0,
                     "meter_wall_us_per_step": 4050.0, "cell_id": f"frozen{rep}",
                     "run_dir": f"/elsewhere/traces/frozen{rep}"})
    t = regime_table(pd.DataFrame(recs), sweep_dir=tmp_path)
    assert set(t["effect"]) == {"overlap + zero_bubble (target)", "speculation: frozen_kv_mtp"}
    assert list(t["x"]) == pytest.approx([2000.0 / 400.0] * 2)
    assert set(t["rung"]) == {"llama3-8b-like@16 bs8 p512"}
    from mtplab.studies.regime.ladder import host_p50
    ok = pd.DataFrame(recs)
    assert list(host_p50(ok, tmp_path)) == [400.0, 900.0, 500.0] * 2
    assert host_p50(ok).isna().sum() == 2                   # not found where it was


def test_crossover_interpolates_in_log_x():
    c = crossovers(regime_table(frame())).iloc[0]
    # log-linear between (0.25, +1.0) and (8, -0.5): 2/3 of the way in log x
    assert c["x_cross"] == pytest.approx(math.exp(math.log(0.25) + 2 / 3 * math.log(32)))
    assert "pays below and costs above" in c["sentence"]
    assert "llama3-8b-like@4 bs8 p512" in c["sentence"]


def test_plot_regime_writes_a_figure(tmp_path):
    t = regime_table(frame())
    fig = plot_regime(t, path=tmp_path / "regime.png")
    assert_drawn_png(tmp_path / "regime.png")
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    # one curve per effect through its (x, ratio) points, named in the legend
    curves = {c.get_label(): c.lines[0] for c in ax.containers}
    for effect, g in t.dropna(subset=["x", "ratio"]).groupby("effect", sort=False):
        g = g.sort_values("x")
        assert list(curves[effect].get_xdata()) == pytest.approx(list(g["x"]))
        assert list(curves[effect].get_ydata()) == pytest.approx(list(g["ratio"]))
    assert set(curves) == set(t.dropna(subset=["x", "ratio"])["effect"]) != set()


def test_quick_variant_spans_three_rungs():
    doc = effective_doc(grid_doc("regime"), smoke=False, repeats=None, bs=None, device="auto",
                        quick=True)
    assert "quick" not in doc and "report" not in doc
    ok = [c for c in grid_from_dict(doc).cells() if c.dropped is None]
    rungs = {(c.settings["model"], c.settings.get("layers"), c.settings["batch_size"])
             for c in ok}
    assert rungs == {("tiny-code", None, 1), ("llama3-8b-like", 4, 1), ("llama3-8b-like", 16, 8)}
    assert len(ok) == 3 * len(doc["arms"]) * 2


def test_only_keeps_a_subset_of_rungs_and_refuses_in_one_sentence():
    only = parse_only(["layers=16", "batch_size=8"])
    assert only == {"layers": [16], "batch_size": [8]}
    doc = effective_doc(grid_doc("regime"), smoke=False, repeats=1, bs=None, device="auto",
                        quick=True, only=only)
    ok = [c for c in grid_from_dict(doc).cells() if c.dropped is None]
    assert {c.settings.get("layers") for c in ok} == {16} and len(ok) == len(doc["arms"])
    with pytest.raises(ConfigError, match="not an axis"):
        effective_doc(grid_doc("regime"), smoke=False, repeats=1, bs=None, device="auto",
                      only={"page_size": [1]})
    with pytest.raises(ConfigError, match="none of these"):
        effective_doc(grid_doc("regime"), smoke=False, repeats=1, bs=None, device="auto",
                      only={"layers": [5]})
    with pytest.raises(ConfigError, match="AXIS=VALUE"):
        parse_only(["layers"])
    with pytest.raises(ConfigError, match="no `quick` variant"):
        effective_doc(grid_doc("overlap"), smoke=False, repeats=1, bs=None, device="auto",
                      quick=True)


def test_budget_starts_no_cell_that_cannot_finish(monkeypatch):
    """A fake clock: each cell takes 30 s; with 100 s the executor runs three (the fourth
    would end past the deadline: 90 + 30 > 100) and counts the rest as not started."""
    now = [0.0]
    monkeypatch.setattr(executors.time, "monotonic", lambda: now[0])
    seen = []

    def fake_run(job):
        seen.append(job.timeout_s)
        now[0] += 30.0
        return CellOutcome(result={"status": "ok"}, rc=0, wall_s=30.0, worker="local")

    monkeypatch.setattr(executors, "run_job", fake_run)
    jobs = [CellJob(cell_id=f"c{i}", out_dir="/tmp", spec={}, timeout_s=600.0)
            for i in range(6)]
    ex = executors.LocalExecutor(deadline=100.0)
    done = list(ex.run(jobs, status=lambda s: None))
    assert [j.cell_id for j, _ in done] == ["c0", "c1", "c2"]
    assert ex.not_started == 3
    assert seen == [100.0, 70.0, 40.0]           # each cell's limit cut to the time left


def test_crossover_where_an_effect_fades_into_the_noise():
    """A planted delay costs 0.2x at x = 1 (noise 5%) and 0.97x at x = 8 (noise 8%: within):
    it fades where the ratio meets 1 - 5%, not at a noise-level crossing of 1 further up."""
    t = pd.DataFrame({"effect": ["delay"] * 3, "rung": ["a", "b", "c"], "x": [1.0, 8.0, 20.0],
                      "ratio": [0.2, 0.97, 1.004], "noise": [0.05, 0.08, 0.02],
                      "verdict": ["slower", "nothing", "nothing"]})
    c = crossovers(t).iloc[0]
    assert c["kind"] == "fades into the noise" and (c["below"], c["above"]) == ("a", "b")
    f = (0.2 - 0.95) / (0.2 - 0.97)                       # log-linear to the level 0.95
    assert c["x_cross"] == pytest.approx(math.exp(f * math.log(8.0)))
    assert "costs below and is within the noise above" in c["sentence"]
    quiet = t.assign(ratio=[1.01, 0.99, 1.004], verdict=["nothing"] * 3)
    assert "is within the noise at every rung" in crossovers(quiet).iloc[0]["sentence"]


def test_crossover_sides_follow_each_rows_verdict():
    """A ratio kept at a table's precision (1.020 at noise 2%) whose verdict, taken at full
    precision, was 'nothing': the crossover sentence calls it within the noise, as its row
    does."""
    t = pd.DataFrame({"effect": ["zb"] * 2, "rung": ["a", "b"], "x": [1.0, 8.0],
                      "ratio": [1.5, 1.020], "noise": [0.05, 0.02],
                      "verdict": ["faster", "nothing"]})
    s = crossovers(t).iloc[0]["sentence"]
    assert "pays below and is within the noise above" in s and "pays at a;" not in s
    assert s.endswith("it pays at a")
