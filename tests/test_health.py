"""Health figures (mtplab/health.py) on tables with known answers: run-ahead and launch lead,
the acceptance alarm on scripted sequences, acceptance by context, the experts' expectation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mtplab.health import (accept_alarm, accept_by_context, context_buckets, expected_experts,
                           launch_leads, run_ahead)


def test_launch_leads_and_run_ahead_known_answers():
    # steps end at 10, 20, 30, 40 µs; the next launches at 5, 25, 29, 41 (NaN: no next)
    leads = launch_leads([10, 20, 30, 40, 50], [5, 25, 29, 41, np.nan])
    np.testing.assert_allclose(leads[:4], [5, -5, 1, -1])
    assert math.isnan(leads[4])
    r = run_ahead(leads)
    assert r["run_ahead_frac"] == 0.5 and r["run_ahead_steps"] == 4
    assert r["launch_lead_p50_us"] == pytest.approx(0.0)          # median of -5, -1, 1, 5
    assert r["launch_lead_p10_us"] == pytest.approx(np.percentile([-5, -1, 1, 5], 10))
    assert r["launch_lead_p90_us"] == pytest.approx(np.percentile([-5, -1, 1, 5], 90))


def test_run_ahead_all_ahead_none_ahead_and_empty():
    assert run_ahead([3.0, 7.0, 1.0])["run_ahead_frac"] == 1.0
    assert run_ahead([-3.0, 0.0])["run_ahead_frac"] == 0.0          # a tie is not ahead
    empty = run_ahead([np.nan])
    assert math.isnan(empty["run_ahead_frac"]) and empty["run_ahead_steps"] == 0


def test_alarm_on_a_scripted_collapse():
    """100 verify steps of 1 lane, 3 draft tokens each: 2 accepted per step, then 0 from step
    60 to 79, then 2 again. The run's mean is 1.6, the floor 0.32 per step: a window of 8
    alarms below 2.56 accepted, i.e. with at most one healthy step in it, so the stretch
    (the union of the alarmed windows) reaches one healthy step into each side: 59..80."""
    acc = [2] * 60 + [0] * 20 + [2] * 20
    got = accept_alarm([1] * 100, acc, [3] * 100, window=8, floor=0.2)
    assert got == [(59, 80)]


def test_alarm_below_floor_but_not_zero():
    """The run's mean is 196 / 124 = 1.58 per step, the floor 5.06 per window of 16. The
    stretch at 1.0 per step (steps 40..55) is above it; the one at 0.25 (80..95: 0,0,0,1
    x 4) alarms, and so does the window at 79 (2 + 3 = 5), not the one at 81 (4 + 2)."""
    acc = [2] * 40 + [1] * 16 + [2] * 24 + [0, 0, 0, 1] * 4 + [2] * 24
    got = accept_alarm([1] * len(acc), acc, [3] * len(acc), window=16, floor=0.2)
    assert got == [(79, 95)]


def test_alarm_silent_on_a_steady_run_and_on_short_runs():
    rng = np.random.default_rng(0)
    acc = rng.integers(1, 4, 500)
    assert accept_alarm([1] * 500, acc, [3] * 500, window=32) == []
    assert accept_alarm([1] * 10, [0] * 10, [3] * 10, window=32) == []     # no window fits


def test_alarm_skips_steps_without_drafts_and_counts_lanes():
    """Target-only steps (proposed 0) are not in the windows. 4 lanes: 4 per lane, then
    0.25; the mean 2.125 per lane, the floor 0.425: only the windows wholly in the low part
    alarm (one high step lifts a window to >= 25 / 40), steps 30..49."""
    lanes = [4] * 20 + [1] * 10 + [4] * 20
    acc = [16] * 20 + [0] * 10 + [1] * 20
    prop = [16] * 20 + [0] * 10 + [16] * 20
    got = accept_alarm(lanes, acc, prop, window=10, floor=0.2)
    assert got == [(30, 49)]                      # the target-only steps 20..29 left out


def test_alarm_when_the_run_never_accepts():
    assert accept_alarm([1] * 40, [0] * 40, [3] * 40, window=8) == [(0, 39)]


def test_alarm_rejects_bad_parameters():
    with pytest.raises(ValueError, match="window >= 1"):
        accept_alarm([1], [1], [1], window=0)


def test_accept_by_context_buckets():
    assert context_buckets([0, 255, 256, 511, 512, 40000]).tolist() == \
        [0, 0, 256, 256, 512, 32768]
    got = accept_by_context([10, 300, 400, 70000, 5], [4, 2, 3, 1, 9], [3, 3, 3, 3, 0])
    assert got == {0: 4.0, 256: 2.5, 65536: 1.0}            # ctx 5 proposed nothing


def test_expected_experts_uniform():
    assert expected_experts(128, 8, 1) == pytest.approx(8.0)
    assert expected_experts(128, 8, 8) == pytest.approx(128 * (1 - (120 / 128) ** 8))
    assert expected_experts(4, 2, 10_000) == pytest.approx(4.0)


# -- through the engine (CPU) ------------------------------------------------------------------

def _flip_rates_after(eng, step: int, rates: tuple):
    """An on_step hook: from engine step `step` on, the simulated acceptance is `rates` (the
    eager accept stage reads the worker's params at every call)."""
    def hook(i):
        if i == step:
            object.__setattr__(eng.worker.params, "simulate_accept_rates", rates)
    return hook


@pytest.mark.parametrize("overlap", [False, True])
def test_alarm_fires_on_a_scripted_collapse_through_the_engine(overlap):
    """bs 1, S = 3: after the prefill's token, 40 verifies accept everything (rates 1: 160
    tokens), then 40 accept nothing (rates 0: 40 tokens).
    The run's mean is 1.5 draft tokens per verify, the floor 0.3: a window of 32 alarms with
    at most 3 full verifies in it, so verifies 37..79, launched in iterations 38..80 (the
    prefill is iteration 0). The warning names them; stats and the by-context figure agree."""
    from mtplab import Engine, RunConfig
    from mtplab.errors import AcceptanceAlarm

    with Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", overlap=overlap,
                          simulate_accept_rates=(1.0, 1.0, 1.0))) as eng:
        eng.on_step(_flip_rates_after(eng, 40, (0.0, 0.0, 0.0)))
        with pytest.warns(AcceptanceAlarm, match="38..80"):
            eng.generate([[5 + i % 300 for i in range(100)]], max_new_tokens=201,
                         ignore_eos=True)
        st = eng.stats()
        assert st["verify_steps"] == 80
        assert st["accept_alarm"] is True and st["accept_alarm_steps"] == [[38, 80]]
        assert st["draft_tokens"] == 240 and st["draft_tokens_accepted"] == 120
        assert st["draft_waste_frac"] == pytest.approx(0.5)
        # verify i (< 40) sees context 100 + 4 i: 39 in [0, 256) accept 4; the 40th (context
        # 256) and the 40 that accept nothing (contexts 260..299) in [256, 512)
        assert st["accept_len_by_ctx"] == {0: 4.0, 256: pytest.approx(44 / 41)}
        eng.check_invariants()


def test_no_alarm_on_a_steady_simulated_run(recwarn):
    from mtplab import Engine, RunConfig
    from mtplab.errors import AcceptanceAlarm

    with Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp",
                          simulate_accept_rates=(0.8, 0.6, 0.4))) as eng:
        eng.generate([[5, 6, 7], [9, 10]], max_new_tokens=96, ignore_eos=True)
        st = eng.stats()
        assert st["accept_alarm"] is False and st["accept_alarm_steps"] == []
        assert not [w for w in recwarn if issubclass(w.category, AcceptanceAlarm)]
        eng.check_invariants()


def test_escape_share_counts_tokens_outside_a_known_hot_map():
    """A random preset's hot set is ids 0..N-1 (its counts rank ids in order): the escapes
    are the emitted tokens >= N, counted here from the outputs themselves."""
    from mtplab import Engine, RunConfig

    N = 160
    with Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp",
                          draft_vocab=f"hot:{N}")) as eng:
        outs = eng.generate([[5, 6, 7], [300, 301]], max_new_tokens=24, ignore_eos=True)
        toks = [t for o in outs for t in o]
        esc = sum(t >= N for t in toks)
        assert 0 < esc < len(toks)                   # both kinds present: the test can fail
        assert eng.stats()["escape_frac"] == pytest.approx(esc / len(toks))
        eng.check_invariants()
    with Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp")) as eng:
        eng.generate([[5, 6, 7]], max_new_tokens=4, ignore_eos=True)
        assert math.isnan(eng.stats()["escape_frac"])          # no hot vocabulary


def test_escape_frac_on_a_hand_made_map():
    from mtplab.core import Req, SamplingParams
    from mtplab.stats import escape_frac

    hot = np.zeros(10, dtype=bool)
    hot[[1, 2, 3]] = True
    r = Req(0, [1], 8, SamplingParams(0.0, 1.0, 0), frozenset())
    r.output_ids = [1, 2, 9, 3, 0, 1]               # 9 and 0 escape: 2 of 6
    assert escape_frac([r], hot) == pytest.approx(2 / 6)
    assert math.isnan(escape_frac([r], None))


def test_alarm_stretch_is_shaded_on_the_run_folders_timeline(tmp_path):
    """The scripted collapse with the event timeline on: health.json names the stretch and
    `mtplab plot RUN_DIR` shades it (the legend says so); without an alarm nothing is."""
    from mtplab import Engine, RunConfig
    from mtplab.analysis.cli import plot_source
    from mtplab.errors import AcceptanceAlarm

    with Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", event_timeline=True,
                          simulate_accept_rates=(1.0, 1.0, 1.0), trace_dir=str(tmp_path),
                          run_name="r")) as eng:
        eng.on_step(_flip_rates_after(eng, 40, (0.0, 0.0, 0.0)))
        with pytest.warns(AcceptanceAlarm):
            eng.generate([[5, 6, 7]], max_new_tokens=201, ignore_eos=True)
        files = eng.finish()
    import json
    assert json.loads(files["health"].read_text()) == {"accept_alarm_steps": [[38, 80]]}
    ax = plot_source(tmp_path / "r").axes[0]
    assert "acceptance alarm" in {t.get_text() for t in ax.get_legend().get_texts()}
    (tmp_path / "r" / "health.json").write_text('{"accept_alarm_steps": []}')
    ax = plot_source(tmp_path / "r").axes[0]
    assert "acceptance alarm" not in {t.get_text() for t in ax.get_legend().get_texts()}
