"""What an arm buys (mtplab/studies/effects.py) on hand-made results: the verdict against the
rounds' noise, the sentence's numbers and reasons, the answer scalars, the figure, and the
repeated cells (interleaved rounds, the probe in round 0 only)."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from mtplab.studies.effects import (MIN_NOISE, NO_VERDICT, arm_effects, effect_answer,
                                  plot_effects, repeated_cells)
from tests.helpers import assert_drawn_png


def frame(arms: dict[str, list[tuple[float, float, float]]], bs: int = 8) -> pd.DataFrame:
    """arm -> [(decode tok/s, meter bubble_frac, meter wall us per step), ...] one per round."""
    rows = []
    for arm, runs in arms.items():
        for i, (tps, bub, wall) in enumerate(runs):
            rows.append({"status": "ok", "arm": arm, "batch_size": bs, "repeat": i,
                         "decode_tok_per_s": tps, "bubble_frac": bub,
                         "meter_wall_us_per_step": wall, "bubble_us_per_step": bub * wall})
    return pd.DataFrame(rows)


def one(df: pd.DataFrame, arm: str, base: str = "off", **kw) -> dict:
    eff = arm_effects(df, "arm", [(arm, base)], by=["batch_size"], **kw)
    assert len(eff) == 1
    return eff.iloc[0].to_dict()


def test_a_gain_beyond_the_noise_is_bought():
    r = one(frame({"off": [(100, 0.40, 1000), (102, 0.42, 1000)],
                   "overlap": [(120, 0.20, 800), (121, 0.21, 800)]}), "overlap")
    assert r["verdict"] == "faster"
    assert r["ratio"] == pytest.approx(120.5 / 101)
    assert r["noise"] == pytest.approx(max(MIN_NOISE, 2 / 101))
    assert r["bubble_pts"] == pytest.approx(-20.5)
    assert r["sentence"].startswith("bs 8: overlap vs off buys 1.193x decode tok/s (120.5 vs 101")
    assert "bubble 41.0% -> 20.5% (-20.5 pts" in r["sentence"]


def test_within_the_noise_buys_nothing_and_says_why():
    # the bubble falls 10 points, the step is no shorter: the device busy time grew
    r = one(frame({"off": [(100, 0.30, 1000), (101, 0.30, 1000)],
                   "zb": [(100.5, 0.20, 1000), (100, 0.20, 1000)]}), "zb")
    assert r["verdict"] == "nothing"
    s = r["sentence"]
    assert "zb vs off buys nothing: 0.998x decode tok/s" in s and "is within the noise" in s
    assert "removes 10.0 idle points, but device work took their place" in s
    assert "device busy per decode step 700 -> 800 us" in s
    # the bubble did not move: said so
    r = one(frame({"off": [(100, 0.30, 1000), (101, 0.30, 1000)],
                   "zb": [(100.5, 0.303, 1000), (100, 0.30, 1000)]}), "zb")
    assert "the idle share of the step did not change either" in r["sentence"]
    # little bubble to remove in the first place
    r = one(frame({"off": [(100, 0.02, 1000), (100, 0.02, 1000)],
                   "zb": [(100.5, 0.02, 1000), (100.5, 0.02, 1000)]}), "zb")
    assert "idle only 2.0% of the step" in r["sentence"]
    assert "noise ±2.0%" in r["sentence"] and r["noise"] == MIN_NOISE


def test_one_repeat_gives_no_verdict(tmp_path):
    """One round measures no spread: no buys / costs, whatever the ratio; the figure says
    there is no noise to draw."""
    df = frame({"off": [(100, 0.40, 1000)], "ov": [(62.3, 0.2, 1000)],
                "zb": [(130, 0.1, 1000), (131, 0.1, 1000)]})
    eff = arm_effects(df, "arm", [("ov", "off"), ("zb", "off")], by=["batch_size"])
    assert list(eff["verdict"]) == [NO_VERDICT, NO_VERDICT] == ["no verdict: one repeat"] * 2
    s = eff["sentence"].iloc[0]
    assert s.startswith("bs 8: ov vs off: no verdict: one repeat (0.623x decode tok/s")
    assert "buys" not in s and "costs" not in s
    assert effect_answer(eff)["bs8.ov_vs_off.buys"] == NO_VERDICT
    fig = plot_effects(eff, path=tmp_path / "e.png")
    assert "one repeat: no noise measured, no verdict" in fig._suptitle.get_text()
    assert "the rounds' noise" not in fig._suptitle.get_text()
    plt.close(fig)


def test_wide_noise_and_a_loss():
    r = one(frame({"off": [(100, 0.3, 1000), (150, 0.3, 1000)],
                   "zb": [(110, 0.3, 1000), (111, 0.3, 1000)]}), "zb")
    assert r["verdict"] == "nothing" and "the rounds disagree by up to 40%" in r["sentence"]
    r = one(frame({"off": [(100, 0.3, 1000), (101, 0.3, 1000)],
                   "zb": [(80, 0.5, 1000), (81, 0.5, 1000)]}), "zb")
    assert r["verdict"] == "slower" and "zb vs off costs: 0.801x" in r["sentence"]


def test_pairs_points_extra_and_failed_rows():
    df = pd.concat([frame({"off": [(100, 0.3, 1000)] * 2, "ov": [(130, 0.1, 1000)] * 2}, bs=1),
                    frame({"off": [(200, 0.3, 1000)] * 2, "ov": [(202, 0.3, 1000)] * 2}, bs=8)])
    df["draft_ms"] = [1.0, 1.0, 0.5, 0.5, 2.0, 2.0, 1.0, 1.0]
    df = pd.concat([df, pd.DataFrame([{"status": "failed", "arm": "ov", "batch_size": 8,
                                       "decode_tok_per_s": math.nan}])])
    eff = arm_effects(df, "arm", [("ov", "off"), ("missing", "off")], by=["batch_size"],
                      extra=["draft_ms"])
    assert list(eff["where"]) == ["bs 1", "bs 8"] and list(eff["n"]) == [2, 2]
    assert list(eff["verdict"]) == ["faster", "nothing"]
    assert list(eff["draft_ms"]) == [0.5, 1.0] and list(eff["draft_ms_base"]) == [1.0, 2.0]
    ans = effect_answer(eff)
    assert ans["bs1.ov_vs_off.tok_s_ratio"] == pytest.approx(1.3)
    assert ans["bs8.ov_vs_off.buys"] == "nothing"
    assert ans["summary"].count("\n") == 1
    assert all(v is None or isinstance(v, (bool, int, float, str)) for v in ans.values())


def test_plot_effects_saves_a_figure(tmp_path):
    eff = arm_effects(frame({"off": [(100, 0.4, 1000)], "ov": [(120, 0.2, 1000)],
                             "zb": [(121, 0.19, 1000)]}),
                      "arm", [("ov", "off"), ("zb", "ov")], by=["batch_size"])
    fig = plot_effects(eff, path=tmp_path / "effects.png", title="t")
    assert_drawn_png(tmp_path / "effects.png")
    assert len(fig.axes) == 2
    gain, bubble = fig.axes
    # one bar per (arm vs baseline) at each grid point: the tok/s change in %, the bubble
    # change in points, the pairs named in the legend
    assert sorted(b.get_height() for c in gain.containers if hasattr(c, "patches")
                  for b in c) == pytest.approx(sorted(100 * (eff["ratio"] - 1)))
    assert sorted(b.get_height() for c in bubble.containers if hasattr(c, "patches")
                  for b in c) == pytest.approx(sorted(eff["bubble_pts"]))
    assert [t.get_text() for t in bubble.get_legend().get_texts()] == ["ov vs off", "zb vs ov"]
    assert [t.get_text() for t in gain.get_xticklabels()] == list(dict.fromkeys(eff["where"]))
    plt.close(fig)
    # one batch size and notebook 04's many arms: the two panels' titles stay apart
    arms = ["overlap only", "device_seq_lens", "async_d2h", "draft_preexec", "zero_bubble (all)"]
    eff = arm_effects(frame({a: [(100 + i, 0.4 - 0.05 * i, 1000)] for i, a in enumerate(arms)}),
                      "arm", [(a, arms[0]) for a in arms[1:]], by=["batch_size"])
    fig = plot_effects(eff, title="zero-bubble sub-knobs")
    fig.canvas.draw()
    left, right = (ax.title.get_window_extent() for ax in fig.axes)
    assert left.x0 >= 0 and left.x1 < right.x0
    plt.close(fig)


def test_bars_with_nothing_to_draw_say_so(tmp_path):
    """A CPU sweep's host syncs are 0 in every cell: the chart says it has no bar and why."""
    from mtplab.studies.figures import bars
    df = pd.DataFrame({"status": "ok", "arm": ["a", "b"], "host_syncs_per_step": [0.0, 0.0],
                       "x": [math.nan, math.nan]})
    ax = bars(df, "arm", "host_syncs_per_step", empty_note="on CPU nothing waits for a device")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["no bar to draw: host_syncs_per_step is 0 in every cell\n"
                     "on CPU nothing waits for a device"]
    assert [t.get_text() for t in bars(df, "arm", "x").texts] == [
        "no bar to draw: x is not measured in every cell"]
    assert len(bars(df.assign(x=[1.0, 0.0]), "arm", "x").texts) == 0
    plt.close("all")


def test_repeated_cells_interleave_rounds_with_the_probe_first():
    base = {"device": "cpu", "model": "random-tiny", "draft": "none"}
    cells = repeated_cells(base, [{"overlap": False}, {"overlap": True}],
                           {"batch_size": [1, 2]}, repeats=3, probe={"profile": True})
    assert len(cells) == 12 and len({c.cell_id for c in cells}) == 12
    assert [c.workload.repeat for c in cells] == [0] * 4 + [1] * 4 + [2] * 4
    assert [c.config.profile for c in cells] == [True] * 4 + [False] * 8
    assert [(c.workload.batch_size, c.config.overlap) for c in cells[4:8]] == [
        (1, False), (1, True), (2, False), (2, True)]
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        repeated_cells(base, [], {}, repeats=0)


def test_a_smaller_bubble_with_less_busy_time_is_not_said_to_be_filled():
    r = one(frame({"off": [(100, 0.30, 1000), (101, 0.30, 1000)],
                   "zb": [(100.5, 0.20, 800), (100, 0.20, 800)]}), "zb")
    assert r["verdict"] == "nothing" and "took their place" not in r["sentence"]
    assert "removes 10.0 idle points, a change too small to show in tok/s" in r["sentence"]


def test_run_arms_refuses_an_arm_that_cannot_run_before_any_cell(tmp_path):
    """The ablation notebooks' shared sweep (studies/notebook.py) builds every arm's RunConfig
    first: a bad arm fails with its reason and no cell runs."""
    from mtplab.config import ConfigError
    from mtplab.studies.notebook import run_arms
    base = {"device": "cpu", "model": "random-tiny", "draft": "frozen_kv_mtp"}
    with pytest.raises(ConfigError, match="page_size"):
        run_arms(base, [{"page_size": 1}, {"page_size": 3}], {}, tmp_path, repeats=2)
    assert not (tmp_path / "sweep").exists()


def test_host_clock_and_meter_disagreeing_makes_the_ratio_suspect():
    # the arm's host clock runs 1.9x ahead of the meter (a read that does not wait for the GPU,
    # notebook 04 before 14a3f48); a planted delay's cells differ by design and are skipped
    df = frame({"off": [(100, 0.30, 1000), (101, 0.30, 1000)],
                "racy": [(190, 0.30, 1000), (188, 0.30, 1000)],
                "sound": [(120, 0.20, 1000), (121, 0.20, 1000)],
                "delay": [(100, 0.80, 5000), (100, 0.80, 5000)]})
    meter = {"off": 98.0, "racy": 100.0, "sound": 116.0, "delay": 20.0}
    df["meter_tok_per_s"] = df["arm"].map(meter)
    df["host_delay_us"] = [1000 if a == "delay" else 0 for a in df["arm"]]
    racy = one(df, "racy")
    assert racy["clocks"] == pytest.approx(1.90)
    assert "Suspect: in these cells decode tok/s on the host clock is 1.90x the meter's" in \
        racy["sentence"]
    for arm in ("sound", "delay"):
        r = one(df, arm)
        assert r["clocks"] < 1.25 and "Suspect" not in r["sentence"]
    # no meter column (a plain sweep): nothing to compare, nothing said
    r = one(frame({"off": [(100, 0.3, 1000)] * 2, "x": [(110, 0.3, 1000)] * 2}), "x")
    assert math.isnan(r["clocks"]) and "Suspect" not in r["sentence"]
