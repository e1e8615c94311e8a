"""kernels/topk.py compiled on CUDA vs torch at real vocabularies: log_softmax top-k (the
draft's branch_topk) and the accept stage's argmax; CUDA-graph capture without host syncs."""
import pytest
import torch

from mtplab.kernels import fused_ops as fo
from mtplab.nogc import gc_paused
from mtplab.kernels import topk as T
from mtplab.speculative.draft_select import branch_topk

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
TOL = dict(rtol=1e-5, atol=1e-5)


def rnd(N, V, dtype, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(N, V, generator=g)).to("cuda", dtype)


def exact(x, i):
    """log_softmax in float64 at ids i, rounded to fp32 (the truth both are measured by)."""
    return torch.log_softmax(x.double(), dim=-1).gather(-1, i).float()


def stable_order(x, K):
    return torch.sort(x.float(), dim=-1, descending=True, stable=True).indices[..., :K]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("V", [128256, 262144])
@pytest.mark.parametrize("N", [1, 4, 32])
@pytest.mark.parametrize("K", [1, 4, 8])
def test_logp_topk_matches_torch(dtype, V, N, K):
    for scale in (3.0, 12.0):                       # flat and peaked distributions
        x = rnd(N, V, dtype, scale, seed=N + K)
        v, i = T.logp_topk_triton(x, K)
        want_v, want_i = T.logp_topk_ref(x, K)
        torch.testing.assert_close(v, want_v, **TOL)
        torch.testing.assert_close(v, exact(x, i), **TOL)
        full = torch.log_softmax(x.float(), dim=-1)
        torch.testing.assert_close(full.gather(-1, i), v, **TOL)
        assert torch.equal(i, stable_order(x, K))    # larger logit, then lower id
        distinct = (full[:, None, :] == want_v[:, :, None]).sum(-1) == 1
        assert torch.equal(i[distinct], want_i[distinct])
        # the dispatched path (what the engine calls) runs the kernel, not a fallback
        bv, bi = branch_topk(x, K)
        assert torch.equal(bv, v) and torch.equal(bi, i)
    assert "logp_topk" not in fo._failed


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [128256, 262144])
@pytest.mark.parametrize("N", [1, 4, 32])
def test_argmax_equals_torch(dtype, V, N):
    x = rnd(N, V, dtype, seed=V + N)
    assert torch.equal(T.argmax_triton(x), x.argmax(-1))
    coarse = x.float().round().to(dtype)             # ties at the max: the first one wins
    assert torch.equal(T.argmax_triton(coarse), coarse.argmax(-1))
    x[0, [V - 1, 5]] = float("nan")
    assert torch.equal(T.argmax_triton(x), x.argmax(-1))
    assert torch.equal(T.argmax(x.view(N, 1, V)), x.argmax(-1)[:, None])
    assert "argmax" not in fo._failed


def test_planted_ties_and_chunk_edges():
    V = 128256
    x = torch.full((2, V), -4.0, device="cuda")
    top = [V - 1, 70000, 1025, 3]                    # in four different chunks
    x[0, top] = 5.0
    x[1, :] = float("-inf")
    x[1, [V - 2, 9]] = 1.0
    v, i = T.logp_topk_triton(x, 8)
    assert i[0, :4].tolist() == sorted(top) and i[0, 4:].tolist() == [0, 1, 2, 4]
    assert i[1].tolist() == [9, V - 2, 0, 1, 2, 3, 4, 5]
    # 128252 equal terms: checked against float64 (torch's CPU fp32 sum is off by ~1e-4 here)
    torch.testing.assert_close(v, exact(x, i), **TOL)
    small = torch.cat([x[:, :997], x[:, -3:]], 1)    # V = 1000, the planted ids moved
    for K, block in ((16, 8), (16, 16), (8, 256)):   # chunks smaller than / equal to K
        bv, bi = T.logp_topk_triton(small, K, block)
        assert torch.equal(bi, stable_order(small, K))
        torch.testing.assert_close(bv, exact(small, bi), **TOL)
        assert torch.equal(T.argmax_triton(small, block), small.argmax(-1))


def test_graph_capture_without_host_sync():
    x = rnd(4, 128256, torch.bfloat16)
    xf = rnd(4, 128256, torch.float32, seed=1)
    T.logp_topk_triton(x, 4), T.argmax_triton(xf)          # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with gc_paused(), torch.cuda.graph(g):
            v, i = T.logp_topk_triton(x, 4)
            a = T.argmax_triton(xf)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    x.copy_(rnd(4, 128256, torch.bfloat16, seed=2))
    xf.copy_(rnd(4, 128256, torch.float32, seed=3))
    g.replay()
    torch.cuda.synchronize()
    want_v, want_i = T.logp_topk_ref(x, 4)
    torch.testing.assert_close(v, want_v, **TOL)
    assert torch.equal(i, stable_order(x, 4))
    assert torch.equal(a, xf.argmax(-1))


def test_rows_are_batch_invariant():
    x = rnd(32, 128256, torch.bfloat16, seed=5)
    v, i = T.logp_topk_triton(x, 4)
    for r in (0, 17, 31):
        v1, i1 = T.logp_topk_triton(x[r:r + 1], 4)
        assert torch.equal(v1, v[r:r + 1]) and torch.equal(i1, i[r:r + 1])
