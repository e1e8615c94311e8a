"""The QKV GEMM with RoPE and the KV write in its epilogue (kernels/qkv_rope.py,
TRITON_INTERPRET=1 on CPU) against its plain-torch reference rope_qkv_cache_ref(F.linear):
q, the cache rows it writes and the rows it leaves, with and without out_loc, ragged K, every
row count up to MAX_M; the launches it takes; and `qkv_rope` falling back to GEMM + RoPE."""
from __future__ import annotations

import pytest
import torch

from mtplab.kernels import gemv as G
from mtplab.kernels import qkv_rope as QR


def case(m, nq, nkv, d, k, dtype, seed=0, slots=40):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn((nq + 2 * nkv) * d, k, generator=g) / k ** 0.5).to(dtype)
    freqs = torch.outer(torch.arange(64, dtype=torch.float32), torch.rand(d // 2, generator=g))
    emb = torch.cat([freqs, freqs], -1)
    pos = torch.randint(0, 64, (m,), generator=g)
    loc = torch.randperm(slots, generator=g)[:m]
    kc = torch.randn(slots, nkv, d, generator=g).to(dtype)
    vc = torch.randn(slots, nkv, d, generator=g).to(dtype)
    return x, w, pos, emb.cos(), emb.sin(), kc, vc, loc


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,nq,nkv,d,k,launch", [
    (1, 2, 1, 32, 64, G.GemvConfig(block_n=32, block_k=32)),      # one program a head
    (3, 4, 2, 64, 70, G.GemvConfig(block_n=32, block_k=32)),      # ragged K, two a head
    (8, 2, 2, 64, 96, G.GemvConfig(block_n=64, block_k=64)),
    (16, 1, 1, 32, 33, G.GemvConfig(block_n=32, block_k=16)),     # MAX_M rows, K past a tile
])
def test_kernel_matches_the_reference(dtype, m, nq, nkv, d, k, launch):
    x, w, pos, cos, sin, kc, vc, loc = case(m, nq, nkv, d, k, dtype, seed=m + d)
    kr, vr = kc.clone(), vc.clone()
    want = QR.qkv_rope_ref(x, w, launch, pos, cos, sin, nq, nkv, kr, vr, loc)
    got = QR._qkv_rope_triton(x, w, launch, pos, cos, sin, nq, nkv, kc, vc, loc)
    assert got.shape == (m, nq, d) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **tol(dtype))
    torch.testing.assert_close(kc.float(), kr.float(), **tol(dtype))     # written rows, and
    torch.testing.assert_close(vc.float(), vr.float(), **tol(dtype))     # the rest untouched
    other = torch.ones(kc.shape[0], dtype=torch.bool)
    other[loc] = False
    assert torch.equal(kc[other], kr[other]) and torch.equal(vc[other], vr[other])


def test_without_out_loc_only_q_is_computed():
    x, w, pos, cos, sin, kc, vc, _ = case(2, 4, 2, 32, 64, torch.float32, seed=9)
    launch = G.GemvConfig(block_n=32, block_k=32)
    before = (kc.clone(), vc.clone())
    got = QR._qkv_rope_triton(x, w, launch, pos, cos, sin, 4, 2, kc, vc, None)
    want = QR.qkv_rope_ref(x, w, launch, pos, cos, sin, 4, 2, None, None, None)
    torch.testing.assert_close(got, want, **tol(torch.float32))
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_fits_names_the_launches_the_kernel_takes():
    rope = QR.RopeShape(nq=32, nkv=8, head_dim=128)
    assert QR.fits(G.GemvConfig(32, 256), rope) and QR.fits(G.GemvConfig(64, 128), rope)
    assert QR.fits(G.GemvConfig(128, 64), rope)                  # 64 dims: half a head
    assert not QR.fits(G.GemvConfig(16, 256), rope)              # 8 dims: under a dot tile
    assert not QR.fits(G.GemvConfig(32, 256, split_k=2), rope)   # the epilogue needs the sum
    assert not QR.fits(G.GemvConfig(256, 64), rope)              # more than half a head
    x, w, pos, cos, sin, kc, vc, loc = case(1, 2, 1, 32, 64, torch.float32)
    with pytest.raises(ValueError, match="does not fit"):
        QR._qkv_rope_triton(x, w, G.GemvConfig(16, 32), pos, cos, sin, 2, 1, kc, vc, loc)


def test_qkv_rope_off_the_plan_runs_gemm_then_rope(monkeypatch):
    """CPU tensors (and no launch) never reach the kernel: the GEMM, then rope_qkv_cache."""
    monkeypatch.setattr(QR, "_qkv_rope_triton", lambda *a: pytest.fail("kernel called"))
    x, w, pos, cos, sin, kc, vc, loc = case(3, 2, 1, 32, 64, torch.float32, seed=4)
    kr, vr = kc.clone(), vc.clone()
    want = QR.qkv_rope_ref(x, w, None, pos, cos, sin, 2, 1, kr, vr, loc)
    for launch in (None, G.GemvConfig(32, 32)):
        got = QR.qkv_rope(x, w, launch, pos, cos, sin, 2, 1, kc, vc, loc)
        assert torch.equal(got, want) and torch.equal(kc, kr) and torch.equal(vc, vr)


# Compiled in a fresh interpreter without TRITON_INTERPRET: this process's interpreter patches
# triton.language in ways a compile of this kernel's 2-D index arithmetic trips over.
_SM90 = """
import json, sys, tempfile, os
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from mtplab.kernels import qkv_rope as QR
sig, const, warps = json.loads(sys.argv[1])
k = QR._gemv_rope_kernel
k = k.real() if hasattr(k, "real") else k
with tempfile.TemporaryDirectory() as cache:
    os.environ["TRITON_CACHE_DIR"] = cache
    src = ASTSource(fn=k, signature={**sig, **{c: "constexpr" for c in const}}, constexprs=const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": warps}).asm["ptx"]
print(json.dumps({"mma": "mma.sync" in ptx or "wgmma" in ptx, "local": ".local" in ptx}))
"""


@pytest.mark.parametrize("nq,nkv,half,block_h,block_k,warps", [
    (16, 8, 128, 16, 256, 4),       # a Gemma-4 sliding layer at the 32x256 launch
    (16, 2, 256, 32, 128, 4),       # a global layer at 64x128
    (32, 8, 64, 32, 256, 8),        # llama3-8b at 64x256 w8
])
def test_kernel_compiles_for_sm90_with_tensor_core_dots(nq, nkv, half, block_h, block_k, warps):
    """Compiled ahead of time for an H100 at decode shapes (bf16): both accumulators' dots
    are tensor-core MMAs, and nothing spills to local memory."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip("this Triton install has no CUDA backend.")
    ptrs = {n: "*bf16" for n in ("X", "W", "Q", "KC", "VC")}
    sig = {**ptrs, "Pos": "*i64", "Cos": "*fp32", "Sin": "*fp32", "Loc": "*i64", "M": "i32",
           "K": "i32", **{s: "i32" for s in ("stride_xm", "stride_wn", "stride_cos",
                                              "stride_sin", "stride_qt", "stride_qh",
                                              "stride_kn", "stride_kh", "stride_vn",
                                              "stride_vh")}}
    const = dict(NQ=nq, NKV=nkv, HALF=half, BLOCK_M=G.MAX_M, BLOCK_H=block_h, BLOCK_K=block_k,
                 UPCAST=False)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", _SM90, json.dumps([sig, const, warps])],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"mma": True, "local": False}
