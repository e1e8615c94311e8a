"""The host clock (instrument/hostclock.py): host µs per stage over decode steps only, the
outermost spans summed apart, and the aten-op counter; on a CPU engine."""
from __future__ import annotations

import time

import torch

from mtplab import Engine, RunConfig
from mtplab.instrument.hostclock import HostClock, OpCounter, replay_floor_us
from mtplab.instrument.spans import Spans


def test_clock_counts_decode_steps_only_and_nested_spans_once():
    sp = Spans(enabled=False)
    clock = HostClock()
    sp.host_clock = clock
    with sp.step("step[prefill bs=1]"):
        with sp.stage("prefill"):
            time.sleep(0.002)
    for _ in range(2):
        with sp.step("step[decode bs=1]"):
            with sp.stage("prepare", "host"):
                with sp.stage("sync", "host"):
                    time.sleep(0.001)
            with sp.stage("verify", graphed=True):
                pass
    per = clock.per_step()
    assert clock.steps == 2 and "prefill" not in per
    assert per["sync"] >= 1000 and per["prepare"] >= per["sync"]
    # "stages" sums the outermost spans: prepare (with its sync inside) and verify
    assert abs(per["stages"] - per["prepare"] - per["verify"]) < 1e-6
    assert per["step"] >= per["stages"]
    assert clock.calls_per_step() == {"prepare": 1.0, "sync": 1.0, "verify": 1.0}


def test_engine_host_clock_and_op_counter_on_cpu():
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", device="cpu",
                           overlap=True, zero_bubble=True, max_running_requests=2))
    clock = HostClock()
    eng.spans.host_clock = clock
    eng.generate([[5, 6, 7], [8, 9]], max_new_tokens=6, ignore_eos=True)
    eng.spans.host_clock = None
    per = clock.per_step()
    assert clock.steps == eng.stats()["decode_steps"] > 0
    for stage in ("schedule", "prepare", "resolve", "tree", "verify", "accept", "commit",
                  "process_result"):
        assert per[stage] > 0, stage
    with OpCounter() as oc:
        torch.zeros(3).add_(1)
        torch.ones(2)[:1]
    assert oc.ops["add_"] == 1 and oc.views >= 1
    eng.check_invariants()


def test_replay_floor_needs_cuda():
    assert replay_floor_us(torch.device("cpu")) is None
