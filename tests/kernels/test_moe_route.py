"""The one-kernel MoE routing (kernels/moe_route.py, TRITON_INTERPRET=1 on CPU) against its
torch reference: the top-k ids in order, the fp32 weights (renormalised or not), the shared
expert's gate, the alignment bit for bit (in-kernel, over several chunks, and the torch
alignment above ALIGN_MAX_SLOTS), the counters left zero for the next launch, and batch
invariance. The reference's ids are a stable descending sort of the fp32 logits, which is
also torch.topk's order wherever the logits are distinct (checked here once)."""
from __future__ import annotations

import pytest
import torch

from mtplab.kernels import fused_moe as fm
from mtplab.kernels import moe_route as mr

TOL = dict(atol=2e-6, rtol=2e-6)


def case(T, E, H, dtype=torch.float32, gate=True, bias=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)                        # noqa: E731
    x = r(T, H).to(dtype)
    wr = (r(E, H) / H ** 0.5).to(dtype)
    wg = (r(1, H) / H ** 0.5).to(dtype) if gate else None
    b = r(E).to(dtype) if bias else None
    return x, wr, b, wg


def counts(T):
    return torch.zeros(mr.counts_len(T, "cpu"), dtype=torch.int32)


def check(got: fm.Routing, want: fm.Routing, dtype=torch.float32):
    assert got.ids.dtype == torch.int64 and got.weights.dtype == torch.float32
    assert torch.equal(got.ids, want.ids)
    torch.testing.assert_close(got.weights, want.weights, **TOL)
    if want.gate is None:
        assert got.gate is None
    else:
        torch.testing.assert_close(got.gate, want.gate, **TOL)
    assert torch.equal(got.sorted_ids, want.sorted_ids)
    assert torch.equal(got.block_expert, want.block_expert)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,E,k,H,norm,gate,bias", [
    (1, 16, 4, 64, True, True, False), (7, 16, 4, 100, True, True, True),
    (9, 5, 3, 40, False, False, False), (33, 64, 8, 96, True, True, False),
    (4, 128, 8, 72, True, False, True)])
def test_kernel_matches_the_reference(dtype, T, E, k, H, norm, gate, bias):
    x, wr, b, wg = case(T, E, H, dtype, gate, bias, seed=T + E)
    c = counts(T)
    got = mr.route_align_triton(x, wr, b, wg, k, norm, 4, c)
    check(got, mr.route_align_ref(x, wr, b, wg, k, norm, 4))
    assert not c.any()                                   # ready for the next launch
    if norm:
        torch.testing.assert_close(got.weights.sum(-1), torch.ones(T), **TOL)


@pytest.mark.parametrize("bm,chunk", [(4, 8), (16, 8), (4, 16), (16, 32)])
def test_alignment_over_chunks_and_block_sizes(bm, chunk):
    """Slots aligned over several chunks (T*k = 88 slots in chunks of 8..32, the last one
    partial), at the interpreter's and the GPU's block rows."""
    x, wr, b, wg = case(11, 16, 48, seed=bm + chunk)
    got = mr.route_align_triton(x, wr, b, wg, 8, True, bm, counts(11), chunk=chunk)
    check(got, mr.route_align_ref(x, wr, b, wg, 8, True, bm))


def test_reference_order_is_torch_topk_on_distinct_logits():
    x, wr, b, wg = case(6, 32, 40, seed=5)
    want = torch.topk(torch.softmax(x @ wr.T, -1), 4, -1)
    got = mr.route_align_ref(x, wr, b, wg, 4, False, 4)
    assert torch.equal(got.ids, want.indices)
    torch.testing.assert_close(got.weights, want.values, **TOL)


def test_ties_go_to_the_lower_expert():
    x = torch.ones(2, 8)
    wr = torch.zeros(6, 8)
    wr[4] = 1.0                                          # expert 4 first, then 0, 1, 2 tied
    got = mr.route_align_triton(x, wr, None, None, 3, True, 4, counts(2))
    assert got.ids.tolist() == [[4, 0, 1]] * 2
    check(got, mr.route_align_ref(x, wr, None, None, 3, True, 4))


def test_above_align_max_slots_torch_aligns(monkeypatch):
    monkeypatch.setattr(mr, "ALIGN_MAX_SLOTS", 16)
    x, wr, b, wg = case(9, 16, 40, seed=2)                # 36 slots > 16
    c = counts(9)
    got = mr.route_align_triton(x, wr, b, wg, 4, True, 4, c)
    check(got, mr.route_align_ref(x, wr, b, wg, 4, True, 4))
    assert not c.any()


def test_rows_are_batch_invariant():
    x, wr, b, wg = case(13, 16, 64, torch.bfloat16, seed=9)
    full = mr.route_align_triton(x, wr, b, wg, 4, True, 4, counts(13))
    for i in (0, 5, 12):
        one = mr.route_align_triton(x[i:i + 1], wr, b, wg, 4, True, 4, counts(1))
        assert torch.equal(one.ids, full.ids[i:i + 1])
        assert torch.equal(one.weights, full.weights[i:i + 1])
        assert torch.equal(one.gate, full.gate[i:i + 1])


def test_counters_too_short_are_refused():
    x, wr, b, wg = case(9, 16, 40)
    with pytest.raises(ValueError, match="at least 4 entries"):
        mr.route_align_triton(x, wr, b, wg, 4, True, 4, torch.zeros(2, dtype=torch.int32))


@pytest.fixture
def dirty_empty(monkeypatch):
    """torch.empty returns memory full of junk: what the kernel leaves unwritten shows."""
    real = torch.empty

    def empty(*size, **kw):
        t = real(*size, **kw)
        return t.fill_(-7) if not t.is_floating_point() else t.fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", empty)


@pytest.mark.parametrize("T,E,k,chunk,tbc", [
    (1, 16, 4, 2, 2),          # one token block aligns (no second arrival); fill over 2-wide
    (3, 13, 3, 2, 1),          # one block, E not a power of two, several fill trips a program
    (33, 16, 4, 8, 2),         # 9 token blocks, counted 2 a trip; 132 slots over 17 chunks
    (33, 100, 8, 16, 4),       # many blocks, E = 100 (not a power of two), most experts once
    (50, 7, 2, 4, 32)])        # all 13 blocks in one counting trip, few experts, long runs
def test_parallel_fill_and_blockwise_alignment(dirty_empty, T, E, k, chunk, tbc):
    """Every program's share of the padding, each token block's counts and ranks, and the
    last block's offsets, used blocks and scatter: the alignment bit for bit on outputs
    that start as junk, and the counters left zero."""
    x, wr, b, wg = case(T, E, 40, seed=T * E + k)
    c = torch.zeros(mr.counts_len(T, "cpu"), dtype=torch.int32)
    got = mr.route_align_triton(x, wr, b, wg, k, True, 4, c, chunk=chunk, tbc=tbc)
    check(got, mr.route_align_ref(x, wr, b, wg, k, True, 4))
    assert not c.any()


def test_serial_work_at_the_moe_floor_shape():
    """The one aligning program's trips at gemma4-26b-a4b's router (H 2816, E 128, k 8,
    16-row blocks, bf16 on CUDA): one token block (T <= 16) aligns from its registers in two
    arrival phases and one trip (the used blocks); up to ALIGN_MAX_SLOTS (512 tokens) at
    most 11 trips; no program fills more than two chunks."""
    for T, phases, trips in ((1, 2, 1), (8, 2, 1), (16, 2, 1), (32, 3, 4), (64, 3, 4),
                             (128, 3, 5), (512, 3, 11)):
        w = mr.serial_work(T, 2816, 128, 8, 16, torch.bfloat16)
        assert (w["phases"], w["align_trips"]) == (phases, trips), (T, w)
        assert w["fill_trips"] <= 2, (T, w)
