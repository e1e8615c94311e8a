"""Bubble meter: the stamp kernel against its reference, the ring/log matching and pairing,
the per-step table, and planted host delays on CPU (the reference clock).

The `%globaltimer` read is inline PTX, which the Triton interpreter cannot run: under
TRITON_INTERPRET=1 the kernel's clock comes from a tensor, and the slot claim (atomic
counter), ring wrap and record layout are checked against `stamp_ref`. The GPU clock path
runs in benchmarks/bench_meter.py (scripts/gpu_check.sh meter).
"""
from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pytest
import torch

from mtplab.engine import Engine, RunConfig
from mtplab.instrument.meter import BubbleMeter, stamp_code
from mtplab.instrument.spans import Spans
from mtplab.kernels.stamp import stamp_ref, stamp_triton, stamped_copy_ref, stamped_copy_triton
from tests.helpers import sm90_ptx

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_stamp_kernel_matches_reference_and_wraps():
    ring = torch.zeros(8, 2, dtype=torch.long, device=DEVICE)
    count = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    ref_ring, ref_count = torch.zeros(8, 2, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    for i in range(13):                                  # wraps the ring of 8 once
        t = 10**15 + 7919 * i                            # ns-sized values, beyond int32
        stamp_triton(ring, count, 2 + i, torch.tensor([t], device=DEVICE))
        stamp_ref(ref_ring, ref_count, 2 + i, t)
    assert int(count[0]) == int(ref_count[0]) == 13
    assert torch.equal(ring.cpu(), ref_ring)
    assert ref_ring[12 & 7, 0] == 2 + 12                  # the last record: slot 12 & 7


@pytest.mark.parametrize("pairs", [1, 2])
@pytest.mark.parametrize("stamped", [False, True])
def test_stamped_copy_matches_reference(pairs, stamped):
    """The d2h stage's one kernel: the copies (sizes across the block width) between its own
    begin and end stamps, against the copies between two reference stamps."""
    g = torch.Generator().manual_seed(pairs)
    srcs = [torch.randint(-2**40, 2**40, (n,), generator=g).to(DEVICE) for n in (300, 7)][:pairs]
    # host buffers as the d2h stage makes them: pinned where a GPU kernel writes them
    dsts = [torch.zeros_like(s, device="cpu") for s in srcs]
    dsts = [d.pin_memory() for d in dsts] if DEVICE == "cuda" else dsts
    ring = torch.zeros(8, 2, dtype=torch.long, device=DEVICE)
    count = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    count[0] = 6                                          # the two records wrap the ring
    t = 10**15 + 12345
    stamp = (ring, count, 20, 21) if stamped else None
    stamped_copy_triton(dsts, srcs, stamp, torch.tensor([t], device=DEVICE))
    ref_d = [torch.zeros_like(d) for d in dsts]
    ref_ring, ref_count = torch.zeros(8, 2, dtype=torch.long), torch.tensor([6], dtype=torch.int32)
    stamped_copy_ref(ref_d, [s.cpu() for s in srcs],
                     (ref_ring, ref_count, 20, 21) if stamped else None, lambda: t)
    assert all(torch.equal(a, b) for a, b in zip(dsts, ref_d))
    assert all(torch.equal(a, s.cpu()) for a, s in zip(dsts, srcs))
    assert torch.equal(ring.cpu(), ref_ring) and int(count[0]) == int(ref_count[0])
    assert int(count[0]) == (8 if stamped else 6)


def test_stamped_copy_rejects_mismatched_pairs():
    a = torch.zeros(4, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="one size and dtype"):
        stamped_copy_triton([torch.zeros(3, dtype=torch.long)], [a])
    with pytest.raises(ValueError, match="one or two"):
        stamped_copy_triton([], [])


def test_handover_stamp_ends_one_stage_and_begins_the_next():
    """A graph of stages [commit, publish, stash] stamps b commit, h publish, h stash,
    e stash: three back-to-back intervals from four records."""
    m = BubbleMeter(torch.device("cpu"), capacity=16)
    m.begin_step("step[decode bs=1]")
    codes = [stamp_code("commit", "forward", False),
             stamp_code("publish", "forward", False, handover=True),
             stamp_code("stash", "forward", False, handover=True),
             stamp_code("stash", "forward", True)]
    for c in codes:
        m.stamp(c)
        time.sleep(0.001)
    m.collect()
    st = m.stages_frame()
    assert list(st["stage"]) == ["commit", "publish", "stash"]
    assert (st["end_us"].to_numpy()[:-1] == st["start_us"].to_numpy()[1:]).all()
    assert (st["dur_us"] > 500).all()
    with pytest.raises(ValueError, match="handover"):
        stamp_code("stash", "forward", True, handover=True)
    m2 = BubbleMeter(torch.device("cpu"), capacity=16)
    m2.begin_step("step[decode bs=1]")
    m2.stamp(codes[1])
    with pytest.raises(RuntimeError, match="no stage open"):
        m2.collect()


def test_codes_and_spans():
    assert stamp_code("verify", "forward", False) != stamp_code("verify", "copy", False)
    assert stamp_code("d2h", "copy", True) & 1 and stamp_code("d2h", "copy", True) > 1
    with pytest.raises(ValueError, match="not a stage name"):
        stamp_code("verfy", "forward", False)
    m = BubbleMeter(torch.device("cpu"), capacity=64)
    sp = Spans(enabled=False, meter=m)
    with sp.step("step[decode bs=1]"):
        with sp.stage("schedule", "host"):           # host spans: not stamped
            pass
        with sp.stage("verify"), sp.stage("draft.step"):
            pass
        with sp.stage("tree", graphed=True):        # a graph carries its own stamps
            pass
        with sp.paused(), sp.stage("accept"):        # capture: nothing
            pass
    assert m.step == 0 and int(m.count[0]) == 4
    m.collect()
    assert m.names == ["step[decode bs=1]"]
    st = m.stages_frame()
    assert list(st["stage"]) == ["draft.step", "verify"]     # inner ends first
    assert (st["step"] == 0).all() and (st["dur_us"] >= 0).all()


def _synthetic(meter: BubbleMeter, plan) -> None:
    """Write ring records and the issue log by hand: plan = [(step, stage, lane, t0, t1)]
    in issue order per lane (ns), steps in order from 0."""
    for st, stage, lane, t0, t1 in plan:
        while meter.step < st:
            meter.begin_step("step[decode bs=1]")
        for code, t in ((stamp_code(stage, lane, False), t0), (stamp_code(stage, lane, True), t1)):
            stamp_ref(meter.ring, meter.count, code, t)
            meter.log(code)


def test_frame_windows_busy_and_bubble():
    """Two steps, overlapping lanes; the copy lane's d2h overlaps the next step's work."""
    m = BubbleMeter(torch.device("cpu"), capacity=64)
    us = 1000
    _synthetic(m, [(0, "verify", "forward", 0, 10 * us), (0, "stash", "forward", 12 * us, 14 * us),
                   (0, "d2h", "copy", 15 * us, 20 * us),
                   (1, "verify", "forward", 18 * us, 30 * us),
                   (1, "d2h", "copy", 35 * us, 36 * us)])
    m.collect()
    df = m.frame()
    # step 0: window [0, 20]: covered 10 + 2 + 5 -> bubble 3 (10..12, 14..15)
    # step 1: window (20, 36]: covered 20..30 + 35..36 = 11 -> bubble 5
    assert df["wall_us"].tolist() == pytest.approx([20.0, 16.0])
    assert df["bubble_us"].tolist() == pytest.approx([3.0, 5.0])
    np.testing.assert_allclose(df["busy_us"] + df["bubble_us"], df["wall_us"])
    s = m.summary()
    assert s["bubble_frac"] == pytest.approx(8 / 36) and s["meter_steps"] == 2


def test_lane_order_mismatch_is_reported():
    m = BubbleMeter(torch.device("cpu"), capacity=16)
    _synthetic(m, [(0, "verify", "forward", 0, 5)])
    m._log[1:] = m._log[:0:-1]        # the host believes another order (after the marker)
    with pytest.raises(RuntimeError, match="begin|order"):
        m.collect()
    m2 = BubbleMeter(torch.device("cpu"), capacity=16)
    _synthetic(m2, [(0, "verify", "forward", 0, 5)])
    m2._log.pop()
    with pytest.raises(RuntimeError, match="1 were issued"):
        m2.collect()


def test_half_full_ring_is_drained_between_steps():
    m = BubbleMeter(torch.device("cpu"), capacity=8)
    sp = Spans(enabled=False, meter=m)
    for _ in range(6):
        with sp.step("step[decode bs=1]"), sp.stage("verify"), sp.stage("stash"):
            pass
    m.collect()
    assert m.drains >= 2 and len(m.frame()) == 6 and (m.frame()["n_stages"] == 2).all()


def test_one_log_entry_per_launch_expands_in_issue_order_and_drains_in_time():
    """A graph replay logs its stamps as one entry (`log(codes)`): collected, they pair as if
    logged one by one. The drain bound counts every entry as MAX_LAUNCH_STAMPS stamps, so the
    ring is read before it could wrap however long the launches' entries are."""
    m = BubbleMeter(torch.device("cpu"), capacity=64)     # drain at 64 // 16 = 4 entries
    codes = (stamp_code("commit", "forward", False),
             stamp_code("publish", "forward", False, handover=True),
             stamp_code("publish", "forward", True))
    sp = Spans(enabled=False, meter=m)
    for k in range(3):
        with sp.step("step[decode bs=1]"):
            for c, t in zip(codes, (0, 4, 6)):          # what the replayed graph writes
                stamp_ref(m.ring, m.count, c, 100 * k + t)
            m.log(codes)
    # 4 entries (2 markers, 2 launches) pending when the third step opened: drained then
    assert m.drains == 1 and [type(x) for x in m._log] == [str, tuple]
    with sp.step("step[decode bs=1]"):
        pass
    assert m.drains == 1 and len(m._log) == 3
    m.collect()
    st = m.stages_frame()
    assert list(st["stage"]) == ["commit", "publish"] * 3
    assert list(st["step"]) == [0, 0, 1, 1, 2, 2]
    assert st["dur_us"].tolist() == pytest.approx([0.004, 0.002] * 3)
    assert m.names == ["step[decode bs=1]"] * 4 and m.step == 3


def test_launch_codes_bound_and_stamps_outside_a_step():
    m = BubbleMeter(torch.device("cpu"), capacity=16)
    with pytest.raises(ValueError, match="1 to 8 stamps"):
        m.launch_codes((stamp_code("commit", "forward", False),) * 9)
    m.stamp(stamp_code("verify", "forward", False))
    m.stamp(stamp_code("verify", "forward", True))
    with pytest.raises(RuntimeError, match="before the first step span"):
        m.collect()
    m.begin_step("step[decode bs=1]")                 # the meter stays usable
    m.stamp(stamp_code("verify", "forward", False))
    m.stamp(stamp_code("verify", "forward", True))
    m.collect()
    assert list(m.stages_frame()["step"]) == [0]


def test_enabled_spans_open_the_step_and_stamp_device_stages_only():
    """With spans enabled (a timeline or profiler run) the meter sees what it sees disabled:
    the step span opens a step, a host span stamps nothing, an eager device stage two."""
    m = BubbleMeter(torch.device("cpu"), capacity=64)
    sp = Spans(enabled=True, annotate=False, meter=m)
    with sp.step("step[decode bs=1]"):
        with sp.stage("schedule", "host"), sp.stage("verify"), sp.stage("tree", graphed=True):
            pass
    assert m.step == 0 and int(m.count[0]) == 2
    m.collect()
    assert list(m.stages_frame()["stage"]) == ["verify"] and m.names == ["step[decode bs=1]"]


def test_step_spans_and_stage_spans_do_not_mix():
    sp = Spans(enabled=True, annotate=False)
    with pytest.raises(ValueError, match="Spans.step"):
        sp.stage("step[decode bs=1]", "host")
    with pytest.raises(ValueError, match="not a step span name"):
        sp.step("verify")
    m = BubbleMeter(torch.device("cpu"), capacity=16)
    with pytest.raises(ValueError, match="not a step span name"):
        m.step_span("decode")


def _per_step_bubble(eng, prompts, n) -> pd.DataFrame:
    eng.generate(prompts, max_new_tokens=n, ignore_eos=True)
    df = eng.meter_frame()
    return df[df["name"].str.startswith("step[decode")]


@pytest.mark.parametrize("overlap", [False, True])
def test_planted_host_delay_rises_the_bubble_cpu(overlap, tmp_path):
    """CPU reference clock: a host sleep of d per step lands in the meter's bubble."""
    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", bubble_meter=True,
                    overlap=overlap, device="cpu", trace_dir=str(tmp_path), run_name="m")
    eng = Engine(cfg)
    prompts = [[5, 6, 7], [8, 9]]
    base = _per_step_bubble(eng, prompts, 10)
    d_ms = 40.0
    eng.on_step(lambda i: time.sleep(d_ms / 1e3))
    first = eng.meter.step + 1
    eng.generate(prompts, max_new_tokens=10, ignore_eos=True)
    df = eng.meter_frame()
    slept = df[(df["step"] > first) & df["name"].str.startswith("step[decode")]
    eng.check_invariants()
    # every step after a hook call holds the whole sleep (CPU: nothing runs while it sleeps)
    assert (slept["bubble_us"] >= d_ms * 1e3).all(), slept
    # the rise over the undelayed run, within that run's own spread (a busy host's jitter)
    rise = slept["bubble_us"].median() - base["bubble_us"].median()
    jitter = base["bubble_us"].max() - base["bubble_us"].min()
    assert d_ms * 1e3 * 0.95 - jitter <= rise <= d_ms * 1e3 + 20e3 + jitter, (rise, jitter)
    st = eng.stats()
    assert st["bubble_us_per_step"] >= d_ms * 1e3 and 0 < st["bubble_frac"] < 1
    written = eng.finish()
    got = pd.read_parquet(written["meter"])
    assert {"step", "wall_us", "busy_us", "bubble_us", "bubble_frac"} <= set(got.columns)
    assert len(pd.read_parquet(written["meter_stages"])) > 0


def test_meter_off_by_default_and_tokens_unchanged():
    cfg = dict(model="random-tiny", draft="frozen_kv_mtp", device="cpu")
    a = Engine(RunConfig(**cfg))
    b = Engine(RunConfig(**cfg, bubble_meter=True))
    p = [[5, 6, 7, 8]]
    assert a.generate(p, max_new_tokens=6) == b.generate(p, max_new_tokens=6)
    a.check_invariants()
    b.check_invariants()
    assert "bubble_frac" not in a.stats() and "bubble_frac" in b.stats()
    assert "meter_clock" not in a.stats() and b.stats()["meter_clock"] == "host"   # CPU
    with pytest.raises(RuntimeError, match="bubble_meter=True"):
        a.meter_frame()


def test_frame_from_a_first_step_equals_the_full_frame_tail():
    m = BubbleMeter(torch.device("cpu"), capacity=64)
    us = 1000
    _synthetic(m, [(k, "verify", "forward", (10 * k + 2) * us, (10 * k + 7) * us)
                   for k in range(5)])
    m.collect()
    full = m.frame()
    part = m.frame(3)
    pd.testing.assert_frame_equal(part, full[full["step"] >= 3].reset_index(drop=True))
    assert m.summary(3)["meter_steps"] == 2


def test_stamp_kernel_compiles_for_sm90_with_globaltimer_and_one_atomic(monkeypatch):
    """The %globaltimer path cannot run here; compile it ahead of time for an H100 (PTX):
    the timer read is there, and the slot claim is one relaxed atomic issued by one thread."""
    import mtplab.kernels.stamp as stamp
    sig = {"ring_ptr": "*i64", "count_ptr": "*i32", "clock_ptr": "*i64", "code": "i32",
           "mask": "i32"}
    ptx = sm90_ptx(monkeypatch, stamp._stamp_kernel, sig, {"GLOBALTIMER": True}, num_warps=1,
                   do_not_specialize=["code"])
    assert "%globaltimer" in ptx
    atoms = [ln for ln in ptx.splitlines() if "atom.global" in ln]
    assert len(atoms) == 1 and atoms[0].strip().startswith("@%p")   # predicated: one thread
    assert ".relaxed" in atoms[0] and "acq_rel" not in atoms[0]      # no fence around it


def test_sm90_compile_survives_the_interpreters_leftover_patches(monkeypatch):
    """The interpreter leaves triton.language.core patched after a kernel that calls one of
    Triton's own jit functions (tl.max, tl.sum: Triton 3.9); the ahead-of-time compile must
    still emit its IR with Triton's own builder, not fail on the interpreter's."""
    import triton.language as tl

    from mtplab.kernels.topk import argmax_triton
    before = tl.core.add
    argmax_triton(torch.randn(2, 3000))
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert tl.core.add is not before         # the leftover this test is about
    import mtplab.kernels.stamp as stamp
    sig = {"ring_ptr": "*i64", "count_ptr": "*i32", "clock_ptr": "*i64", "code": "i32",
           "mask": "i32"}
    ptx = sm90_ptx(monkeypatch, stamp._stamp_kernel, sig, {"GLOBALTIMER": True}, num_warps=1,
                   do_not_specialize=["code"])
    assert "%globaltimer" in ptx


def test_step_hooks_run_before_the_profiler_step_boundary(tmp_path):
    """Work a hook queues belongs to its step in the meter and in the profiler alike: the
    profiler's own pauses (CUPTI start, trace export) must fall after the step's hooks."""
    from mtplab import Engine, RunConfig
    eng = Engine(RunConfig(model="random-tiny", profile=True, profile_wait=50,
                           trace_dir=str(tmp_path), run_name="r"))
    order = []
    real = eng.profiler.step
    eng.profiler.step = lambda: (order.append("profiler"), real())[1]
    eng.on_step(lambda i: order.append("hook"))
    eng.generate([[5, 6, 7]], max_new_tokens=3, ignore_eos=True)
    assert order and order[0] == "hook" and order == ["hook", "profiler"] * (len(order) // 2)
    eng.finish()
    eng.check_invariants()


def test_launch_lead_and_draft_share_on_a_synthetic_stamp_table():
    """Three decode steps (ns): step 0 ends at 30 µs (its d2h) and step 1 was launched at
    20 µs (lead +10: run-ahead); step 1 ends at 60 µs and step 2 was launched at 70 µs
    (lead -10: the GPU waited); step 2 is the last of its run (cut): no lead. Draft stages
    (draft with the seed nested in it, draft_extend) count once each per step."""
    m = BubbleMeter(torch.device("cpu"), capacity=64)
    us = 1000
    _synthetic(m, [(0, "draft", "forward", 0, 8 * us), (0, "draft.seed", "forward", 1 * us, 3 * us),
                   (0, "verify", "forward", 8 * us, 20 * us), (0, "d2h", "copy", 25 * us, 30 * us)])
    m._launches += [(0, 0), (1, 20 * us)]
    _synthetic(m, [(1, "verify", "forward", 30 * us, 50 * us),
                   (1, "draft_extend", "forward", 50 * us, 60 * us)])
    m._launches.append((2, 70 * us))
    _synthetic(m, [(2, "verify", "forward", 70 * us, 80 * us)])
    m.cut()
    m._launches.append((2, 75 * us))             # a second mark of one step: the first counts
    m._launches.append((3, 90 * us))             # the next run's first launch: step 2 is cut
    _synthetic(m, [(3, "verify", "forward", 90 * us, 95 * us)])
    m.collect()
    df = m.frame()
    np.testing.assert_allclose(df["launch_lead_us"][:2], [10.0, -10.0])
    assert np.isnan(df["launch_lead_us"][2:]).all()
    np.testing.assert_allclose(df["draft_us"], [8.0, 10.0, 0.0, 0.0])
    np.testing.assert_allclose(df["draft_share"], [8 / 25, 10 / 30, 0.0, 0.0])
    s = m.summary()
    assert s["run_ahead_frac"] == 0.5 and s["run_ahead_steps"] == 2
    assert s["launch_lead_p50_us"] == pytest.approx(0.0)
    assert s["draft_busy_frac"] == pytest.approx(18 / 70)


def test_run_ahead_on_cpu_reads_not_available_and_leads_are_negative():
    """On CPU the host runs every stage itself: every launch lead in the meter's table is
    < 0 (the next step is launched after this one's work), and stats() reports no run-ahead,
    with the reason."""
    with Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", overlap=True,
                          bubble_meter=True)) as eng:
        eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=8, ignore_eos=True)
        df = eng.meter_frame()
        lead = df["launch_lead_us"].to_numpy()
        assert np.isfinite(lead[:-1]).all() and (lead[:-1] < 0).all()
        assert np.isnan(lead[-1])                  # the last step of the generate
        st = eng.stats()
        assert np.isnan(st["run_ahead_frac"]) and "CPU" in st["run_ahead_note"]
        assert 0 < st["draft_busy_frac"] < 1
        eng.check_invariants()
