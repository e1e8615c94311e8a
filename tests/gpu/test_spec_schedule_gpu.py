"""spec_schedule on CUDA: every arm's graphs captured at start and none after (no capture
while decoding, whatever buckets the batch crosses), greedy fp32 == target-only across bucket
switches both ways for every draft kind, stage and step granularity, overlap and zero_bubble
on and off; graphed == eager."""
import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.graphs.runner import GraphRunner
from tests.helpers import make_agreeable
from tests.speculative.test_spec_schedule import SCHED, two_waves

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BASE = dict(model="random-tiny", device="cuda", dtype="float32", max_running_requests=4,
            context_len=128, cuda_graph_max_bs=4)


def drive(eng):
    """Two waves (tests/speculative/test_spec_schedule.py): the batch shrinks 4 -> 1, grows,
    shrinks."""
    reqs = two_waves(eng)
    eng.check_invariants()
    return [r.output_ids for r in reqs]


_REF = {}


def reference():
    if not _REF:
        eng = Engine(RunConfig(**BASE))
        make_agreeable(eng)
        _REF[0] = drive(eng)
    return _REF[0]


@pytest.mark.parametrize("granularity", ["stage", "step"])
@pytest.mark.parametrize("loop", ["normal", "overlap_zb"])
@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle", "gemma4_assistant"])
def test_lossless_and_no_capture_after_start(draft, loop, granularity, monkeypatch):
    ref = reference()                 # its engine captures before the patch below
    eng = Engine(RunConfig(**BASE, draft=draft, num_steps=3, topk=2, spec_schedule=SCHED,
                           graph_granularity=granularity, overlap=loop != "normal",
                           zero_bubble=loop != "normal"))
    make_agreeable(eng)
    assert all(a.runners() for a in eng.worker.arms.values())   # every arm captured
    captured = []
    monkeypatch.setattr(GraphRunner, "capture", lambda self: captured.append(self))
    out = drive(eng)
    assert captured == []
    assert out == ref
    assert all(eng.worker.steps.values())


def test_graphed_equals_eager():
    kw = dict(BASE, draft="eagle", num_steps=3, topk=2, spec_schedule=SCHED, overlap=True)
    outs = []
    for graphs in (True, False):
        eng = Engine(RunConfig(**kw, cuda_graphs=graphs))
        make_agreeable(eng)
        outs.append(drive(eng))
    assert outs[0] == outs[1] == reference()
