"""Bubble meter on CUDA: the %globaltimer stamp kernel, stamps captured inside the segment
graphs (graphed stages add no host launch), tokens unchanged, every stage interval sane."""
import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.instrument.meter import BubbleMeter
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_globaltimer_stamps_are_monotonic_on_one_stream():
    m = BubbleMeter(torch.device("cuda"), capacity=64)
    code = m.stamp_code("verify", "forward", False)
    for _ in range(40):
        m.device_stamp(code)
        torch.cuda._sleep(2000)
    torch.cuda.synchronize()
    ns = m.ring[:40, 1].cpu()
    assert int(m.count[0]) == 40 and (m.ring[:40, 0] == code).all()
    assert (ns[1:] >= ns[:-1]).all() and ns[-1] > ns[0]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp", "eagle"])
def test_meter_with_graphs_tokens_and_intervals(draft, overlap):
    kw = dict(model="random-tiny", device="cuda", context_len=256, draft=draft, overlap=overlap,
              cuda_graphs=True)
    off = Engine(RunConfig(**kw))
    on = Engine(RunConfig(**kw, bubble_meter=True))
    ps = random_prompts(5, [3, 17, 40], off.model.config.vocab_size, seed=3)
    assert on.generate(ps, max_new_tokens=20, ignore_eos=True) == \
        off.generate(ps, max_new_tokens=20, ignore_eos=True)
    on.check_invariants()
    st = on.meter_frame(stages=True)
    assert (st["dur_us"] >= 0).all() and {"verify", "d2h"} <= set(st["stage"])
    df = on.meter_frame()
    assert len(df) == on.stats()["steps"]
    assert ((df["busy_us"] <= df["wall_us"] + 1e-6) & (df["bubble_us"] >= 0)).all()
    assert 0 < on.stats()["bubble_frac"] < 1 and on.stats()["meter_clock"] == "device"
    # graphed verify: its stamps came from the captured graph (one begin/end per step)
    dec = st[st["step"].isin(df.loc[df["name"].str.startswith("step[decode"), "step"])]
    assert (dec[dec["stage"] == "verify"].groupby("step").size() == 1).all()


def test_stamp_launcher_writes_the_codes_it_is_given():
    """Whichever launch path this Triton takes (direct compiled launcher or JIT)."""
    m = BubbleMeter(torch.device("cuda"), capacity=16)
    assert int(m.count[0]) == 0 and not m.ring.any()
    for c in (5, 7, 9):
        m._launch(c)
    torch.cuda.synchronize()
    assert m.ring[:3, 0].tolist() == [5, 7, 9] and int(m.count[0]) == 3


@pytest.mark.parametrize("draft,extra", [("none", {}), ("frozen_kv_mtp", dict(fold_seed=True)),
                                         ("eagle", {})])
def test_graphed_decode_steps_launch_no_eager_stamp(draft, extra):
    """With graphs, a decode step's future-map stages ride in the segment graphs and d2h is
    one self-stamping kernel: the meter launches no stamp of its own, yet every stage of
    the step has its interval (overlap + zero_bubble, the configuration the overhead target
    is measured in), and the tokens equal the meter-off engine's."""
    kw = dict(model="random-tiny", device="cuda", context_len=256, draft=draft, overlap=True,
              zero_bubble=True, cuda_graphs=True, **extra)
    off = Engine(RunConfig(**kw))
    on = Engine(RunConfig(**kw, bubble_meter=True))
    ps = random_prompts(4, [5, 30], off.model.config.vocab_size, seed=5)
    on.generate(ps, max_new_tokens=4, ignore_eos=True)             # prefill + warm steps
    m, eager = on.meter, []
    stamp = m.stamp
    m.stamp = lambda code: (eager.append(m.step), stamp(code))
    first = m.step + 1
    got = on.generate(ps, max_new_tokens=24, ignore_eos=True)
    del m.stamp
    assert got == off.generate(ps, max_new_tokens=24, ignore_eos=True)
    on.check_invariants()
    df = on.meter_frame()
    dec = df.loc[(df["step"] >= first) & df["name"].str.startswith("step[decode"), "step"]
    st = on.meter_frame(stages=True)
    st = st[st["step"].isin(dec)]
    # prefill steps (an eager forward) stamp; decode steps must not
    assert len(dec) > 5 and not set(eager) & set(dec), f"eager stamps in decode steps {eager}"
    per_step = st.groupby("step")["stage"].apply(set)
    need = {"resolve", "verify", "publish", "stash", "d2h"} | (
        {"tree", "accept", "commit"} if draft != "none" else set())
    assert all(need <= s for s in per_step), per_step.head()


def _decode_stages(on: Engine, off: Engine, seed: int):
    """Generate with the meter-on and meter-off engines: equal tokens, invariants clean ->
    the meter's stage intervals of the decode steps."""
    ps = random_prompts(3, [5, 30], on.model.config.vocab_size, seed=seed)
    assert on.generate(ps, max_new_tokens=24, ignore_eos=True) == \
        off.generate(ps, max_new_tokens=24, ignore_eos=True)
    on.check_invariants()
    df = on.meter_frame()
    dec = df.loc[df["name"].str.startswith("step[decode"), "step"]
    st = on.meter_frame(stages=True)
    return st[st["step"].isin(dec)]


@pytest.mark.parametrize("draft,extra", [("none", {}), ("frozen_kv_mtp", dict(fold_seed=True)),
                                         ("eagle", dict(zb_draft_preexec=True))])
def test_future_map_kernels_carry_their_stages_stamps(draft, extra):
    """resolve is one kernel stamping its own begin and end; a segment's publish/stash tail is
    one kernel whose stamps hand over from the segment's stage before it: per decode step,
    one resolve interval, and commit (or verify) -> publish -> stash end-to-start."""
    kw = dict(model="random-tiny", device="cuda", context_len=256, draft=draft, overlap=True,
              zero_bubble=True, cuda_graphs=True, **extra)
    st = _decode_stages(Engine(RunConfig(**kw, bubble_meter=True)), Engine(RunConfig(**kw)),
                        seed=7)
    st = st[st["lane"] == "forward"]
    assert st["step"].nunique() > 5 and (st["dur_us"] >= 0).all()
    for _, s in st.groupby("step"):
        assert (s["stage"] == "resolve").sum() == 1
        ends = lambda *names, s=s: set(s.loc[s["stage"].isin(names), "end_us"])   # noqa: E731
        # a handover: the tail's first stage begins where the segment's stage before it ends
        assert set(s.loc[s["stage"] == "publish", "start_us"]) <= ends("verify", "commit")
        assert set(s.loc[s["stage"] == "stash", "start_us"]) <= ends("publish", "draft_extend",
                                                                     "draft")


@pytest.mark.parametrize("draft,extra,nodes", [
    ("frozen_kv_mtp", dict(fold_seed=True), {"draft": 1, "verify": 2}),
    ("frozen_kv_mtp", dict(fold_seed=True, num_steps=3, topk=2, num_draft_tokens=5,
                           simulate_accept_len=2.0), {"draft": 1, "verify": 2}),
    ("eagle", {}, {"draft": 1, "verify": 2, "draft_extend": 1})])
def test_only_draft_verify_and_draft_extend_capture_stamp_nodes(monkeypatch, draft, extra,
                                                                nodes):
    """resolve, tree, accept and commit begin and end with kernels of ours, which carry the
    stamps (organize/build_tree, the argmax/the accept walk, window_slots/the future map's
    kernel): per bucket, the only stamp nodes captured are the draft's begin (+ its end
    without pre-drafting), verify's begin and end, and draft_extend's begin. The step's
    stages still all have their intervals, and the tokens equal the meter-off engine's."""
    from mtplab.instrument import meter as meter_mod
    captured = []
    real = BubbleMeter.device_stamp
    monkeypatch.setattr(BubbleMeter, "device_stamp",
                        lambda self, code: (captured.append(code), real(self, code)))
    kw = dict(model="random-tiny", device="cuda", context_len=256, draft=draft, overlap=True,
              zero_bubble=True, cuda_graphs=True, **extra)
    on = Engine(RunConfig(**kw, bubble_meter=True))
    n_buckets = len(on.worker.executor.graphs["verify"].graphs)
    per_stage = {}
    for code in captured:
        stage = meter_mod._STAGE_OF[(code >> 1) & 0x7F]
        per_stage[stage] = per_stage.get(stage, 0) + 1
    assert per_stage == {s: n * n_buckets for s, n in nodes.items()}
    st = _decode_stages(on, Engine(RunConfig(**kw)), seed=11)
    per_step = st.groupby("step")["stage"].apply(set)
    need = {"resolve", "draft", "tree", "verify", "accept", "commit", "publish", "stash", "d2h"}
    assert len(per_step) > 5 and all(need <= s for s in per_step), per_step.head()


@pytest.mark.parametrize("overlap", [False, True])
def test_run_ahead_overlap_off_is_zero_and_a_long_host_delay_is_zero(overlap):
    """Overlap off: the host waits for each step's results, so no launch runs ahead (every
    lead < 0 on the device clock). Overlap on with a 5 ms host delay after every step (longer
    than random-tiny's GPU step): no launch runs ahead either. Leads are finite on CUDA."""
    from mtplab.sweep.measure import spin

    with Engine(RunConfig(model="random-tiny", device="cuda", draft="frozen_kv_mtp",
                          overlap=overlap, zero_bubble=overlap, bubble_meter=True,
                          simulate_accept_len=3.0)) as eng:
        if overlap:
            eng.on_step(lambda i: spin(5000))
        ps = random_prompts(4, [8, 16], eng.model.config.vocab_size, seed=1)
        eng.generate(ps, max_new_tokens=8, ignore_eos=True)
        eng.generate(ps, max_new_tokens=32, ignore_eos=True)
        st = eng.stats()
        assert st["run_ahead_steps"] > 0 and st["run_ahead_frac"] == 0.0
        assert st["launch_lead_p90_us"] < 0
        eng.check_invariants()


def test_run_ahead_is_near_one_when_the_gpu_step_is_long():
    """Overlap + zero_bubble at a GPU-bound shape (llama3-8b-like@32, bs 8: a GPU step of
    several ms, several times the host loop): the host runs ahead on nearly every step."""
    with Engine(RunConfig(model="llama3-8b-like", layers=32, device="cuda",
                          draft="frozen_kv_mtp", simulate_accept_len=3.0, overlap=True,
                          zero_bubble=True, bubble_meter=True, max_running_requests=8,
                          context_len=512, page_size=16)) as eng:
        ps = random_prompts(8, [64], eng.model.config.vocab_size, seed=2)
        eng.generate(ps, max_new_tokens=8, ignore_eos=True)
        eng.generate(ps, max_new_tokens=48, ignore_eos=True)
        st = eng.stats()
        assert st["run_ahead_frac"] >= 0.9 and st["launch_lead_p50_us"] > 0
        eng.check_invariants()
