"""Fused decoder ops and speculative-stage kernels compiled on CUDA vs their torch references
(bf16 and fp32), no silent fallback, and greedy fp32 fused == unfused through the engine."""
import logging

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_ops as fo
from mtplab.kernels import fused_spec as fs
from mtplab.models.llama import Rope
from mtplab.speculative import accept, commit, tree
from tests.helpers import random_prompts
from tests.kernels.test_fused_spec import CASES, candidates

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def rnd(*shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,N", [(1, 4096), (7, 5376), (33, 256)])
def test_add_rmsnorm(dtype, T, N):
    x, r, w = rnd(T, N, dtype=dtype), rnd(T, N, dtype=dtype, seed=1), rnd(N, dtype=dtype, seed=2)
    for res in (None, r):
        want = fo.add_rmsnorm_ref(x, res, w, 1e-6)
        got = fo.add_rmsnorm_triton(x, res, w, 1e-6)
        torch.testing.assert_close(got[0], want[0], **TOL[dtype])
        assert torch.equal(got[1], want[1])            # the residual sum rounds once, exactly
    one = fo.add_rmsnorm_triton(x[:1], r[:1], w, 1e-6)[0]
    assert torch.equal(one, fo.add_rmsnorm_triton(x, r, w, 1e-6)[0][:1])   # batch-invariant


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nq,nkv,d", [(32, 8, 128), (32, 16, 256), (4, 2, 32)])
def test_rope_kv(dtype, nq, nkv, d):
    T = 5
    qkv = rnd(T, (nq + 2 * nkv) * d, dtype=dtype)
    rope = Rope(d, 500000.0, 4096).to("cuda", dtype)
    pos = torch.tensor([0, 1, 77, 4095, 1000], device="cuda")
    loc = torch.tensor([3, 9, 0, 17, 11], device="cuda")
    caches = [torch.zeros(20, nkv, d, dtype=dtype, device="cuda") for _ in range(4)]
    want = fo.rope_qkv_cache_ref(qkv, pos, rope.cos, rope.sin, nq, nkv, caches[0], caches[1], loc)
    got = fo.rope_qkv_cache_triton(qkv, pos, rope.cos, rope.sin, nq, nkv, caches[2], caches[3],
                                   loc)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(caches[2], caches[0], **TOL[dtype])
    assert torch.equal(caches[3], caches[1])
    q_only = qkv[:, :nq * d].contiguous()
    torch.testing.assert_close(
        fo.rope_qkv_cache_triton(q_only, pos, rope.cos, rope.sin, nq, 0, None, None, None),
        want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,Im", [(1, 14336), (9, 21504), (3, 100)])
def test_silu_mul(dtype, T, Im):
    gu = rnd(T, 2 * Im, dtype=dtype) * 3
    torch.testing.assert_close(fo.silu_mul_triton(gu), fo.silu_mul_ref(gu), **TOL[dtype])


@pytest.mark.parametrize("B,K,S,D", CASES)
def test_spec_stage_kernels(B, K, S, D):
    scores, tokens, parents = (x.cuda() for x in candidates(B, K, S, seed=B * 10 + K))
    want_sel = tree._organize_torch(scores, tokens, parents, D - 1)
    got_sel = fs.organize_triton(scores, tokens, parents, D - 1)
    assert all(torch.equal(a, b) for a, b in zip(got_sel, want_sel))
    bonus = torch.arange(B, device="cuda") + 7
    seq = torch.arange(B, device="cuda") * 3 + 5
    want = tree._build_tree_torch(*want_sel, bonus, seq)
    got = fs.build_tree_triton(*want_sel, bonus, seq)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    t = tree.DraftTree(*want, num_steps=S)
    argmax = torch.where(torch.rand(B, D, device="cuda") < 0.7,
                         t.tokens.gather(1, t.retrieve_next_token.clamp(min=0)),
                         torch.randint(0, 50, (B, D), device="cuda"))
    assert all(torch.equal(a, b) for a, b in zip(
        fs.accept_greedy_triton(t.tokens, t.parents, argmax, S),
        accept._accept_greedy_torch(t.tokens, t.parents, argmax, S)))
    n = torch.randint(1, S + 2, (B,), device="cuda")
    assert all(torch.equal(a, b) for a, b in zip(
        fs.accept_chain_triton(t.tokens, t.retrieve_next_token, argmax, n, S),
        accept._accept_chain_torch(t.tokens, t.retrieve_next_token, argmax, n, S)))
    table = torch.randperm(8 * 64, device="cuda").view(8, 64).int()
    rows = torch.randperm(8, device="cuda")[:B]
    window = commit._window_slots_torch(table, rows, seq, D)
    assert torch.equal(fs.window_slots_triton(table, rows, seq, D), window)
    index = accept._accept_greedy_torch(t.tokens, t.parents, argmax, S)[0]
    assert all(torch.equal(a, b) for a, b in zip(fs.accept_moves_triton(window, index),
                                                 commit._accept_moves_torch(window, index)))


def test_no_kernel_fell_back(caplog):
    """Run last in this file: every fused kernel above compiled (no fallback recorded)."""
    x = rnd(2, 64, dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING, logger="mtplab"):
        fo.add_rmsnorm(x, x, x[0], 1e-6)
        fo.silu_mul(x)
    assert not fo._failed, fo._failed


@pytest.mark.parametrize("draft,topk", [("none", 1), ("frozen_kv_mtp", 1), ("eagle", 1),
                                        ("frozen_kv_mtp", 4)])
def test_greedy_fp32_fused_equals_unfused(draft, topk):
    prompts = random_prompts(6, [3, 17, 60], 320, seed=3)
    outs = {}
    for fused in (False, True):
        eng = Engine(RunConfig(model="tiny-code", device="cuda", dtype="float32", draft=draft,
                               topk=topk, page_size=16, fused=fused, overlap=True,
                               zero_bubble=draft != "none", max_running_requests=8))
        outs[fused] = eng.generate(prompts, 48, ignore_eos=True)
        eng.check_invariants()
        assert eng.model.fused is fused
    assert outs[True] == outs[False]
    assert not fo._failed, fo._failed
