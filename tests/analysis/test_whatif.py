"""The what-if predictor on synthetic step graphs whose answers are worked out by hand
(mtplab/analysis/whatif.py; docs/design.md "What-if predictor")."""
from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import pytest

from mtplab.analysis.whatif import (Launch, Loop, StepModel, WhatIfError, apply, cause_table,
                                    from_tables, host_speed, parse_whatif, predict,
                                    predicted_ratio, replay, self_check, stage_errors)

HOST = {"schedule": 10.0, "prepare": 20.0, "process_result": 30.0, "loop": 40.0}


def simple(verify_gpu=100.0, *, overlap=False, async_d2h=True, L=0.0, cpu=False,
           device_seq_lens=True) -> StepModel:
    """schedule 10, prepare 20, one verify graph (5 µs host), d2h (2 µs host, 3 µs copy),
    process_result 30, loop 40."""
    return StepModel(
        host=dict(HOST),
        launches=(Launch("verify", 5.0, "forward", (("verify", verify_gpu),)),
                  Launch("d2h", 2.0, "copy", (("d2h", 3.0),))) if async_d2h else
                 (Launch("verify", 5.0, "forward", (("verify", verify_gpu),)),),
        loop=Loop(overlap=overlap, async_d2h=async_d2h, device_seq_lens=device_seq_lens,
                  host_runs_device=cpu),
        launch_latency_us=L, wake_us=L, graphs=True, d2h_gpu_us=3.0, anchor_tok_s=1000.0)


def spec(**loop) -> StepModel:
    """A draft step: resolve, draft, tree, verify, accept, commit+publish graphs, d2h."""
    def g(name, host, *st):
        return Launch(name, host, "forward", st)

    return StepModel(
        host=dict(HOST),
        launches=(g("resolve", 3.0, ("resolve", 2.0)), g("draft", 5.0, ("draft", 50.0)),
                  g("tree", 3.0, ("tree", 5.0)), g("verify", 5.0, ("verify", 100.0)),
                  g("accept", 3.0, ("accept", 5.0)),
                  g("commit", 4.0, ("commit", 10.0), ("publish", 2.0)),
                  Launch("d2h", 2.0, "copy", (("d2h", 3.0),))),
        loop=Loop(**{"overlap": False, **loop}), graphs=True, draft="frozen_kv_mtp",
        num_steps=3, seed_forward=True, anchor_tok_s=1000.0)


def test_normal_loop_is_the_sum_of_its_chain():
    # 10 + 20 + 5 (verify launch) + 100 (verify) + 3 (d2h) + 30 + 40
    r = replay(simple())
    assert r.period_us == pytest.approx(208.0)
    assert r.bubble_us == pytest.approx(105.0)
    # the gap from d2h's end to the next verify: process_result, loop, schedule, prepare,
    # the verify launch
    assert r.causes == pytest.approx({"host_prep": 60.0, "host:python": 40.0,
                                      "host:verify": 5.0})


def test_latencies_add_once_each_way():
    # the verify starts L after its launch, the host wakes W after d2h: 208 + 5 + 5
    r = replay(simple(L=5.0))
    assert r.period_us == pytest.approx(218.0)
    assert r.causes == pytest.approx({"host_prep": 60.0, "host:python": 40.0,
                                      "host:verify": 5.0, "launch": 5.0, "sync": 5.0})


def test_overlap_host_bound_runs_at_the_host_period():
    # host per iteration: 10 + 20 + 5 + 2 + 30 + 40 = 107 > device chain 100 + 3
    assert replay(simple(overlap=True)).period_us == pytest.approx(107.0)
    assert predicted_ratio(simple(), "overlap=on") == pytest.approx(208.0 / 107.0)


def test_overlap_gpu_bound_runs_at_the_device_chain():
    # verify 200, then d2h 3 before the next verify may overwrite the results: 203
    r = replay(simple(200.0, overlap=True))
    assert r.period_us == pytest.approx(203.0)
    assert r.bubble_us == pytest.approx(0.0, abs=1e-9)


def test_blocking_reads_undo_overlap():
    # .tolist() under overlap waits for step k's verify too: the normal loop's 208
    assert replay(simple(overlap=True, async_d2h=False)).period_us == pytest.approx(208.0)
    # async reads (their launch taken as 0 µs host: the run had none): 105 a step
    assert predicted_ratio(simple(overlap=True, async_d2h=False),
                           "zb_async_d2h=on") == pytest.approx(208.0 / 105.0)


def test_publish_sync_costs_prepare_and_the_first_launch():
    # GPU-bound speculative step without a draft launch: verify 200, commit 10 + publish 2,
    # d2h 3. With the host read of the lengths, iteration k waits for k-1's publish, then
    # prepares (20) and launches verify (5) while the device idles after d2h:
    # 212 + 20 + 5 = 237.
    m = StepModel(host=dict(HOST),
                  launches=(Launch("verify", 5.0, "forward", (("verify", 200.0),)),
                            Launch("commit", 4.0, "forward", (("commit", 10.0), ("publish", 2.0))),
                            Launch("d2h", 2.0, "copy", (("d2h", 3.0),))),
                  loop=Loop(overlap=True, device_seq_lens=False), graphs=True,
                  draft="frozen_kv_mtp", num_steps=3)
    assert replay(m).period_us == pytest.approx(237.0)
    assert replay(apply(m, "zb_device_seq_lens=on")).period_us == pytest.approx(215.0)
    # target-only: the host knows the lengths (one token per step), so there is no read
    assert replay(replace(m, draft="none", num_steps=0)).period_us == pytest.approx(215.0)


def test_cpu_runs_everything_in_series():
    # the device work is inside each launch call: 10+20+max(5,100)+max(2,3)+30+40 = 203,
    # and overlap reorders nothing away
    m = simple(cpu=True)
    assert replay(m).period_us == pytest.approx(203.0)
    assert predicted_ratio(m, "overlap=on") == pytest.approx(1.0)
    # the meter's host-clock bubble: the time outside stage intervals
    assert replay(m).bubble_us == pytest.approx(100.0)
    # a stage's GPU time is host time there
    assert replay(apply(m, "gpu:verify*2")).period_us == pytest.approx(303.0)


def test_eager_launch_overlaps_its_own_kernels():
    def one(eager):
        return StepModel(host={}, launches=(Launch("draft.seed", 200.0, "forward",
                                                   (("draft.seed", 60.0),), eager),),
                         loop=Loop(overlap=False, async_d2h=False))

    assert replay(one(True)).period_us == pytest.approx(200.0)    # ends with its last launch
    assert replay(one(False)).period_us == pytest.approx(260.0)   # a graph starts after it
    # its last kernel runs L after the call issued it (200 + 5), the read wakes W later:
    # 60 µs of work cannot end before the call that issues it
    lat = replace(one(True), launch_latency_us=5.0, wake_us=5.0)
    assert replay(lat).period_us == pytest.approx(210.0)


def test_host_and_gpu_whatifs():
    m = simple()
    assert replay(apply(m, "gpu:verify*2")).period_us == pytest.approx(308.0)
    assert replay(apply(m, "host:loop=0")).period_us == pytest.approx(168.0)
    assert replay(apply(m, "host:schedule+15,host:verify=0")).period_us == pytest.approx(218.0)
    assert replay(apply(m, "host:loop-1000")).period_us == pytest.approx(168.0)   # floor at 0
    assert replay(apply(m, "gpu:d2h=0")).period_us == pytest.approx(205.0)


def test_preexec_moves_the_draft_after_commit():
    m = apply(spec(), "zb_draft_preexec=on")
    assert [la.stage for la in m.launches] == ["resolve", "tree", "verify", "accept", "commit",
                                             "draft", "d2h"]
    assert m.loop.draft_preexec
    # overlap off: resolve (launched at 33) runs 2 µs, tree's launch ends at 36, then the
    # device chain tree 5, verify 100, accept 5, commit 12, draft 50, d2h 3, then 30 + 40
    assert replay(m).period_us == pytest.approx(36 + 172 + 3 + 70)
    back = apply(m, "zb_draft_preexec=off")
    assert [la.stage for la in back.launches] == [la.stage for la in spec().launches]


def test_preexec_gpu_bound_keeps_the_device_chain():
    # overlap: host 10 + 20 + 23 (launches) + 2 + 30 + 40 = 125 per iteration; the device
    # chain 174 + d2h 3 = 177 is longer, and the draft's place in it does not change it
    base = replay(spec(overlap=True, device_seq_lens=True)).period_us
    pre = replay(apply(spec(overlap=True, device_seq_lens=True), "zb_draft_preexec=on")).period_us
    assert base == pytest.approx(177.0) and pre == pytest.approx(177.0)


def test_spec_normal_loop_by_hand():
    # host 10 + 20, resolve launched at 33 runs 2 µs, draft's launch ends at 38; then the
    # device chain draft 50, tree 5, verify 100, accept 5, commit 12, d2h 3, then 30 + 40
    assert replay(spec()).period_us == pytest.approx(38 + 172 + 3 + 70)


def test_zero_bubble_sets_every_sub_knob():
    m = apply(spec(overlap=True), "zero_bubble=on")
    assert (m.loop.async_d2h, m.loop.device_seq_lens, m.loop.draft_preexec) == (True, True, True)
    m = apply(m, "zero_bubble=off")
    assert (m.loop.async_d2h, m.loop.device_seq_lens, m.loop.draft_preexec) == (True, False, False)
    t = apply(simple(overlap=True, device_seq_lens=False), "zero_bubble=on")
    assert (t.loop.device_seq_lens, t.loop.draft_preexec) == (True, False)   # no draft


def test_fold_seed_with_graphs_estimates_the_seed_from_the_draft_graph():
    base = spec()
    seed = Launch("draft.seed", 200.0, "forward", (("draft.seed", 60.0),), True)
    m = StepModel(**{**base.__dict__, "launches": base.launches[:1] + (seed,) + base.launches[1:]})
    f = apply(m, "fold_seed=on")
    assert [la.stage for la in f.launches] == [la.stage for la in base.launches]
    # the unfolded draft graph holds S-1 = 2 steps of 25 µs: the seed adds one
    assert dict(f.launches[1].stages)["draft"] == pytest.approx(75.0)
    assert f.loop.fold_seed and "fold_seed=on" in f.notes[0]
    with pytest.raises(WhatIfError, match="folded its seed"):
        apply(f, "fold_seed=off")


def test_cause_table_gives_each_cause_back():
    t = cause_table(simple(L=5.0)).set_index("cause")
    assert t.loc["host_prep", "bubble_us"] == pytest.approx(60.0)
    assert t.loc["host_prep", "step_us"] == pytest.approx(158.0)     # 218 - 60
    assert t.loc["host_prep", "tok_s"] == pytest.approx(1000.0 * 218.0 / 158.0)
    assert t.loc["launch", "step_us"] == pytest.approx(213.0)
    assert t.loc["sync", "step_us"] == pytest.approx(213.0)
    assert t.loc["host:python", "step_us"] == pytest.approx(178.0)
    assert t.loc["host:verify", "step_us"] == pytest.approx(213.0)
    assert list(t.index)[0] == "host_prep"                           # largest first


def test_predict_table_and_unanswerable_rows():
    df = predict(simple(), ["overlap=on", "zb_draft_preexec=on", "gpu:verify*0.5"])
    assert list(df["what"]) == ["(run)", "overlap=on", "zb_draft_preexec=on", "gpu:verify*0.5"]
    assert df["ratio"].iloc[0] == pytest.approx(1.0)
    assert df["ratio"].iloc[1] == pytest.approx(208.0 / 107.0)
    assert df["tok_s"].iloc[1] == pytest.approx(1000.0 * 208.0 / 107.0)
    assert math.isnan(df["ratio"].iloc[2]) and "target-only" in df["note"].iloc[2]
    assert df["step_us"].iloc[3] == pytest.approx(158.0)
    assert len(predict(simple())) > 8           # the default what-ifs


def test_host_speed_scales_every_host_time_and_keeps_the_device():
    # normal loop: host 100 + verify launch 5 -> x2: 200 + 10, the GPU's 100 + 3 as they were
    assert replay(apply(simple(), "host:all*2")).period_us == pytest.approx(313.0)
    # overlap, host-bound: the host period 107 doubles; GPU-bound: the device chain stays
    assert predicted_ratio(simple(overlap=True), "host:all*2") == pytest.approx(107.0 / 214.0)
    gpu_bound = simple(verify_gpu=500.0, overlap=True)
    assert predicted_ratio(gpu_bound, "host:all*2") == pytest.approx(1.0)
    m = replace(simple(), host_dev={"loop": (10.0, -10.0)}, loop_before_read_us=8.0,
                nested={"draft.seed@draft": (6.0, 40.0)}, launch_latency_us=5.0)
    m = replace(m, launches=(replace(m.launches[0], host_dev=(2.0, -2.0)), m.launches[1]))
    s = apply(m, "host:all*0.5")
    assert s.host == {k: v / 2 for k, v in HOST.items()}
    assert [la.host_us for la in s.launches] == [2.5, 1.0]
    assert s.host_dev == {"loop": (5.0, -5.0)} and s.loop_before_read_us == 4.0
    assert s.launches[0].host_dev == (1.0, -1.0)
    assert s.nested == {"draft.seed@draft": (3.0, 40.0)} and s.launch_latency_us == 5.0
    # left to right: a planted delay kept out of the scaling
    d = apply(replace(simple(), host={**HOST, "loop": 1040.0}),
              "host:loop-1000,host:all*2,host:loop+1000")
    assert d.host["loop"] == pytest.approx(1080.0)


def test_host_speed_of_two_runs_is_their_process_result_ratio():
    slow = replace(simple(), host={**HOST, "process_result": 45.0, "schedule": 99.0})
    assert host_speed(slow, simple()) == pytest.approx(1.5)
    assert math.isnan(host_speed(replace(simple(), host={"loop": 1.0}), simple()))


@pytest.mark.parametrize("text, match", [
    ("host:all=0", r"host:all\*F"), ("host:all+5", r"host:all\*F"),
    ("overlap=maybe", "not understood"), ("speed=on", "not a knob"),
    ("host:nothing=0", "no host time named"), ("gpu:nothing*2", "no device stage"),
    ("gpu:verify*-1", "non-negative"), ("", "empty what-if"),
])
def test_bad_whatifs_say_what_to_write(text, match):
    with pytest.raises(WhatIfError, match=match):
        apply(simple(), text)


def test_parse_whatif_grammar():
    assert parse_whatif("overlap=on, host:schedule=0,gpu:verify*0.5") == [
        ("knob", "overlap", True), ("host", "schedule", "=", 0.0),
        ("gpu", "verify", "*", 0.5)]


# -- from tables --------------------------------------------------------------------------------
def tables(n=6):
    """Steps 10..10+n-1 of a graphed frozen step on the GPU, 300 µs apart: resolve graph
    (2 µs), an eager seed (draft.seed, with 30 µs of nested draft.step... no: with one
    nested interval), the draft graph (50), verify (100), commit graph [commit 10 | publish 2
    | stash 3] with a 1 µs stamp gap inside, d2h on the copy lane (3)."""
    rows, host = [], []
    for i in range(n):
        s, t = 10 + i, 300.0 * i
        rows += [(s, "resolve", "forward", t, t + 2), (s, "draft.seed", "forward", t + 5, t + 65),
                 (s, "draft.step", "forward", t + 10, t + 20),
                 (s, "draft", "forward", t + 70, t + 120),
                 (s, "verify", "forward", t + 121, t + 221),
                 (s, "commit", "forward", t + 222, t + 232),
                 (s, "publish", "forward", t + 233, t + 235),
                 (s, "stash", "forward", t + 235, t + 238), (s, "d2h", "copy", t + 239, t + 242)]
        host.append({"step": s, "period_us": 300.0, "schedule": 11.0, "prepare": 25.0,
                     "sync@prepare": 4.0, "resolve": 3.0, "draft.seed": 150.0,
                     "draft.step@draft.seed": 20.0, "draft": 5.0, "verify": 6.0,
                     "commit": 7.0, "d2h": 2.0, "sync": 9.0, "process_result": 30.0})
    st = pd.DataFrame(rows, columns=["step", "stage", "lane", "start_us", "end_us"])
    return st.assign(dur_us=st["end_us"] - st["start_us"]), pd.DataFrame(host)


def test_from_tables_builds_launches_and_host_work():
    st, host = tables()
    cfg = {"device": "cuda", "overlap": True, "zb_async_d2h": True, "zb_device_seq_lens": False,
           "zb_draft_preexec": False, "fold_seed": False, "cuda_graphs": True,
           "draft": "frozen_kv_mtp", "num_steps": 3}
    m = from_tables(cfg, st, host, anchor_tok_s=500.0, latency_us=4.0, seed_forward=True,
                    eager=("draft.seed",))
    assert [(la.stage, la.lane) for la in m.launches] == [
        ("resolve", "forward"), ("draft.seed", "forward"), ("draft", "forward"),
        ("verify", "forward"), ("commit", "forward"), ("d2h", "copy")]
    commit = m.launches[4]
    # commit runs to publish's start (the stamp gap is commit's), publish to stash's start
    assert commit.stages == (("commit", 11.0), ("publish", 2.0), ("stash", 3.0))
    assert commit.host_us == 7.0 and not commit.eager and m.launches[1].eager
    # nested draft.step dropped; the seed's 60 µs interval is no longer than its 150 µs host
    # call (the host's pace): its device work is one of the draft graph's S-1 = 2 steps
    assert dict(m.launches[1].stages) == {"draft.seed": 25.0}
    assert m.launches[1].paced_us == 60.0
    assert m.host["prepare"] == pytest.approx(21.0)               # its nested sync taken out
    # loop = period - outermost spans (11+25+3+150+5+6+7+2+9+30 = 248)
    assert m.host["loop"] == pytest.approx(52.0)
    assert m.measured_period_us == 300.0 and m.launch_latency_us == 4.0
    assert m.nested["draft.step@draft.seed"] == pytest.approx((20.0, 10.0))
    assert m.d2h_gpu_us == pytest.approx(3.0)
    assert not math.isnan(replay(m).period_us)


def test_from_tables_on_cpu_has_no_latency_and_runs_in_series():
    st, host = tables()
    m = from_tables({"device": "cpu", "overlap": False}, st, host, latency_us=4.0)
    assert m.loop.host_runs_device and m.launch_latency_us == 0.0 and m.wake_us == 0.0


def test_from_tables_refuses_tables_of_other_steps():
    st, host = tables()
    with pytest.raises(WhatIfError, match="different generates"):
        from_tables({}, st, host.assign(step=host["step"] + 100))
    with pytest.raises(WhatIfError, match="no decode step"):
        from_tables({}, st, host.iloc[:0])


# -- host jitter, the loop's place, device gaps ---------------------------------------------------
def test_host_jitter_under_overlap_costs_what_the_one_step_lead_cannot_absorb():
    # simple(100, overlap): host 107 a step > device 103, so 107 without jitter. With the
    # loop at 40 + (30, -10, -20) in turn, the slow step's 30 µs are not paid back by the
    # fast ones: the host-bound period grows
    m = simple(overlap=True)
    noisy = lambda m: replace(m, host_dev={"loop": (30.0, -10.0, -20.0)})      # noqa: E731
    assert replay(m).period_us == pytest.approx(107.0)
    assert replay(noisy(m)).period_us > 107.0
    # GPU-bound (verify 150): the one-step lead absorbs the slow iteration (137 < 153)
    assert replay(noisy(simple(150.0, overlap=True))).period_us == pytest.approx(153.0)
    # the normal loop is a sum, so zero-mean deviations leave its period alone
    assert replay(noisy(simple())).period_us == pytest.approx(208.0)
    # a what-if sets a time in every step (its noise goes) or shifts it (its noise stays)
    j = apply(noisy(m), "host:loop=0,host:schedule=0")
    assert j.host_dev == {} and j.host["loop"] == 0.0
    assert apply(noisy(m), "host:loop+10").host_dev == {"loop": (30.0, -10.0, -20.0)}
    # shifting below zero clamps each step at 0: (70, 30, 20) - 25 -> (45, 5, 0)
    s = apply(noisy(m), "host:loop-25")
    assert s.host["loop"] == pytest.approx(50.0 / 3)
    assert [s.host["loop"] + d for d in s.host_dev["loop"]] == pytest.approx([45.0, 5.0, 0.0])


def test_noise_on_a_busy_host_is_not_turned_into_bubbles():
    """A CPU run whose launch calls vary by ±30 ms around 10 ms of them while the host's own
    work is 1.2 ms steady: the replay of the run is the measured steps, to the µs (a scale
    factor on the host's work, clamped at 0, invented bubbles here)."""
    rng = [31000.0, -9000.0, 12000.0, -9000.0, 5000.0, -30000.0 + 1.0, 0.0, -0.0]
    rng[-1] = -sum(rng[:-1])
    host = {"schedule": 300.0, "prepare": 300.0, "process_result": 300.0, "loop": 300.0}
    verify = Launch("verify", 40000.0, "forward", (("verify", 39000.0),),
                    host_dev=tuple(rng))
    m = StepModel(host=host, launches=(verify,), loop=Loop(overlap=True, host_runs_device=True),
                  measured_period_us=41200.0)
    assert replay(m).period_us == pytest.approx(41200.0)
    # removing a cause moves the step by what the cause table says it costs
    causes = cause_table(m).set_index("cause")
    py = causes.loc["host:python"]
    assert py["bubble_us"] == pytest.approx(300.0)
    assert 1.0 - 1.0 / py["ratio"] == pytest.approx(py["bubble_frac"], rel=1e-6)


def test_device_gap_holds_a_launch_after_the_work_before_it():
    a = Launch("a", 1.0, "forward", (("a", 100.0),))
    b = Launch("b", 1.0, "forward", (("b", 100.0),), gap_us=17.0)
    m = StepModel(host={}, launches=(a, b), loop=Loop(overlap=False, async_d2h=False))
    # b's launch returns at 2 µs, long before a ends at 101: it starts 17 µs after a's end
    assert replay(m).period_us == pytest.approx(218.0)
    no_gap = replace(m, launches=(a, replace(b, gap_us=0.0)))
    assert replay(no_gap).period_us == pytest.approx(201.0)


def loop_tables(n=8, sync=72.0):
    """A normal-loop GPU run whose host spans leave 40 µs of loop time, of which 30 run before
    the results read: schedule 10, prepare 20, verify graph (5 µs host, 100 µs GPU), d2h
    (2 µs host; 3 µs copy, 1 µs after verify), the read waiting `sync`, process_result 30."""
    period = 10 + 20 + 5 + 2 + sync + 30 + 40
    rows, host = [], []
    for i in range(n):
        s, t = 10 + i, period * i
        rows += [(s, "verify", "forward", t + 35, t + 135), (s, "d2h", "copy", t + 136, t + 139)]
        host.append({"step": s, "period_us": period, "schedule": 10.0, "prepare": 20.0,
                     "verify": 5.0, "d2h": 2.0, "sync": sync, "process_result": 30.0})
    st = pd.DataFrame(rows, columns=["step", "stage", "lane", "start_us", "end_us"])
    return st.assign(dur_us=st["end_us"] - st["start_us"]), pd.DataFrame(host)


def test_the_loop_time_before_the_read_is_placed_from_the_runs_waits():
    st, host = loop_tables()
    cfg = {"device": "cuda", "overlap": False, "zb_async_d2h": True, "cuda_graphs": True}
    m = from_tables(cfg, st, host)
    # the read would wait 139 - 37 = 102 µs with all 40 µs of loop after it; the run waited
    # 72, so 30 µs of the loop run before the read, and the replay is the run: 179 µs
    assert m.host["loop"] == pytest.approx(40.0)
    assert m.loop_before_read_us == pytest.approx(30.0, abs=0.1)
    assert m.launches[1].gap_us == pytest.approx(1.0)
    assert replay(m).period_us == pytest.approx(179.0, abs=0.1)
    # overlap: host 107 a step against the device's 104: host-bound, from the run's 179
    assert predicted_ratio(m, "overlap=on") == pytest.approx(179.0 / 107.0, rel=1e-3)
    # a run that waited more than the replay would: nothing to place
    st, host = loop_tables(sync=150.0)
    assert from_tables(cfg, st, host).loop_before_read_us == 0.0


def test_from_tables_keeps_each_steps_host_deviation():
    st, host = tables()
    host = host.assign(period_us=[300.0, 340.0, 260.0, 300.0, 320.0, 280.0],
                       verify=[6.0, 6.0, 6.0, 6.0, 16.0, -4.0])
    cfg = {"device": "cpu", "overlap": False}
    m = from_tables(cfg, st, host)
    # the loop (the period less every outermost span) about its mean, and each launch
    # call's own deviation: verify's 16 and -4 about 6 (the loop absorbs them, as measured)
    assert m.host_dev["loop"] == pytest.approx((0.0, 40.0, -40.0, 0.0, 10.0, -10.0))
    assert [la for la in m.launches if la.stage == "verify"][0].host_dev == pytest.approx(
        (0.0, 0.0, 0.0, 0.0, 10.0, -10.0))
    assert "schedule" not in m.host_dev                    # steady: nothing kept
    assert from_tables(cfg, st, host, jitter=False).n_steps == 0
    # the gap before each launch, from its first stage's start to the end of the one before
    st, host = tables()
    m = from_tables({"device": "cuda", "overlap": True}, st, host)
    assert [la.gap_us for la in m.launches] == pytest.approx([0.0, 3.0, 5.0, 1.0, 1.0, 1.0])


def busy_cpu_tables(noise=(31000.0, -9000.0, 12000.0, -9000.0, 5000.0, -30000.0, 0.0)):
    """A CPU run beside a CPU hog: the verify call (its interval 100 µs inside it) takes
    39 ms +- the noise, the host's own work (schedule, prepare, process_result, loop) 300 µs
    each and steady, the read's sync span 50 µs."""
    rows, host, t = [], [], 0.0
    for i, n in enumerate(noise):
        v = 39000.0 + n
        period = 300 * 4 + v + 50
        a = t + 600 + 50
        rows += [(20 + i, "verify", "forward", a, a + v - 100)]
        host.append({"step": 20 + i, "period_us": period, "schedule": 300.0, "prepare": 300.0,
                     "verify": v, "sync": 50.0, "process_result": 300.0})
        t += period
    st = pd.DataFrame(rows, columns=["step", "stage", "lane", "start_us", "end_us"])
    return st.assign(dur_us=st["end_us"] - st["start_us"]), pd.DataFrame(host)


def test_the_replay_of_a_busy_cpu_run_is_its_measured_steps():
    st, host = busy_cpu_tables()
    m = from_tables({"device": "cpu", "overlap": True}, st, host)
    # nothing waits on CPU: the replay is each measured step less its 50 µs sync span
    assert replay(m).period_us == pytest.approx(host["period_us"].mean() - 50.0)
    err, warning = self_check(m)
    assert abs(err) < 0.01 and warning is None
    # the loop's 300 µs: the cause table and the replay without it agree
    py = cause_table(m).set_index("cause").loc["host:python"]
    assert py["bubble_us"] == pytest.approx(300.0)
    assert predicted_ratio(m, "host:loop=0") == pytest.approx(py["ratio"])
    assert 1.0 - 1.0 / py["ratio"] == pytest.approx(300.0 / replay(m).period_us)


def test_self_check_names_the_stage_that_differs_most():
    # the run waited 150 µs at its read, the replay can only wait 102 (module doc): -18.7%
    st, host = loop_tables(sync=150.0)
    m = from_tables({"device": "cuda", "overlap": False, "zb_async_d2h": True,
                     "cuda_graphs": True}, st, host)
    err, warning = self_check(m)
    assert err == pytest.approx(209.0 / 257.0 - 1.0)
    errs = stage_errors(m).set_index("stage")
    assert errs.loc["host waits (sync)", "diff_us"] == pytest.approx(-48.0)
    assert errs.loc["idle before verify", "measured_us"] == pytest.approx(157.0)
    assert errs.loc["verify (device)", "diff_us"] == pytest.approx(0.0)
    assert "-18.7%" in warning and "host waits (sync)" in warning
    # within the bound: no warning
    st, host = loop_tables()
    assert self_check(from_tables({"device": "cuda", "overlap": False, "zb_async_d2h": True,
                                   "cuda_graphs": True}, st, host))[1] is None


def host_paced_seed_base(seed_work: float) -> StepModel:
    """An overlap-only Frozen-KV step at a GPU-heavy shape (verify 2 ms), its unfolded seed
    an eager launch whose 600 µs host call paces its interval: device work `seed_work`."""
    g = lambda name, host, *st, **kw: Launch(name, host, "forward", st, **kw)   # noqa: E731
    return StepModel(
        host={"schedule": 20.0, "prepare": 20.0, "process_result": 30.0, "loop": 30.0},
        launches=(g("resolve", 5.0, ("resolve", 2.0)),
                  g("draft.seed", 600.0, ("draft.seed", seed_work), eager=True),
                  g("draft", 10.0, ("draft", 200.0)), g("tree", 5.0, ("tree", 10.0)),
                  g("verify", 10.0, ("verify", 2000.0)), g("accept", 5.0, ("accept", 10.0)),
                  g("commit", 5.0, ("commit", 10.0), ("publish", 2.0), ("stash", 3.0)),
                  Launch("d2h", 5.0, "copy", (("d2h", 3.0),))),
        loop=Loop(overlap=True, device_seq_lens=False, draft_preexec=False),
        launch_latency_us=5.0, wake_us=5.0, graphs=True, draft="frozen_kv_mtp", num_steps=3,
        seed_forward=True, anchor_tok_s=1000.0)


def test_a_host_paced_eager_seed_shrinks_to_its_work_on_a_busy_lane():
    # base: the host wakes W after the commit graph ends (P), prepare 20, resolve 5: the seed's
    # call runs P+30 .. P+630 on an idle lane, so its kernels end at P+635 whatever their work;
    # draft P+645..845, tree ..855, verify ..2855, accept ..2865, commit ..2880 = P + 2880
    m = host_paced_seed_base(100.0)
    assert replay(m).period_us == pytest.approx(2880.0)
    # zero_bubble: no wait, the host runs ahead and issues the seed onto a busy lane: the
    # device chain 2 + 10 + 2000 + 10 + 15 + 100 + 200 + the d2h 3 = 2340
    assert predicted_ratio(m, "zero_bubble=on") == pytest.approx(2880.0 / 2340.0)
    # taking the host-paced interval as its work keeps 500 µs that zero_bubble removes
    paced = host_paced_seed_base(600.0)
    assert replay(paced).period_us == pytest.approx(2880.0)
    assert predicted_ratio(paced, "zero_bubble=on") == pytest.approx(2880.0 / 2840.0)


def test_the_seed_work_is_estimated_only_where_the_host_paced_it():
    st, host = tables()
    cfg = {"device": "cuda", "overlap": True, "cuda_graphs": True, "draft": "frozen_kv_mtp",
           "num_steps": 3}
    # its call (40 µs) is shorter than its interval (60): the device's pace, kept
    m = from_tables(cfg, st, host.assign(**{"draft.seed": 40.0}), latency_us=4.0,
                    seed_forward=True, eager=("draft.seed",))
    assert dict(m.launches[1].stages) == {"draft.seed": 60.0} and m.launches[1].paced_us == 0
    # graphs off: no draft graph to take one step of
    m = from_tables(cfg, st, host, latency_us=4.0, seed_forward=True,
                    eager=("draft.seed", "draft"))
    assert dict(m.launches[1].stages) == {"draft.seed": 60.0}
