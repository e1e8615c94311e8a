"""The MoE FFN (models/moe.py, kernels/fused_moe.py): the alignment, the Triton kernels against
the torch reference (CPU: TRITON_INTERPRET=1, see conftest.py) and the reference against a
plain per-token loop of Qwen2-MoE's formula, for both kernel sets (split, and grouped with the
shared expert folded in), batch invariance, the checkpoint in transformers'
Qwen2MoeForCausalLM, lossless speculative decoding on an MoE target with each draft kind and
either kernel set (fp32; deterministic mode), the routing skew knob, the parameter count and
the floor of touched experts."""
from __future__ import annotations

import json

import numpy as np

import pytest
import torch
import torch.nn.functional as F

from mtplab import Engine, RunConfig
from mtplab.config import ConfigError
from mtplab.kernels import fused_moe as fm
from mtplab.kernels import fused_ops as fo
from mtplab.kernels import moe_route as mr
from mtplab.models import zoo
from mtplab.models.floor import expected_experts, layer_weight_params, step_bytes
from mtplab.models.memory import target_params
from mtplab.models.moe import MOE_KERNELS, moe_layers, recording, set_moe_kernels
from tests.helpers import make_agreeable, random_prompts

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=3e-2, rtol=3e-2)}


def case(T, E, k, H, Im, dtype=torch.float32, seed=0, shared=True):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)                        # noqa: E731
    x = r(T, H).to(dtype)
    wgu = (r(E, 2 * Im, H) / H ** 0.5).to(dtype)
    wd = (r(E, H, Im) / Im ** 0.5).to(dtype)
    w, ids = fm.route(r(T, E), k, dtype)
    return x, wgu, wd, w, ids, (r(T, H).to(dtype) if shared else None)


def loop_reference(x, wgu, wd, w, ids, shared):
    """Qwen2-MoE's formula token by token, slot by slot (fp32)."""
    Im = wgu.shape[1] // 2
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            act = F.silu(x[t] @ wgu[e, :Im].T) * (x[t] @ wgu[e, Im:].T)
            out[t] += w[t, j] * (act @ wd[e].T)
        if shared is not None:
            out[t] += shared[t]
    return out


@pytest.mark.parametrize("T,E,k,bm", [(1, 8, 2, 4), (5, 16, 4, 4), (13, 6, 3, 16), (3, 64, 8, 16)])
def test_align_sorts_every_slot_once_into_single_expert_blocks(T, E, k, bm):
    _, _, _, _, ids, _ = case(T, E, k, 8, 4)
    sorted_ids, block_expert = fm.align(ids, E, bm)
    N = T * k
    assert sorted_ids.numel() == fm.aligned_len(N, E, bm) == block_expert.numel() * bm
    real = sorted_ids[sorted_ids < N]
    assert sorted(real.tolist()) == list(range(N))               # every slot exactly once
    flat = ids.reshape(-1)
    for b, e in enumerate(block_expert.tolist()):
        slots = sorted_ids[b * bm:(b + 1) * bm]
        slots = slots[slots < N]
        if e < 0:
            assert slots.numel() == 0                             # unused tail blocks
        else:
            assert (flat[slots.long()] == e).all()                 # one expert per block
    used = block_expert[block_expert >= 0]
    assert (used[1:] >= used[:-1]).all()                          # experts in order


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("T,E,k,H,Im", [(1, 8, 2, 32, 16), (6, 16, 4, 64, 48), (9, 5, 3, 40, 24)])
def test_reference_is_the_per_token_formula(T, E, k, H, Im, shared):
    args = case(T, E, k, H, Im, shared=shared)
    torch.testing.assert_close(fm.fused_moe_ref(*args), loop_reference(*args),
                               **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,E,k,H,Im", [(1, 8, 2, 32, 16), (6, 16, 4, 64, 48), (9, 5, 3, 40, 72)])
def test_triton_kernels_match_the_reference(dtype, T, E, k, H, Im):
    args = case(T, E, k, H, Im, dtype=dtype, seed=T)
    got = fm.fused_moe_triton(*args)
    assert got.dtype == dtype and got.shape == (T, H)
    torch.testing.assert_close(got, fm.fused_moe_ref(*args), **TOL[dtype])
    no_shared = args[:5] + (None,)
    torch.testing.assert_close(fm.fused_moe_triton(*no_shared), fm.fused_moe_ref(*no_shared),
                               **TOL[dtype])


def test_triton_rows_are_batch_invariant():
    """A token's output is the same bits alone or among others routed to the same experts."""
    x, wgu, wd, w, ids, sh = case(7, 6, 2, 32, 16, dtype=torch.bfloat16, seed=3)
    full = fm.fused_moe_triton(x, wgu, wd, w, ids, sh)
    for i in (0, 4, 6):
        s = slice(i, i + 1)
        assert torch.equal(fm.fused_moe_triton(x[s], wgu, wd, w[s], ids[s], sh[s]), full[s])


def grouped_case(T, E, k, H, Im, Is, dtype=torch.float32, seed=0, bm=4):
    """(x, w_gate_up, w_down, routing, shared_gate_up [2Is, H], shared_down [H, Is])."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)                        # noqa: E731
    x = r(T, H).to(dtype)
    wgu = (r(E, 2 * Im, H) / H ** 0.5).to(dtype)
    wd = (r(E, H, Im) / Im ** 0.5).to(dtype)
    wr = (r(E, H) / H ** 0.5).to(dtype)
    wg = (r(1, H) / H ** 0.5).to(dtype) if Is else None
    routing = mr.route_align_ref(x, wr, None, wg, k, True, bm)
    sgu = (r(2 * Is, H) / H ** 0.5).to(dtype) if Is else None
    sd = (r(H, Is) / Is ** 0.5).to(dtype) if Is else None
    return x, wgu, wd, routing, sgu, sd


GROUPED = [(1, 8, 2, 32, 16, 48), (6, 16, 4, 64, 48, 40), (9, 5, 3, 40, 24, 0),
           (5, 6, 2, 36, 72, 24)]


@pytest.mark.parametrize("T,E,k,H,Im,Is", GROUPED)
def test_grouped_reference_is_the_per_token_formula(T, E, k, H, Im, Is):
    x, wgu, wd, r, sgu, sd = grouped_case(T, E, k, H, Im, Is, seed=T)
    want = loop_reference(x, wgu, wd, r.weights, r.ids, None)
    if Is:
        g, u = (x @ sgu.T).split(Is, dim=-1)
        want += r.gate[:, None] * ((F.silu(g) * u) @ sd.T)
    torch.testing.assert_close(fm.moe_ffn_ref(x, wgu, wd, r, sgu, sd), want,
                               **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,E,k,H,Im,Is", GROUPED)
def test_grouped_kernels_match_the_reference(dtype, T, E, k, H, Im, Is):
    """Shared widths above, below and between the routed width and the column tile."""
    args = grouped_case(T, E, k, H, Im, Is, dtype=dtype, seed=T + 1)
    got = fm.moe_ffn_triton(*args)
    assert got.dtype == dtype and got.shape == (T, H)
    torch.testing.assert_close(got, fm.moe_ffn_ref(*args), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,E,k,H,Im,Is", [g for g in GROUPED if g[-1]] + [(13, 8, 2, 32, 16, 100)])
def test_the_routing_launchs_shared_rows_give_gate_ups_bits(dtype, T, E, k, H, Im, Is):
    """route_align_triton with the shared expert's gate_up computes its act rows (extra
    programs of the routing launch, several token blocks and column tiles here): the FFN
    from them equals, bit for bit, the FFN whose gate_up kernel computes them, and the
    reference; the rows are silu(gate) * up of the shared weights."""
    x, wgu, wd, _, sgu, sd = grouped_case(T, E, k, H, Im, Is, dtype=dtype, seed=T + 5)
    g = torch.Generator().manual_seed(T)
    wr = (torch.randn(E, H, generator=g) / H ** 0.5).to(dtype)
    wg = (torch.randn(1, H, generator=g) / H ** 0.5).to(dtype)
    c = torch.zeros(mr.counts_len(T, "cpu"), dtype=torch.int32)
    r = mr.route_align_triton(x, wr, None, wg, k, True, 4, c, sgu)
    assert r.shared_act.shape == (T, Is) and not c.any()
    gt, ut = (x.float() @ sgu.float().T).to(dtype).float().split(Is, dim=-1)
    want_act = (F.silu(gt).to(dtype).float() * ut).to(dtype)
    torch.testing.assert_close(r.shared_act, want_act, **TOL[dtype])
    plain = fm.Routing(r.weights, r.ids, r.gate, r.sorted_ids, r.block_expert)
    got = fm.moe_ffn_triton(x, wgu, wd, r, sgu, sd)
    assert torch.equal(got, fm.moe_ffn_triton(x, wgu, wd, plain, sgu, sd))
    torch.testing.assert_close(got, fm.moe_ffn_ref(x, wgu, wd, r, sgu, sd), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,E,k,H,Im,Is", GROUPED)
def test_the_deferred_combine_gives_the_combines_bits(dtype, T, E, k, H, Im, Is):
    """moe_ffn_triton(defer=True) leaves its expert rows to add_rmsnorm: the norm and the
    residual stream equal, bit for bit, add_rmsnorm over the combine kernel's output; the
    torch path (the PendingCombine's materialize) agrees with both."""
    args = grouped_case(T, E, k, H, Im, Is, dtype=dtype, seed=T + 9)
    g = torch.Generator().manual_seed(T)
    res = torch.randn(T, H, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(H, generator=g)).to(dtype)
    pending = fm.moe_ffn_triton(*args, defer=True)
    assert isinstance(pending, fo.PendingCombine) and (pending.gate is None) == (Is == 0)
    combined = fm.moe_ffn_triton(*args)
    want = fo.add_rmsnorm_triton(res, combined, w, 1e-6)
    got = fo.add_rmsnorm_triton(res, pending, w, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    torch.testing.assert_close(pending.materialize(), combined, **TOL[dtype])
    for a, b in zip(fo.add_rmsnorm_ref(res, pending, w, 1e-6), want):
        torch.testing.assert_close(a, b, **TOL[dtype])


def test_moe_ffn_defers_only_where_the_kernels_run_on_cuda():
    """On CPU the dispatcher runs the reference: a tensor, deferred or not; so does the
    split kernel set, whose combine adds a precomputed shared output."""
    args = grouped_case(3, 8, 2, 32, 16, 16, seed=4)
    out = fm.moe_ffn(*args, defer=True)
    assert isinstance(out, torch.Tensor) and torch.equal(out, fm.moe_ffn(*args))
    x, wgu, wd, w, ids, shared = case(3, 8, 2, 32, 16, seed=4)
    sorted_ids, block_expert = fm.align(ids, 8, 4)
    assert isinstance(fm._launch(x, wgu, wd, w, 2, sorted_ids, block_expert, shared=shared,
                                 defer=True), torch.Tensor)


def test_grouped_kernels_refuse_another_block_size():
    args = grouped_case(3, 8, 2, 32, 16, 16, bm=16)
    with pytest.raises(ValueError, match="route with bm=4"):
        fm.moe_ffn_triton(*args)


def test_grouped_rows_are_batch_invariant():
    x, wgu, wd, r, sgu, sd = grouped_case(7, 6, 2, 32, 16, 40, dtype=torch.bfloat16, seed=3)
    full = fm.moe_ffn_triton(x, wgu, wd, r, sgu, sd)
    for i in (0, 4, 6):
        s = slice(i, i + 1)
        one = fm.Routing(r.weights[s], r.ids[s], r.gate[s], *fm.align(r.ids[s], 6, 4))
        assert torch.equal(fm.moe_ffn_triton(x[s], wgu, wd, one, sgu, sd), full[s])


def test_kernel_sets_knob():
    from mtplab.config import MOE_KERNELS as CONFIG_KERNELS
    assert CONFIG_KERNELS == MOE_KERNELS
    with pytest.raises(ConfigError, match="moe_kernels='fast' is unknown"):
        RunConfig(model="random-tiny-moe", moe_kernels="fast")
    model, _ = zoo.build_target("random-tiny-moe", 0)
    with pytest.raises(ValueError, match="is unknown"):
        set_moe_kernels(model, "fast")
    set_moe_kernels(model, "split")
    assert {m.mlp.kernels for m in model.model.layers} == {"split"}


def test_grouped_and_split_decode_the_same_tokens_in_fp32():
    """The two kernel sets are one function up to fp32 summation order (their references on
    the CPU's fused path); both differ from the unfused path only there too."""
    prompts = random_prompts(4, [5, 9, 3, 12], 320, seed=4)
    outs = {}
    for name, kw in (("grouped", dict(fused=True)), ("split", dict(fused=True,
                                                                    moe_kernels="split")),
                     ("unfused", dict(fused=False))):
        eng = Engine(RunConfig(model="random-tiny-moe", max_running_requests=4, **kw))
        outs[name] = eng.generate(prompts, 10, ignore_eos=True)
        eng.check_invariants()
    assert outs["grouped"] == outs["split"] == outs["unfused"]


def test_moe_layers_and_parameter_count():
    model, _ = zoo.build_target("random-tiny-moe", 0)
    c = model.config
    assert c.is_moe and sum(p.numel() for p in model.parameters()) == target_params(c)
    mlp = model.model.layers[0].mlp
    assert mlp.experts.gate_up_proj.shape == (16, 128, 128)
    assert mlp.experts.down_proj.shape == (16, 128, 64)
    full = zoo.model_config("gemma4-26b-a4b-like@30")
    assert full.num_experts == 128 and full.num_experts_per_tok == 8
    assert 25.0e9 < target_params(full) < 26.5e9                 # "26B" total
    active = layer_weight_params(full, experts=8) * 30 + full.vocab_size * full.hidden_size
    assert 3.5e9 < active < 4.5e9                                 # "A4B": about 4B active
    from mtplab.draft_kinds import DRAFT_KINDS
    eagle = DRAFT_KINDS["eagle"].build(model, 0)                  # the EAGLE layer stays dense
    assert not hasattr(eagle.layer.mlp, "experts")


def test_checkpoint_loads_in_transformers_qwen2_moe(tmp_path):
    transformers = pytest.importorskip("transformers")
    eng = Engine(RunConfig(model="random-tiny-moe"))
    eng.save_target(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2MoeForCausalLM"] and cfg["num_experts"] == 16
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 5, 6, 7, 8, 40, 41]])
    with torch.no_grad():
        want = hf(ids).logits[0, -1]
    got = eng.generate([ids[0].tolist()], 1, ignore_eos=True)[0][0]
    assert got == int(want.argmax())
    back = Engine(RunConfig(model=str(tmp_path)))                 # and back into mtplab
    p = [[1, 9, 10, 11]]
    assert back.generate(p, 8, ignore_eos=True) == eng.generate(p, 8, ignore_eos=True)


def test_skewed_router_is_mtplab_only_and_round_trips(tmp_path):
    eng = Engine(RunConfig(model="random-tiny-moe", moe_routing="zipf:1.5"))
    assert eng.model.model.layers[0].mlp.gate.bias is not None
    eng.save_target(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == "mtplab_moe" and cfg["moe_router_bias"] is True
    back = Engine(RunConfig(model=str(tmp_path)))
    p = [[1, 9, 10, 11]]
    assert back.generate(p, 6, ignore_eos=True) == eng.generate(p, 6, ignore_eos=True)


def test_routing_knob_validation_and_effect():
    with pytest.raises(ConfigError, match="zipf:<s>"):
        RunConfig(model="random-tiny-moe", moe_routing="zipf:-1")
    with pytest.raises(ConfigError, match="is not one"):
        RunConfig(model="random-tiny", moe_routing="zipf:1.0")
    prompts = random_prompts(4, [6, 9, 4, 7], 320, seed=2)
    touched = {}
    for routing in ("uniform", "zipf:2.0"):
        eng = Engine(RunConfig(model="random-tiny-moe", moe_routing=routing,
                               max_running_requests=4, moe_stats=True))
        eng.generate(prompts, 4, ignore_eos=True)
        touched[routing] = eng.stats()["experts_per_verify"]
        eng.check_invariants()
    assert touched["zipf:2.0"] < touched["uniform"]


def test_recording_counts_a_block_of_forwards_then_gives_the_layers_back():
    """`recording`: the decode forwards inside the block, one row per forward and MoE layer
    (the prefill not counted), within 1..min(E, bs*k); the layers hold no recorder after."""
    eng = Engine(RunConfig(model="random-tiny-moe", max_running_requests=4))
    c = eng.model.config
    with recording(eng.model) as rec:
        eng.generate(random_prompts(3, [5, 7, 4], 320, seed=4), 4, ignore_eos=True)
        rows = rec.read()
    assert len(rows) == 3 and all(len(r) == c.num_hidden_layers for r in rows)
    assert all(c.num_experts_per_tok <= x <= min(c.num_experts, 3 * c.num_experts_per_tok)
               for r in rows for x in r)
    assert eng.model.expert_recorder is None
    assert all(m.recorder is None for m in moe_layers(eng.model))
    eng.check_invariants()


def test_floor_counts_the_touched_experts():
    c = zoo.model_config("gemma4-26b-a4b-like@2")
    kw = dict(dtype_bytes=2, bs=1, context=0)
    per_expert = 3 * c.hidden_size * c.moe_intermediate_size * 2
    a = step_bytes(c, experts_touched=8, **kw).target_weights
    b = step_bytes(c, experts_touched=20, **kw).target_weights
    assert b - a == 2 * 12 * per_expert                          # 2 layers x 12 more experts
    assert step_bytes(c, **kw).target_weights == a               # 1 token: 8 expected
    assert expected_experts(c, 1) == pytest.approx(8.0)
    assert expected_experts(c, 64) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 64))


SPEC = [dict(draft="frozen_kv_mtp"), dict(draft="frozen_kv_mtp", topk=2, fold_seed=True),
        dict(draft="eagle", topk=2, num_draft_tokens=4, page_size=4, overlap=True),
        dict(draft="frozen_kv_mtp", fused=True, overlap=True, zero_bubble=True),
        dict(draft="frozen_kv_mtp", fused=True, moe_kernels="split", overlap=True),
        dict(draft="gemma4_assistant", topk=2, fold_seed=True, overlap=True)]


@pytest.mark.parametrize("kw", SPEC, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_spec_equals_target_only_on_the_moe_target(kw):
    prompts = random_prompts(4, [5, 9, 3, 12], 320, seed=3)

    def run(**extra):
        eng = Engine(RunConfig(model="random-tiny-moe", max_running_requests=4, **extra))
        make_agreeable(eng)
        out = eng.generate(prompts, 12, ignore_eos=True)
        eng.check_invariants()
        return eng, out

    _, want = run()
    eng, got = run(**kw)
    assert got == want and eng.stats()["accept_len"] > 1.2


@pytest.mark.slow
def test_deterministic_spec_equals_target_only_on_the_moe_target():
    """Deterministic mode runs the MoE Triton kernels on both model paths (the interpreter on
    CPU): spec == target-only with the split kernels (unfused path; a request alone == in a
    batch) and the grouped ones (fused path; their rows' batch invariance is tested on the
    kernels above). In fp32 here: under the interpreter the attention kernels mis-compute
    bfloat16 (Triton 3.9's tl.dot), so the bf16 claim is tested on the GPU
    (tests/gpu/test_moe_gpu.py)."""
    prompts = random_prompts(3, [2, 5, 3], 320, seed=7)
    calls = {"split": 0, "route": 0, "grouped": 0}
    real = fm.fused_moe_triton, mr.route_align_triton, fm.moe_ffn_triton

    def counted(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    def run(ps, **kw):
        eng = Engine(RunConfig(model="random-tiny-moe", context_len=64, max_running_requests=4,
                               deterministic=True, **kw))
        make_agreeable(eng)
        out = eng.generate(ps, max_new_tokens=6, ignore_eos=True)
        eng.check_invariants()
        return eng, out

    fm.fused_moe_triton = counted("split", real[0])
    mr.route_align_triton = counted("route", real[1])
    fm.moe_ffn_triton = counted("grouped", real[2])
    try:
        _, want = run(prompts)
        _, alone = run(prompts[1:2])
        eng, got = run(prompts, draft="frozen_kv_mtp", topk=2)
        g4, got_g4 = run(prompts, draft="gemma4_assistant")
        assert calls["split"] and not calls["grouped"]
        _, fused_want = run(prompts, fused=True)
        fused, fused_got = run(prompts, draft="frozen_kv_mtp", topk=2, fused=True)
    finally:
        fm.fused_moe_triton, mr.route_align_triton, fm.moe_ffn_triton = real
    assert calls["route"] == calls["grouped"] > 0
    assert alone == want[1:2]
    assert got == want and eng.stats()["accept_len"] > 1.0
    assert got_g4 == want and g4.stats()["accept_len"] > 1.0
    assert fused_got == fused_want and fused.stats()["accept_len"] > 1.0


def test_expert_recorder_counts_the_valid_tokens_distinct_experts():
    """ids of 3 tokens x top-2, the third on a padded lane: experts {0, 1, 2, 3} = 4 (the
    padded token's 5 and 7 not counted); a layer outside begin/end records nothing."""
    from mtplab.models.moe import ExpertRecorder

    rec = ExpertRecorder(layers=2, num_experts=8, device="cpu", capacity=4)
    rec.add(0, torch.tensor([[6, 7]]))                       # a prefill: not recorded
    rec.begin(torch.tensor([True, True, False]))
    rec.add(0, torch.tensor([[0, 1], [2, 3], [5, 7]]))
    rec.add(1, torch.tensor([[0, 1], [1, 0], [5, 7]]))
    rec.end()
    rec.begin(torch.tensor([True]))
    rec.add(0, torch.tensor([[4, 4]]))
    rec.add(1, torch.tensor([[4, 6]]))
    rec.end()
    assert rec.read() == [[4, 2], [1, 2]]
    for _ in range(4):                                       # wraps the ring of 4: the last 4
        rec.begin(torch.tensor([True]))
        rec.add(0, torch.tensor([[3, 3]]))
        rec.add(1, torch.tensor([[3, 2]]))
        rec.end()
    assert rec.read() == [[1, 2], [1, 2], [1, 2], [1, 2]] and int(rec.n) == 6
    rec.reset()
    assert rec.read() == []


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp"])
def test_experts_per_verify_on_a_routed_moe_with_a_known_expert_set(draft):
    """A router with zero weights and a bias that lifts the same 4 of 16 experts (a different
    4 per layer) sends every token to exactly those: 4 experts per layer per verify, however
    many tokens; the uniform expectation is E(1-(1-k/E)^n) at each verify's bs x D tokens."""
    from tests.helpers import pin_four_experts_per_layer

    with Engine(RunConfig(model="random-tiny-moe", moe_routing="zipf:1.0", draft=draft,
                          moe_stats=True, bubble_meter=True, max_running_requests=4)) as eng:
        pin_four_experts_per_layer(eng.model)
        eng.generate([[5, 6, 7], [9, 10], [11, 12, 13]], max_new_tokens=9, ignore_eos=True)
        st = eng.stats()
        assert st["experts_per_verify"] == 4.0
        D = eng.cfg.num_draft_tokens if draft != "none" else 1
        # 3 lanes until the prompts finish together (ignore_eos, one length)
        assert st["experts_per_verify_uniform"] == pytest.approx(expected_experts(
            eng.model.config, 3 * D))
        assert np.isnan(st["experts_per_draft_step"]) and "dense" in st["experts_note"]
        df = eng.meter_frame()
        dec = df[df["name"].str.startswith("step[decode")]
        assert (dec["experts"] == 4.0).all() and len(dec) == st["decode_steps"]
        eng.check_invariants()


def test_experts_under_uniform_routing_follow_the_expectation():
    """Random routing of a random preset: the per-verify figure lies between k and E and
    within the uniform expectation's neighbourhood at bs 4 (no exact answer; a sanity bound
    that fails if padded or prefill tokens were counted: those would exceed E(...) by far)."""
    with Engine(RunConfig(model="random-tiny-moe", moe_stats=True,
                          max_running_requests=4)) as eng:
        eng.generate([[5, 6, 7], [9, 10], [11, 12, 13], [20, 21]], max_new_tokens=6,
                     ignore_eos=True)
        st = eng.stats()
        k = eng.model.config.num_experts_per_tok
        assert k <= st["experts_per_verify"] <= st["experts_per_verify_uniform"] + 3
        eng.check_invariants()
