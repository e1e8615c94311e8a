"""The MoE FFN on CUDA: the compiled kernels (split, and the grouped set: the one routing
kernel and the grouped GEMMs with the shared expert) against the torch references at the
Gemma-4 26B-A4B widths (bf16), batch invariance and CUDA-graph capture of the compiled
kernels, and on random-tiny-moe (agreeable drafts) deterministic bf16 greedy spec ==
target-only with CUDA graphs, overlap and zero_bubble, at bs 8, with either kernel set; the
full-width preset decodes inside CUDA graphs."""
from __future__ import annotations

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_moe as fm
from mtplab.kernels import fused_ops as fo
from mtplab.kernels import moe_route as mr
from mtplab.models import moe as moe_model
from tests.helpers import make_agreeable, random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def case(T, E=128, k=8, H=2816, Im=704, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, device="cuda")          # noqa: E731
    w, ids = fm.route(r(T, E), k, dtype)
    return (r(T, H).to(dtype), (r(E, 2 * Im, H) / H ** 0.5).to(dtype),
            (r(E, H, Im) / Im ** 0.5).to(dtype), w, ids, r(T, H).to(dtype))


@pytest.mark.parametrize("T", [1, 8, 33, 256])
def test_compiled_kernels_match_the_reference_at_gemma_widths(T):
    args = case(T, seed=T)
    torch.testing.assert_close(fm.fused_moe_triton(*args), fm.fused_moe_ref(*args),
                               atol=3e-2, rtol=3e-2)


def test_compiled_kernels_are_batch_invariant_and_capturable():
    args = case(24, seed=5)
    full = fm.fused_moe_triton(*args)
    one = fm.fused_moe_triton(*(a[3:4] for a in args[:1]), *args[1:3],
                              *(a[3:4] for a in args[3:]))
    assert torch.equal(one, full[3:4])
    static = [a.clone() for a in args]
    graph = torch.cuda.CUDAGraph()
    fm.fused_moe_triton(*static)                       # compile outside the capture
    with torch.cuda.graph(graph):
        out = fm.fused_moe_triton(*static)
    fresh = case(24, seed=9)
    for s, f in zip(static, fresh):
        s.copy_(f)
    graph.replay()
    torch.testing.assert_close(out, fm.fused_moe_triton(*fresh), atol=0, rtol=0)


def grouped_case(T, E=128, k=8, H=2816, Im=704, Is=2112, seed=0):
    """(x, router, shared gate, w_gate_up, w_down, shared gate_up, shared down), bf16."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, fan: (torch.randn(*s, generator=g, device="cuda")       # noqa: E731
                         / fan ** 0.5).to(torch.bfloat16)
    return (r(T, H, fan=1), r(E, H, fan=H), r(1, H, fan=H), r(E, 2 * Im, H, fan=H),
            r(E, H, Im, fan=Im), r(2 * Is, H, fan=H), r(H, Is, fan=Is))


def route(x, wr, wg, T):
    counts = torch.zeros(mr.counts_len(T), dtype=torch.int32, device="cuda")
    r = mr.route_align_triton(x, wr, None, wg, 8, True, fm.block_m("cuda"), counts)
    assert not counts.any()
    return r


@pytest.mark.parametrize("T", [1, 8, 33, 256, 600])
def test_routing_kernel_matches_the_reference_at_gemma_widths(T):
    """600 tokens: 4800 slots, above ALIGN_MAX_SLOTS (torch aligns)."""
    x, wr, wg, *_ = grouped_case(T, seed=T)
    got = route(x, wr, wg, T)
    want = mr.route_align_ref(x, wr, None, wg, 8, True, fm.block_m("cuda"))
    logits = x.float() @ wr.float().T
    top = logits.sort(-1, descending=True).values
    clear = (top[:, :8] - top[:, 1:9]).min(-1).values > 1e-4       # no near-tie in the top 9
    assert clear.float().mean() > 0.9
    assert torch.equal(got.ids[clear], want.ids[clear])
    torch.testing.assert_close(got.weights[clear], want.weights[clear], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.gate, want.gate, atol=1e-5, rtol=1e-5)
    assert torch.equal(fm.align(got.ids, 128, fm.block_m("cuda"))[0], got.sorted_ids)
    assert torch.equal(fm.align(got.ids, 128, fm.block_m("cuda"))[1], got.block_expert)


@pytest.mark.parametrize("T", [1, 8, 33, 256])
def test_grouped_ffn_matches_the_reference_at_gemma_widths(T):
    x, wr, wg, wgu, wd, sgu, sd = grouped_case(T, seed=T + 1)
    r = route(x, wr, wg, T)
    torch.testing.assert_close(fm.moe_ffn_triton(x, wgu, wd, r, sgu, sd),
                               fm.moe_ffn_ref(x, wgu, wd, r, sgu, sd), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("T", [1, 8, 33])
def test_the_deferred_combine_gives_the_combines_bits_at_gemma_widths(T):
    x, wr, wg, wgu, wd, sgu, sd = grouped_case(T, seed=T + 2)
    r = route(x, wr, wg, T)
    res = torch.randn(T, x.shape[1], device="cuda").to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(x.shape[1], device="cuda")).to(torch.bfloat16)
    pending = fm.moe_ffn_triton(x, wgu, wd, r, sgu, sd, defer=True)
    got = fo.add_rmsnorm_triton(res, pending, w, 1e-6)
    want = fo.add_rmsnorm_triton(res, fm.moe_ffn_triton(x, wgu, wd, r, sgu, sd), w, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_engine_defers_the_combine_and_keeps_its_tokens(monkeypatch):
    """The Gemma MoE preset (2 layers, bf16, CUDA graphs, Frozen-KV MTP): the target's
    grouped FFNs hand their rows to the next add_rmsnorm; the tokens equal those of the
    same engine with the combine kernel run (defer off)."""
    seen, real = [], fo.add_rmsnorm_triton
    monkeypatch.setattr(fo, "add_rmsnorm_triton",
                        lambda x, r, *a: seen.append(type(r).__name__) or real(x, r, *a))
    prompts = random_prompts(4, [16, 32], 262144, seed=2)

    def run():
        with Engine(RunConfig(model="gemma4-26b-a4b-like", layers=2, device="cuda",
                              draft="frozen_kv_mtp", simulate_accept_len=2.5,
                              max_running_requests=4, context_len=512, overlap=True,
                              zero_bubble=True)) as eng:
            out = eng.generate(prompts, 16, ignore_eos=True)
            eng.check_invariants()
        return out

    deferred = run()
    assert "PendingCombine" in seen
    real_ffn = moe_model.moe_ffn
    monkeypatch.setattr(moe_model, "moe_ffn", lambda *a, defer: real_ffn(*a))
    seen.clear()
    assert run() == deferred and "PendingCombine" not in seen


def test_grouped_set_is_batch_invariant_and_capturable():
    x, wr, wg, wgu, wd, sgu, sd = grouped_case(24, seed=5)

    def layer(h):
        return fm.moe_ffn_triton(h, wgu, wd, route(h, wr, wg, h.shape[0]), sgu, sd)

    full = layer(x)
    assert torch.equal(layer(x[3:4]), full[3:4])
    static = x.clone()
    counts = torch.zeros(mr.counts_len(24), dtype=torch.int32, device="cuda")

    def captured(h):
        r = mr.route_align_triton(h, wr, None, wg, 8, True, fm.block_m("cuda"), counts)
        return fm.moe_ffn_triton(h, wgu, wd, r, sgu, sd)

    captured(static)                                   # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = captured(static)
    for seed in (9, 10):                               # replays reuse the counters
        fresh = grouped_case(24, seed=seed)[0]
        static.copy_(fresh)
        graph.replay()
        torch.testing.assert_close(out, layer(fresh), atol=0, rtol=0)
    assert not counts.any()


SPEC = [dict(draft="frozen_kv_mtp", topk=2, fold_seed=True, overlap=True, zero_bubble=True),
        dict(draft="eagle", overlap=True, zero_bubble=True),
        dict(draft="gemma4_assistant", topk=2, fold_seed=True, overlap=True, zero_bubble=True)]


@pytest.mark.parametrize("kernels", ["grouped", "split"])
@pytest.mark.parametrize("kw", SPEC, ids=["frozen-topk2", "eagle", "gemma4-topk2"])
def test_deterministic_bf16_spec_equals_target_only_on_the_moe_target(kw, kernels):
    prompts = random_prompts(8, [5, 9, 3, 12, 7, 20, 4, 15], 320, seed=3)

    def run(**extra):
        eng = Engine(RunConfig(model="random-tiny-moe", device="cuda", dtype="bfloat16",
                               deterministic=True, max_running_requests=8, context_len=256,
                               moe_kernels=kernels, **extra))
        make_agreeable(eng)
        out = eng.generate(prompts, 48, ignore_eos=True)
        eng.check_invariants()
        return eng, out

    _, want = run()
    eng, got = run(**kw)
    assert got == want and eng.stats()["accept_len"] > 1.2


def test_gemma_moe_preset_decodes_in_cuda_graphs():
    eng = Engine(RunConfig(model="gemma4-26b-a4b-like", layers=2, device="cuda",
                           draft="frozen_kv_mtp", simulate_accept_len=2.5,
                           max_running_requests=4, context_len=512, overlap=True,
                           zero_bubble=True))
    out = eng.generate(random_prompts(4, [16, 32], 262144, seed=1), 16, ignore_eos=True)
    assert [len(o) for o in out] == [16] * 4
    eng.check_invariants()


@pytest.mark.parametrize("draft", ["none", "frozen_kv_mtp"])
def test_experts_per_verify_inside_cuda_graphs(draft):
    """moe_stats inside the CUDA graphs: a router lifting the same 4 of 16 experts per layer
    gives 4 per verify, 3 requests in the bucket of 4 (the recorder's writes replay with the
    graphs; which lanes count is tested on CPU, tests/models/test_moe.py); the per-step
    column agrees."""
    from tests.helpers import pin_four_experts_per_layer

    with Engine(RunConfig(model="random-tiny-moe", moe_routing="zipf:1.0", draft=draft,
                          device="cuda", moe_stats=True, bubble_meter=True, cuda_graphs=True,
                          max_running_requests=4, simulate_accept_len=2.0 if draft != "none"
                          else None)) as eng:
        pin_four_experts_per_layer(eng.model)
        eng.generate([[5, 6, 7], [9, 10], [11, 12, 13]], max_new_tokens=9, ignore_eos=True)
        st = eng.stats()
        assert st["experts_per_verify"] == 4.0 and st["experts_per_verify_uniform"] > 4.0
        dec = eng.meter_frame()
        dec = dec[dec["name"].str.startswith("step[decode")]
        assert (dec["experts"] == 4.0).all()
        eng.check_invariants()


@pytest.mark.parametrize("T", [1, 8, 32])
def test_the_library_phase_arms_match_the_reference_at_gemma_widths(T):
    """studies/moe/moe_library.py: mtplab's routed arm (the routing kernel + the grouped FFN
    without a shared expert) against the torch reference both arms are held to; SGLang's arm,
    where SGLang imports, against the reference FFN on its own routing (it routes on bf16
    logits: a near-tied token may take another expert than the fp32 reference's)."""
    from mtplab.studies.moe import moe_library as ml
    x, wr, _, wgu, wd, _, _ = grouped_case(T, seed=T + 7)
    ref = ml.reference(x, wr, None, wgu, wd, 8, True)
    counts = torch.zeros(mr.counts_len(T), dtype=torch.int32, device="cuda")
    assert ml.rel_err(ml.mtplab_routed(counts).routed(x, wr, None, wgu, wd, 8, True), ref) < 2e-2
    assert not counts.any()
    try:
        lib = ml.sglang_routed()
    except ImportError:
        return
    weights, ids = lib.routing(x, wr, None, 8, True)
    assert ml.rel_err(lib.routed(x, wr, None, wgu, wd, 8, True),
                      ml.reference_on(x, wgu, wd, weights, ids)) < 2e-2


@pytest.mark.parametrize("kernel", ["gate_up", "down"])
def test_another_launch_shape_of_a_grouped_kernel_matches_the_reference(monkeypatch, kernel):
    """The tiles phase's candidates compute the same FFN (a wider, shorter tile here)."""
    monkeypatch.setitem(fm.TILES_16BIT, kernel, dict(BLOCK_N=64, BLOCK_K=64, num_warps=4,
                                                     num_stages=3))
    for T in (1, 8, 33):
        x, wr, wg, wgu, wd, sgu, sd = grouped_case(T, seed=T + 11)
        r = route(x, wr, wg, T)
        torch.testing.assert_close(fm.moe_ffn_triton(x, wgu, wd, r, sgu, sd),
                                   fm.moe_ffn_ref(x, wgu, wd, r, sgu, sd), atol=3e-2,
                                   rtol=3e-2)
