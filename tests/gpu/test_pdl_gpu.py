"""Programmatic dependent launch on the GPU (kernels/pdl.py): a skinny GEMM launched with it
right after a kernel that triggers at entry, captured in a CUDA graph and replayed on new
inputs, gives the bits of an ordinary launch, and so does a MoE layer's chain (routing,
grouped gate_up and down); an engine's graphs with PDL give the tokens of one built without
it, dense and MoE. A kernel that read an activation before its wait would read the last
replay's."""
import contextlib

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_ops as F
from mtplab.kernels import gemv as G
from mtplab.kernels import pdl
from mtplab.models import gemm_plan
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a CUDA device of compute capability 9.0 or later")


def rnd(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to("cuda", torch.bfloat16)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("feeder", ["add_rmsnorm", "silu_mul"])
def test_a_gemm_after_a_trigger_in_a_graph_gives_an_ordinary_launchs_bits(feeder, m, split):
    """split 3: the GEMM triggers at entry too, and its reduce waits for it."""
    k, n = 14336, 4096                     # a long feeder row: its tail overlaps the GEMM
    x_in = torch.zeros(m, 2 * k if feeder == "silu_mul" else k, device="cuda",
                       dtype=torch.bfloat16)
    res, norm_w = rnd(m, k, seed=2), rnd(k, seed=3)
    w = rnd(n, k, seed=4, scale=k ** -0.5)
    cfg = G.GemvConfig(32, 256, split, 4, 4)

    def step():
        h = (F.add_rmsnorm_triton(x_in, res, norm_w, 1e-5)[0] if feeder == "add_rmsnorm"
             else F.silu_mul_triton(x_in))
        return G._gemv_triton(h, w, cfg)

    assert pdl.enabled(x_in)
    step()                                 # compile outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        out = step()
    torch.cuda.current_stream().wait_stream(s)
    for i in range(12):
        x_in.copy_(rnd(*x_in.shape, seed=100 + i))
        g.replay()
        with pdl.off():
            want = step()
        assert torch.equal(out, want), f"replay {i}: the GEMM read x before its writer ended"


def test_engine_graphs_with_pdl_give_the_tokens_of_graphs_without(monkeypatch):
    """Every shape planned onto the skinny GEMM, so that every one launches with PDL."""
    monkeypatch.setattr(gemm_plan, "_CACHE", {})
    monkeypatch.setattr(gemm_plan, "choose", lambda us: (gemm_plan.CANDIDATES[0], 1.0))
    cfg = RunConfig(model="llama3-8b-like@2", device="cuda", dtype="bfloat16", page_size=16,
                    max_running_requests=8, draft="frozen_kv_mtp", overlap=True,
                    zero_bubble=True, max_total_tokens=4096, context_len=512)
    prompts = random_prompts(8, [20, 33], 128000, seed=7)
    with Engine(cfg) as eng:
        assert all(r["launch"] for r in eng.gemm_plan)
        with_pdl = eng.generate(prompts, 24, ignore_eos=True)
        eng.check_invariants()
    with pdl.off():
        with Engine(cfg) as eng:
            without = eng.generate(prompts, 24, ignore_eos=True)
            eng.check_invariants()
    assert with_pdl == without


@pytest.mark.parametrize("T", [1, 8, 40])
def test_a_moe_layer_after_a_trigger_in_a_graph_gives_an_ordinary_launchs_bits(T):
    """add_rmsnorm (triggers) -> the routing (PDL, triggers) -> gate_up (PDL, waits at entry,
    triggers after) -> down (PDL, reads the routing before its wait) -> combine, at the
    Gemma-4 26B-A4B widths; new inputs (so new experts) at every replay."""
    from tests.gpu.test_moe_gpu import grouped_case
    from mtplab.kernels import fused_moe as fm
    from mtplab.kernels import moe_route as mr
    x0, wr, wsg, wgu, wd, sgu, sd = grouped_case(T, seed=11)
    x_in = torch.zeros_like(x0)
    res, norm_w = rnd(*x0.shape, seed=12), rnd(x0.shape[1], seed=13)
    counts = torch.zeros(mr.counts_len(T), dtype=torch.int32, device="cuda")

    def layer():
        h = F.add_rmsnorm_triton(x_in, res, norm_w, 1e-6)[0]
        r = mr.route_align_triton(h, wr, None, wsg, 8, True, fm.block_m("cuda"), counts)
        return fm.moe_ffn_triton(h, wgu, wd, r, sgu, sd), r.ids

    assert pdl.enabled(x_in)
    layer()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(g, stream=s):
        out, ids = layer()
    torch.cuda.current_stream().wait_stream(s)
    seen = set()
    for i in range(8):
        x_in.copy_(grouped_case(T, seed=200 + i)[0])
        g.replay()
        with pdl.off():
            want, want_ids = layer()
        assert torch.equal(ids, want_ids) and torch.equal(out, want), f"replay {i}"
        seen.add(tuple(ids.flatten().tolist()))
    assert len(seen) == 8 and not counts.any()


def test_a_moe_engines_graphs_with_pdl_give_the_tokens_of_graphs_without():
    cfg = RunConfig(model="random-tiny-moe", device="cuda", dtype="bfloat16",
                    max_running_requests=8, context_len=256, draft="frozen_kv_mtp", topk=2,
                    fold_seed=True, overlap=True, zero_bubble=True, moe_kernels="grouped")
    prompts = random_prompts(8, [5, 9, 3, 12, 7, 20, 4, 15], 320, seed=3)
    outs = []
    for ctx in (contextlib.nullcontext, pdl.off):
        with ctx(), Engine(cfg) as eng:
            outs.append(eng.generate(prompts, 40, ignore_eos=True))
            eng.check_invariants()
    assert outs[0] == outs[1]
