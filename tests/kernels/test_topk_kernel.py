"""Top-k of log_softmax and argmax over the vocabulary (kernels/topk.py, TRITON_INTERPRET=1 on
CPU) vs torch: log_softmax + topk (the draft's branch_topk reference) and argmax.

The kernel's order is exact on the fp32 logits: larger logit first, equal logits by the lower
token id, i.e. a stable descending sort of logits.float(); torch.topk leaves tie order open, so
against it values are compared to rtol = atol = 1e-5 and ids only where values are distinct."""
from __future__ import annotations

import pytest
import torch

from mtplab.kernels import topk as T
from mtplab.speculative.draft_select import branch_topk

TOL = dict(rtol=1e-5, atol=1e-5)


def logits(N, V, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, V, generator=g) * scale).to(dtype)


def stable_order(x, K):
    """The kernel's spec: ids of the K largest fp32 logits, equal logits by the lower id."""
    return torch.sort(x.float(), dim=-1, descending=True, stable=True).indices[..., :K]


def check_against_torch(x, K, got_v, got_i):
    want_v, want_i = T.logp_topk_ref(x, K)
    assert got_v.dtype == torch.float32 and got_i.dtype == torch.int64
    assert got_v.shape == want_v.shape and got_i.shape == want_i.shape
    torch.testing.assert_close(got_v, want_v, **TOL)
    full = torch.log_softmax(x.float(), dim=-1)
    torch.testing.assert_close(full.gather(-1, got_i), got_v, **TOL)   # ids carry the values
    assert torch.equal(got_i, stable_order(x, K))
    # ids equal torch's wherever the value is distinct from the rest of the row
    row_counts = (full[..., None, :] == want_v[..., :, None]).sum(-1)       # [..., K]
    distinct = row_counts == 1
    assert torch.equal(got_i[distinct], want_i[distinct])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("N,V,K", [(1, 1000, 1), (4, 1000, 2), (3, 5000, 4), (6, 2048, 8),
                                   (2, 4999, 8), (1, 3000, 16)])
def test_logp_topk_kernel_matches_torch(dtype, N, V, K):
    x = logits(N, V, dtype, seed=N * 100 + K)
    check_against_torch(x, K, *T.logp_topk_triton(x, K))


@pytest.mark.parametrize("block,K", [(4, 8), (8, 16), (16, 16), (64, 1)])
def test_chunks_smaller_than_k(block, K):
    """Chunks of 4..64 tokens, K up to 16: chunks contribute sentinels past their size, and
    the last chunk is partial (V not a multiple of the chunk)."""
    x = logits(2, 203, torch.float32, seed=K)
    check_against_torch(x, K, *T.logp_topk_triton(x, K, block))
    assert torch.equal(T.argmax_triton(x, block), x.argmax(-1))


def test_branch_layout_rows():
    """branch_topk's [B, K, V] layout and a row-strided (non-contiguous) view."""
    x = logits(2 * 4, 700, torch.bfloat16, seed=3).view(2, 4, 700)
    v, i = T.logp_topk_triton(x, 4)
    assert v.shape == (2, 4, 4)
    check_against_torch(x, 4, v, i)
    wide = logits(3, 1500, torch.float32, seed=4)[:, 100:1300]
    check_against_torch(wide, 2, *T.logp_topk_triton(wide, 2, 64))


def test_planted_ties_lowest_index_first():
    V = 1000
    x = torch.full((3, V), -5.0)
    x[0, [700, 3, 500, 999]] = 2.0                  # four-way tie at the top
    x[1, [10, 20]] = 1.0
    x[1, [900, 5, 600]] = 0.5                       # tie straddling the k boundary
    x[2] = torch.zeros(V)
    x[2, 100:] = -0.0                               # -0.0 ties +0.0: lowest ids win
    for dtype in (torch.float32, torch.bfloat16):
        xx = x.to(dtype)
        v, i = T.logp_topk_triton(xx, 4, 64)
        assert i[0].tolist() == [3, 500, 700, 999]
        assert i[1].tolist() == [10, 20, 5, 600]
        assert i[2].tolist() == [0, 1, 2, 3]
        torch.testing.assert_close(v, T.logp_topk_ref(xx, 4)[0], **TOL)
        assert torch.equal(T.argmax_triton(xx, 64), xx.argmax(-1))
        assert T.argmax_triton(xx, 64).tolist() == [3, 10, 0]


def test_unambiguous_order_gives_identical_ids():
    """Distinct, well separated logits: the ids equal torch.topk's exactly."""
    g = torch.Generator().manual_seed(7)
    V, K = 4096, 8
    x = torch.randn(5, V, generator=g)
    ids = torch.randperm(V, generator=g)[:5 * K].view(5, K)
    x.scatter_(1, ids, 10.0 + torch.arange(K, 0, -1).float().expand(5, K))
    v, i = T.logp_topk_triton(x, K)
    want_v, want_i = T.logp_topk_ref(x, K)
    assert torch.equal(i, ids) and torch.equal(i, want_i)
    torch.testing.assert_close(v, want_v, **TOL)


def test_neg_inf_and_very_negative_logits():
    V = 600
    x = torch.full((4, V), float("-inf"))
    x[0, [17, 300]] = torch.tensor([0.5, 1.5])      # two finite logits, K = 4: -inf ranks next
    x[1] = torch.linspace(-1e4, -9e3, V)            # very negative, finite
    x[2, :] = -3e38                                  # near fp32 min, all equal
    x[3, 599] = 0.0                                  # one finite logit in the last chunk
    v, i = T.logp_topk_triton(x, 4, 64)
    want_v, _ = T.logp_topk_ref(x, 4)
    torch.testing.assert_close(v, want_v, **TOL)     # -inf == -inf, finite close
    assert i[0].tolist() == [300, 17, 0, 1]
    assert i[1].tolist() == [599, 598, 597, 596]
    assert i[2].tolist() == [0, 1, 2, 3]
    assert i[3].tolist() == [599, 0, 1, 2]
    assert torch.equal(T.argmax_triton(x, 64), x.argmax(-1))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # numpy's log(0), inf - inf
def test_all_neg_inf_row_is_nan_like_torch():
    x = torch.full((1, 300), float("-inf"))
    v, i = T.logp_topk_triton(x, 2, 64)
    assert torch.isnan(v).all() and torch.isnan(T.logp_topk_ref(x, 2)[0]).all()
    assert i.tolist() == [[0, 1]]
    assert T.argmax_triton(x, 64).tolist() == [0] == x.argmax(-1).tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("N,V", [(1, 1000), (3, 5000), (6, 1537)])
def test_argmax_kernel_equals_torch(dtype, N, V):
    x = logits(N, V, dtype, seed=V + N)
    assert torch.equal(T.argmax_triton(x), x.argmax(-1))
    coarse = x.float().round().to(dtype)            # many ties at the max
    assert torch.equal(T.argmax_triton(coarse, 256), coarse.argmax(-1))
    d3 = x.view(N, 1, V).expand(N, 2, V)            # leading dims, stride-0 rows
    assert torch.equal(T.argmax_triton(d3), d3.argmax(-1))


def test_argmax_nan_first_like_torch():
    x = logits(3, 500, torch.float32)
    x[0, [400, 120]] = float("nan")
    x[1, 7] = float("inf")
    x[2, [3, 450]] = float("inf")
    assert torch.equal(T.argmax_triton(x, 64), x.argmax(-1))
    assert T.argmax_triton(x, 64).tolist() == [120, 7, 3]


def test_off_cuda_and_large_k_run_the_reference():
    x = logits(2, 300, torch.float32)
    for K in (1, 4, T.MAX_K + 1):
        want = T.logp_topk_ref(x, K)
        got = branch_topk(x, K)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(T.argmax(x), x.argmax(-1))
    with pytest.raises(ValueError):
        T.logp_topk_triton(x, T.MAX_K + 1)


def test_rows_are_batch_invariant():
    x = logits(5, 3000, torch.bfloat16, seed=11)
    v, i = T.logp_topk_triton(x, 4)
    v1, i1 = T.logp_topk_triton(x[2:3], 4)
    assert torch.equal(v1, v[2:3]) and torch.equal(i1, i[2:3])
