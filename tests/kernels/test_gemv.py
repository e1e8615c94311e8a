"""The skinny decode GEMM (kernels/gemv.py, TRITON_INTERPRET=1 on CPU) against its plain-torch
reference F.linear: every row count up to MAX_M, N and K not multiples of the tiles, split-K
with its fixed-order reduce, fp32 and bf16, and the dispatch rule for shapes it does not take."""
from __future__ import annotations

import pytest
import torch

from mtplab.kernels import gemv as G


def operands(m, n, k, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(dtype)
    return x, w


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,cfg", [
    (1, 40, 96, G.GemvConfig(block_n=16, block_k=32)),
    (3, 33, 70, G.GemvConfig(block_n=16, block_k=32)),               # ragged N and K
    (8, 64, 256, G.GemvConfig(block_n=32, block_k=64, split_k=2)),   # split-K, two slices
    (16, 50, 200, G.GemvConfig(block_n=16, block_k=32, split_k=4)),  # MAX_M rows, ragged split
    (5, 17, 31, G.GemvConfig(block_n=16, block_k=32, split_k=2)),    # a slice past K reads 0
    (2, 40, 300, G.GemvConfig(block_n=32, block_k=32, split_k=3)),   # three slices, the last short
])
def test_gemv_kernel_matches_linear(dtype, m, n, k, cfg):
    x, w = operands(m, n, k, dtype, seed=m * 7 + n)
    got = G._gemv_triton(x, w, cfg)
    assert got.dtype == dtype and got.shape == (m, n)
    torch.testing.assert_close(got.float(), G.gemv_ref(x, w).float(), **tol(dtype))


def test_split_k_changes_only_the_summation_order():
    """One result per config: the same call twice is bit-equal (no atomics), and split 1 vs 4
    agree to fp32 rounding."""
    x, w = operands(4, 48, 512, torch.float32, seed=3)
    a = G._gemv_triton(x, w, G.GemvConfig(block_n=16, block_k=64, split_k=4))
    b = G._gemv_triton(x, w, G.GemvConfig(block_n=16, block_k=64, split_k=4))
    c = G._gemv_triton(x, w, G.GemvConfig(block_n=16, block_k=64, split_k=1))
    assert torch.equal(a, b)
    torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-5)


def test_config_fills_the_device():
    """The default launch: 32 x 256 tiles, no split where the row tiles cover half the SMs;
    K is split only while they fall short."""
    for n, k in ((4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (128256, 4096)):
        c = G.config(n, k, sms=132)
        assert (c.block_n, c.block_k) == (32, 256) and c.split_k == 1
    assert G.config(2048, 8192, sms=132).split_k == 2             # 64 row tiles
    assert G.config(1024, 8192, sms=132).split_k == 4             # 32 row tiles


def test_linear_off_cuda_runs_f_linear(monkeypatch):
    """`linear` with a launch on CPU tensors is F.linear, and the kernel is never called."""
    monkeypatch.setattr(G, "gemv", lambda *a: pytest.fail("kernel called off CUDA"))
    x, w = operands(2, 40, 64, torch.float32)
    assert torch.equal(G.linear(x, w, G.GemvConfig()), torch.nn.functional.linear(x, w))


def test_gemv_off_cuda_and_for_other_shapes_runs_the_reference(monkeypatch):
    """CPU tensors, more than MAX_M rows or a 3-D x run F.linear, and the kernel is never
    called for them."""
    called = []
    monkeypatch.setattr(G, "_gemv_triton", lambda *a: called.append(a) or G.gemv_ref(*a))
    for shape in ((2, 64), (G.MAX_M + 1, 64), (2, 3, 64)):
        x = torch.randn(*shape)
        w = torch.randn(8, 64)
        torch.testing.assert_close(G.gemv(x, w), torch.nn.functional.linear(x, w))
    assert called == []
