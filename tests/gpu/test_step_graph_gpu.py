"""graph_granularity on CUDA: the whole decode step as one graph gives the tokens of the stage
graphs and of eager runs, stays lossless, overlap on / off identical; one replay per decode
step; no input copy per replay in either granularity while the batch is unchanged; the
bubble meter reads the same stage intervals from inside the step graph."""
import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.instrument.hostclock import OpCounter, replays
from tests.helpers import make_agreeable, random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

PROMPTS = random_prompts(11, [1, 9, 40, 130], 320, seed=5)
ARMS = [("none", 1, None, 16, False), ("frozen_kv_mtp", 1, None, 1, True),
        ("frozen_kv_mtp", 1, None, 16, False), ("frozen_kv_mtp", 4, 8, 16, True),
        ("eagle", 1, None, 16, False), ("eagle", 4, 8, 16, False)]


def gen(prompts=PROMPTS, temperature=0.0, **kw):
    eng = Engine(RunConfig(device="cuda", context_len=512, model="random-tiny", **kw))
    make_agreeable(eng)
    out = eng.generate(prompts, max_new_tokens=24, ignore_eos=True, temperature=temperature)
    eng.check_invariants()
    return eng, out


def arm_kw(draft, topk, D, P, fold):
    kw = dict(draft=draft, page_size=P)
    if draft != "none":
        kw.update(topk=topk, num_draft_tokens=D, fold_seed=fold)
    return kw


@pytest.mark.parametrize("zb", [False, True])
@pytest.mark.parametrize("draft,topk,D,P,fold", ARMS)
def test_step_graph_equals_stage_graphs_and_eager_fp32(draft, topk, D, P, fold, zb):
    kw = dict(arm_kw(draft, topk, D, P, fold), dtype="float32", overlap=zb, zero_bubble=zb)
    _, eager = gen(cuda_graphs=False, **kw)
    _, stage = gen(graph_granularity="stage", **kw)
    eng, step = gen(graph_granularity="step", **kw)
    assert step == stage == eager
    if draft != "none":
        _, target = gen(dtype="float32", page_size=P)
        assert step == target
        assert eng.stats()["accept_len"] >= 2.0


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp", "eagle"])
def test_overlap_on_off_same_tokens_under_step_bf16(draft):
    kw = dict(dtype="bfloat16", draft=draft, page_size=16, graph_granularity="step")
    if draft == "frozen_kv_mtp":
        kw["fold_seed"] = True
    _, off = gen(overlap=False, **kw)
    _, on = gen(overlap=True, **kw)
    _, zb = gen(overlap=True, zero_bubble=True, **kw)
    assert on == off and zb == off


@pytest.mark.parametrize("granularity,per_step", [("step", 1), ("stage", None)])
@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp", "eagle"])
def test_replays_per_step_and_no_input_copy_on_a_steady_batch(draft, granularity, per_step):
    kw = dict(draft=draft, fold_seed=draft == "frozen_kv_mtp", page_size=16,
              overlap=True, zero_bubble=True, graph_granularity=granularity)
    eng = Engine(RunConfig(device="cuda", context_len=512, model="random-tiny", **kw))
    for p in PROMPTS[:4]:
        eng.add_request(p, 60, ignore_eos=True)
    for _ in range(6):                 # prefill, the first decodes (not pre-drafted)
        eng.step()
    runners = eng.worker.runners()
    r0, d0 = replays(runners), eng.scheduler.stats.decode_steps
    with OpCounter() as oc:
        for _ in range(5):
            eng.step()
    steps = eng.scheduler.stats.decode_steps - d0
    assert steps == 5
    n = (replays(runners) - r0) / steps
    if per_step is not None:
        assert n == per_step
    else:                              # one replay per segment of the plan
        plan = eng.worker.plan(True, True) if draft != "none" else ()
        assert n == (len(plan) if plan else 2)
    # no input copy and no clone: the only torch ops that copy are req_to_token page writes
    # (one H2D from the pinned ring, written by numpy, and one index_put_ per flush:
    # mem/req_pool.py, Device.h2d)
    assert set(oc.ops) <= {"_to_copy", "index_put_"}, oc.ops
    assert oc.ops["_to_copy"] == oc.ops["index_put_"] <= 2, oc.ops
    while not eng.idle:
        eng.step()
    eng.check_invariants()


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_the_meter_reads_every_stage_inside_the_step_graph(draft):
    kw = dict(draft=draft, fold_seed=draft == "frozen_kv_mtp", page_size=16,
              overlap=True, zero_bubble=True, bubble_meter=True)
    per = {}
    for g in ("stage", "step"):
        eng, _ = gen(graph_granularity=g, **kw)
        st = eng.meter_frame(stages=True)
        names = eng.meter.names
        dec = st[[names[k].startswith("step[decode") for k in st["step"]]]
        per[g] = dec.groupby("step")["stage"].apply(lambda s: tuple(sorted(s))).value_counts()
        assert eng.stats()["meter_steps"] > 0
    assert set(per["step"].index) == set(per["stage"].index)
    assert {"resolve", "tree", "verify", "accept", "commit", "publish", "stash"} <= \
        set(per["step"].index[0])


def test_sampled_steps_under_step_run_by_stages_with_the_same_tokens():
    kw = dict(dtype="float32", draft="frozen_kv_mtp", topk=2, num_draft_tokens=5,
              page_size=16, overlap=True, zero_bubble=True)
    _, stage = gen(graph_granularity="stage", temperature=0.8, **kw)
    _, step = gen(graph_granularity="step", temperature=0.8, **kw)
    _, eager = gen(cuda_graphs=False, temperature=0.8, **kw)
    assert step == eager == stage
