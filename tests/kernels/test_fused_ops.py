"""Fused decoder ops: each Triton kernel vs its torch reference (CPU: TRITON_INTERPRET=1, see
conftest.py; tests/gpu/test_fused_gpu.py runs them compiled), the references vs the unfused
model arithmetic, and the logged fallback when a kernel fails."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from mtplab.kernels import fused_ops as fo
from mtplab.models.llama import RMSNorm, Rope

# The interpreter rounds fp32 -> bf16 by its own rule, and a double rounding (silu, norm) can
# compound it: allow a few bf16 ulps there.
TOL = {torch.float32: dict(atol=2e-6, rtol=2e-6), torch.bfloat16: dict(atol=4e-2, rtol=2e-2)}


def rnd(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_res", [False, True])
@pytest.mark.parametrize("T,N", [(1, 48), (5, 64), (3, 100)])
def test_add_rmsnorm_triton_matches_reference(dtype, with_res, T, N):
    x, r, w = rnd(T, N, dtype=dtype), rnd(T, N, dtype=dtype, seed=1), rnd(N, dtype=dtype, seed=2)
    res = r if with_res else None
    want_y, want_s = fo.add_rmsnorm_ref(x, res, w, 1e-6)
    got_y, got_s = fo.add_rmsnorm_triton(x, res, w, 1e-6)
    assert got_y.dtype == dtype and got_y.shape == (T, N)
    torch.testing.assert_close(got_y, want_y, **TOL[dtype])
    torch.testing.assert_close(got_s, want_s, **TOL[dtype])


def test_add_rmsnorm_rows_are_batch_invariant():
    """One program per row: a row's output is the same alone or inside a larger batch."""
    x, r, w = rnd(6, 80), rnd(6, 80, seed=1), rnd(80, seed=2)
    full = fo.add_rmsnorm_triton(x, r, w, 1e-5)[0]
    for i in (0, 3, 5):
        assert torch.equal(fo.add_rmsnorm_triton(x[i:i + 1], r[i:i + 1], w, 1e-5)[0], full[i:i + 1])


def test_add_rmsnorm_reference_is_the_unfused_arithmetic():
    x, r = rnd(4, 32), rnd(4, 32, seed=1)
    norm = RMSNorm(32, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(rnd(32, seed=3))
    y, s = fo.add_rmsnorm_ref(x, r, norm.weight, norm.eps)
    assert torch.equal(s, x + r) and torch.equal(y, norm(x + r))


def rope_case(dtype, T=4, nq=4, nkv=2, d=16, slots=12):
    qkv = rnd(T, (nq + 2 * nkv) * d, dtype=dtype)
    rope = Rope(d, 10000.0, 64).to(dtype)
    pos = torch.tensor([0, 9, 63, 31][:T])
    loc = torch.tensor([7, 2, 11, 0][:T])
    caches = [torch.zeros(slots, nkv, d, dtype=dtype) for _ in range(2)]
    return qkv, rope, pos, loc, caches


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kv_triton_matches_reference(dtype):
    qkv, rope, pos, loc, (kc, vc) = rope_case(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    want = fo.rope_qkv_cache_ref(qkv, pos, rope.cos, rope.sin, 4, 2, kc, vc, loc)
    got = fo.rope_qkv_cache_triton(qkv, pos, rope.cos, rope.sin, 4, 2, kc2, vc2, loc)
    torch.testing.assert_close(got, want, **TOL[dtype])
    torch.testing.assert_close(kc2, kc, **TOL[dtype])
    assert torch.equal(vc2, vc)                       # v is copied, not computed
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[loc] = False
    assert not kc2[untouched].any() and not vc2[untouched].any()


def test_rope_q_only_writes_no_cache():
    qkv, rope, pos, _, _ = rope_case(torch.float32)
    q_only = qkv[:, :4 * 16].contiguous()
    want = fo.rope_qkv_cache_ref(q_only, pos, rope.cos, rope.sin, 4, 0, None, None, None)
    got = fo.rope_qkv_cache_triton(q_only, pos, rope.cos, rope.sin, 4, 0, None, None, None)
    torch.testing.assert_close(got, want, **TOL[torch.float32])
    assert torch.equal(want, rope(q_only.view(4, 4, 16), pos))


def test_rope_kv_reference_is_the_unfused_arithmetic():
    qkv, rope, pos, loc, (kc, vc) = rope_case(torch.float32)
    q = fo.rope_qkv_cache_ref(qkv, pos, rope.cos, rope.sin, 4, 2, kc, vc, loc)
    assert torch.equal(q, rope(qkv[:, :64].view(4, 4, 16), pos))
    assert torch.equal(kc[loc], rope(qkv[:, 64:96].view(4, 2, 16), pos))
    assert torch.equal(vc[loc], qkv[:, 96:].view(4, 2, 16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("T,Im", [(1, 40), (3, 1500)])
def test_silu_mul_triton_matches_reference(dtype, T, Im):
    gu = rnd(T, 2 * Im, dtype=dtype) * 4
    want = fo.silu_mul_ref(gu)
    torch.testing.assert_close(fo.silu_mul_triton(gu), want, **TOL[dtype])
    assert torch.equal(want, F.silu(gu[:, :Im]) * gu[:, Im:])


def test_dispatch_uses_the_reference_off_cuda():
    x, w = rnd(2, 16), rnd(16, seed=1)
    assert torch.equal(fo.add_rmsnorm(x, None, w, 1e-6)[0], fo.add_rmsnorm_ref(x, None, w, 1e-6)[0])


def test_a_failing_kernel_falls_back_once_with_a_warning(monkeypatch, caplog):
    calls = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("PassManager::run failed")

    class FakeCuda:            # the dispatcher only asks `is_cuda`
        is_cuda = True

    monkeypatch.setattr(fo, "_failed", set())
    with caplog.at_level(logging.WARNING, logger="mtplab"):
        for _ in range(3):
            assert fo.dispatch("probe", broken, lambda *a: "ref", FakeCuda()) == "ref"
    assert len(calls) == 1
    warnings = [r for r in caplog.records if "probe" in r.getMessage()]
    assert len(warnings) == 1 and "torch reference" in warnings[0].getMessage()


def test_references_context_selects_the_torch_body():
    class FakeCuda:
        is_cuda = True

    kernel = lambda *a: "kernel"     # noqa: E731
    ref = lambda *a: "ref"           # noqa: E731
    assert fo.dispatch("probe2", kernel, ref, FakeCuda()) == "kernel"
    with fo.references():
        assert fo.dispatch("probe2", kernel, ref, FakeCuda()) == "ref"
        with fo.references(False):
            assert fo.dispatch("probe2", kernel, ref, FakeCuda()) == "ref"
    with fo.references(False):
        assert fo.dispatch("probe2", kernel, ref, FakeCuda()) == "kernel"
