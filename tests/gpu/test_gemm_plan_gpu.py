"""The decode GEMM plan on CUDA: every candidate launch of the skinny GEMM against F.linear on
decode shapes, `gemv.linear` taking the kernel only for planned few-row GEMMs outside
batch-invariant mode, and the engine measuring its shapes, keeping the plan after close, and
running the planned kernel in its graphs as in eager steps (same tokens)."""
import pytest
import torch
import torch.nn.functional as F

from mtplab import Engine, RunConfig
from mtplab.kernels import gemv as G
from mtplab.kernels import qkv_rope as QR
from mtplab.kernels.batch_invariant import batch_invariant_mode
from mtplab.models import gemm_plan
from tests.helpers import random_prompts

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def rnd(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to("cuda", torch.bfloat16)


@pytest.mark.parametrize("launch", gemm_plan.CANDIDATES, ids=gemm_plan.label)
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 14336), (2816, 4096), (1000, 2816)])
def test_candidates_match_f_linear(launch, n, k):
    w = rnd(n, k, seed=1, scale=k ** -0.5)
    for m in (1, 3, 8):
        x = rnd(m, k, seed=m)
        got = G._gemv_triton(x, w, launch)
        torch.testing.assert_close(got.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("launch", [c for c in gemm_plan.CANDIDATES if c.split_k == 1
                                    and c.block_n >= 32], ids=gemm_plan.label)
@pytest.mark.parametrize("nq,nkv,d,k", [(32, 8, 128, 4096), (16, 8, 256, 2816),
                                        (16, 2, 512, 2816)])
def test_qkv_rope_kernel_matches_gemm_then_rope(launch, nq, nkv, d, k):
    """Decode shapes (llama3-8b, a Gemma-4 sliding and global layer): q and the cache rows
    against rope_qkv_cache_ref(F.linear), rows 1 to 8, with and without the KV write."""
    if not QR.fits(launch, QR.RopeShape(nq, nkv, d)):
        pytest.skip("the launch does not fit these heads")
    w = rnd((nq + 2 * nkv) * d, k, seed=2, scale=k ** -0.5)
    freqs = torch.outer(torch.arange(512.0), 1e-2 * torch.arange(d // 2)).cuda()
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    for m in (1, 3, 8):
        x = rnd(m, k, seed=m)
        pos = torch.randint(0, 512, (m,), device="cuda")
        loc = torch.randperm(64, device="cuda")[:m]
        kc, vc = rnd(64, nkv, d, seed=5), rnd(64, nkv, d, seed=6)
        kr, vr = kc.clone(), vc.clone()
        want = QR.qkv_rope_ref(x, w, launch, pos, cos, sin, nq, nkv, kr, vr, loc)
        got = QR._qkv_rope_triton(x, w, launch, pos, cos, sin, nq, nkv, kc, vc, loc)
        for a, b in ((got, want), (kc, kr), (vc, vr)):
            torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
        q_only = QR._qkv_rope_triton(x, w, launch, pos, cos, sin, nq, nkv, None, None, None)
        torch.testing.assert_close(q_only.float(), want.float(), rtol=2e-2, atol=2e-2)


def test_linear_takes_the_kernel_only_where_planned(monkeypatch):
    calls, real = [], G.gemv
    monkeypatch.setattr(G, "gemv", lambda x, w, c: calls.append(x.shape[0]) or real(x, w, c))
    w, launch = rnd(512, 1024, scale=1 / 32), gemm_plan.CANDIDATES[0]
    for m in (1, G.PLAN_MAX_M, G.PLAN_MAX_M + 1):
        x = rnd(m, 1024, seed=m)
        torch.testing.assert_close(G.linear(x, w, launch).float(), F.linear(x, w).float(),
                                   rtol=2e-2, atol=2e-2)
    assert calls == [1, G.PLAN_MAX_M]
    G.linear(rnd(1, 1024), w, None)
    with batch_invariant_mode("cuda"):
        G.linear(rnd(1, 1024), w, launch)
    assert calls == [1, G.PLAN_MAX_M]


def cfg(**over) -> RunConfig:
    base = dict(model="llama3-8b-like@2", device="cuda", dtype="bfloat16", page_size=16,
                max_running_requests=8, draft="frozen_kv_mtp", overlap=True, zero_bubble=True,
                max_total_tokens=4096, context_len=512)
    return RunConfig(**{**base, **over})


def test_engine_measures_its_shapes_and_keeps_the_plan():
    with Engine(cfg()) as eng:
        rows = eng.gemm_plan
        shapes = {(r["model"], r["n"], r["k"]) for r in rows}
        assert ("target", 6144, 4096) in shapes and ("target", 128256, 4096) in shapes
        assert any(r["model"] == "draft" for r in rows)
        assert all(r["cublas_us"] > 0 and r["triton_us"] > 0 for r in rows)
        chosen = {(r["n"], r["k"]) for r in rows if r["launch"]}
        lm = eng.model.lm_head.gemv
        assert bool(lm) == ((128256, 4096) in chosen)
        eng.check_invariants()
    assert eng.gemm_plan == rows
    for over in (dict(decode_gemm="cublas"), dict(dtype="float32")):
        with Engine(cfg(**over)) as eng:
            assert eng.gemm_plan == [] and not eng.model.lm_head.gemv


def test_planned_kernel_in_graphs_equals_eager(monkeypatch):
    """Every shape planned onto the kernel: the eager steps and the graph replays give the
    same tokens (8 lanes: the graphs' bucket, so both run the same rows)."""
    monkeypatch.setattr(gemm_plan, "_CACHE", {})
    monkeypatch.setattr(gemm_plan, "choose", lambda us: (gemm_plan.CANDIDATES[0], 1.0))
    calls, real, real_rope = [], G._gemv_triton, QR._qkv_rope_triton
    monkeypatch.setattr(G, "_gemv_triton", lambda *a: calls.append("gemv") or real(*a))
    monkeypatch.setattr(QR, "_qkv_rope_triton", lambda *a: calls.append("qkv_rope") or
                        real_rope(*a))
    prompts = random_prompts(8, [20, 33], 128000, seed=5)
    outs = {}
    for graphs in (False, True):
        with Engine(cfg(cuda_graphs=graphs)) as eng:
            assert all(r["launch"] for r in eng.gemm_plan)
            assert any(r["epilogue"] == "rope" for r in eng.gemm_plan)
            outs[graphs] = eng.generate(prompts, 24, ignore_eos=True)
            eng.check_invariants()
    assert set(calls) == {"gemv", "qkv_rope"}      # the kernels ran (eager, and captured)
    assert outs[True] == outs[False]
