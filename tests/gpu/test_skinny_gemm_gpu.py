"""The skinny GEMM compiled on CUDA: vs its torch reference at llama3-8b's shapes (the split-K
path included), no silent fallback, graph replay == eager, and through the engine greedy
spec == target-only (fp32) with the kernel on, graphs == eager."""
import functools
import gc
import weakref

import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.kernels import fused_ops as fo
from mtplab.kernels import skinny_gemm as sg
from tests.helpers import make_agreeable, random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = {torch.float32: dict(atol=1e-3, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=2e-2)}
# (N, K): q/o, k/v, fused qkv, fused gate/up, down, a draft-sized LM head slice
SHAPES = [(4096, 4096), (1024, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (32000, 1024)]


def rnd(*shape, dtype, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, device="cuda")).to(dtype)


@pytest.fixture(scope="module")
def ws():
    return sg.Workspace(torch.device("cuda"))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("N,K", SHAPES)
def test_kernel_matches_reference(ws, dtype, N, K):
    w = rnd(N, K, dtype=dtype, seed=1, scale=K ** -0.5)
    for M in (1, 2, 5, 8):
        for silu in (False, True):
            x = rnd(M, 2 * K if silu else K, dtype=dtype, seed=M)
            ws.part.fill_(float("nan"))          # a partial read before it is written shows
            got = sg.skinny_gemm_triton(x, w, ws, silu_mul=silu)
            want = (sg.linear_silu_mul_ref if silu else sg.linear_ref)(x.float(), w.float())
            torch.testing.assert_close(got.float(), want, **TOL[dtype])
            assert not ws.count.any()
    assert sg.plan(N, K, dtype, ws.sms).splits > 1 or N >= 6144     # the split path is tested


def test_split_k_is_deterministic_and_row_invariant(ws):
    w = rnd(4096, 14336, dtype=torch.bfloat16, seed=2, scale=0.01)
    x = rnd(8, 14336, dtype=torch.bfloat16, seed=3)
    assert sg.plan(4096, 14336, torch.bfloat16, ws.sms).splits > 1
    a = sg.skinny_gemm_triton(x, w, ws)
    for _ in range(5):
        assert torch.equal(sg.skinny_gemm_triton(x, w, ws), a)
    for r in (0, 3, 7):
        assert torch.equal(sg.skinny_gemm_triton(x[r:r + 1].contiguous(), w, ws), a[r:r + 1])


def test_silu_mul_is_the_fused_op_then_the_gemm(ws):
    K = 14336
    w = rnd(4096, K, dtype=torch.bfloat16, seed=4, scale=0.01)
    gu = rnd(4, 2 * K, dtype=torch.bfloat16, seed=5)
    got = sg.skinny_gemm_triton(gu, w, ws, silu_mul=True)
    assert torch.equal(got, sg.skinny_gemm_triton(fo.silu_mul_triton(gu), w, ws))


def test_linear_runs_the_kernel_without_fallback(ws):
    w = rnd(4096, 4096, dtype=torch.bfloat16, seed=6, scale=0.02)
    x = rnd(3, 4096, dtype=torch.bfloat16, seed=7)
    with sg.using(ws):
        y = sg.linear(x, w)
        y2 = sg.linear_silu_mul(rnd(3, 8192, dtype=torch.bfloat16), w)
    assert "skinny_gemm" not in fo._failed and "skinny_gemm_silu_mul" not in fo._failed
    assert torch.equal(y, sg.skinny_gemm_triton(x, w, ws)) and y2.shape == (3, 4096)


def test_graph_replay_equals_eager(ws):
    """Captured split-K launches (counters reset in-kernel) replay to the eager bits, with
    new inputs each replay."""
    w1 = rnd(4096, 4096, dtype=torch.bfloat16, seed=8, scale=0.02)
    w2 = rnd(4096, 14336, dtype=torch.bfloat16, seed=9, scale=0.01)
    x = torch.zeros(4, 4096, dtype=torch.bfloat16, device="cuda")
    gu = torch.zeros(4, 2 * 14336, dtype=torch.bfloat16, device="cuda")

    def fn():
        with sg.using(ws):
            return sg.linear(x, w1), sg.linear_silu_mul(gu, w2)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    for seed in range(3):
        x.copy_(rnd(4, 4096, dtype=torch.bfloat16, seed=10 + seed))
        gu.copy_(rnd(4, 2 * 14336, dtype=torch.bfloat16, seed=20 + seed))
        g.replay()
        want = fn()
        assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])
    assert not ws.count.any()
    del g


# -- through the engine -------------------------------------------------------------------
PROMPTS = random_prompts(11, [1, 9, 40, 130], 320, seed=5)


def gen(**kw):
    eng = Engine(RunConfig(device="cuda", context_len=512, model="random-tiny",
                           dtype="float32", page_size=16, **kw))
    make_agreeable(eng)
    out = eng.generate(PROMPTS, max_new_tokens=24, ignore_eos=True)
    eng.check_invariants()
    return eng, out


def test_engine_uses_the_kernel(monkeypatch):
    calls = []
    real = sg.skinny_gemm_triton
    monkeypatch.setattr(sg, "skinny_gemm_triton",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    gen(skinny_gemm=True, overlap=True, zero_bubble=True)
    assert calls and "skinny_gemm" not in fo._failed


@functools.cache
def target_only() -> list:
    """Target-only greedy without the kernel (cuBLAS), once for every case."""
    eng, out = gen()
    eng.close()
    return out


@pytest.mark.parametrize("draft,topk,D", [("none", 1, None), ("frozen_kv_mtp", 1, None),
                                          ("eagle", 4, 8)])
def test_lossless_fp32_with_the_kernel(draft, topk, D):
    want = target_only()
    eng, got = gen(skinny_gemm=True, draft=draft, topk=topk, num_draft_tokens=D, overlap=True,
                   zero_bubble=True)
    assert got == want
    if draft != "none":
        assert eng.stats()["accept_len"] >= 2.0


def test_graph_replay_equals_eager_with_the_kernel():
    kw = dict(skinny_gemm=True, draft="frozen_kv_mtp", topk=2, num_draft_tokens=6,
              fold_seed=True)
    _, eager = gen(cuda_graphs=False, **kw)
    _, graph = gen(cuda_graphs=True, **kw)
    assert graph == eager


def test_engine_close_frees_the_workspace():
    eng, _ = gen(skinny_gemm=True)
    refs = [weakref.ref(eng.gemm_workspace.part), weakref.ref(eng.gemm_workspace.count)]
    eng.close()
    gc.collect()
    assert all(r() is None for r in refs)
