"""Triton paged attention (default and deterministic kernels) vs the torch reference on CUDA
(compiled kernels, no interpreter), at serving-like shapes, plus CUDA-graph capture/replay of
the call."""
from __future__ import annotations

import random

import pytest
import torch

from mtplab.nogc import gc_paused
from mtplab.kernels.triton_attention import paged_attention_triton
# tests/ is on sys.path (rootdir conftest, pytest's default prepend import mode)
from tests.kernels.test_triton_attention import check, make_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def lens(bs: int, max_q: int, seed: int) -> tuple[list[int], list[int]]:
    """bs lanes: q_len in [1, max_q], kv_len in [q_len, 2000] (prefix 0 .. 2000 - q_len)."""
    rng = random.Random(seed)
    q_lens = [rng.randint(1, max_q) for _ in range(bs)]
    return q_lens, kv_lens_for(q_lens, seed)


def kv_lens_for(q_lens: list[int], seed: int) -> list[int]:
    rng = random.Random(seed + 1000)
    return [ql + rng.randint(0, 2000 - ql) for ql in q_lens]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,Hq,Hkv", [(64, 8, 2), (128, 4, 4), (128, 32, 8)])
@pytest.mark.parametrize("window", [0, 256])
def test_decode(dtype, d, Hq, Hkv, window):
    _, kv_lens = lens(32, 1, seed=d + Hq)
    check(make_case([1] * 32, kv_lens, Hq=Hq, Hkv=Hkv, d=d, page=16, dtype=dtype,
                    device="cuda"), window, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d,Hq,Hkv", [(64, 8, 2), (128, 4, 4), (128, 12, 4)])
@pytest.mark.parametrize("window", [0, 256])
def test_extend(dtype, d, Hq, Hkv, window):
    q_lens, kv_lens = lens(32, 100, seed=d + Hq + 1)
    check(make_case(q_lens, kv_lens, Hq=Hq, Hkv=Hkv, d=d, page=16, dtype=dtype,
                    max_q=128, device="cuda"), window, atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("Q,window", [(8, 0), (16, 64)])
def test_tree(dtype, Q, window):
    _, kv_lens = lens(32, 1, seed=Q)
    kv_lens = [max(k, Q) for k in kv_lens]
    check(make_case([Q] * 32, kv_lens, Hq=8, Hkv=2, d=128, page=16, tree=True, dtype=dtype,
                    device="cuda"), window, atol=TOL[dtype])


@pytest.mark.parametrize("det", [False, True])  # default kernels, deterministic kernel
@pytest.mark.parametrize("max_q", [1, 8])      # decode kernel, extend kernel
def test_cuda_graph_replay_matches_eager(max_q, det):
    q_lens, kv_lens = lens(32, max_q, seed=7)
    q, k, v, meta = make_case(q_lens, kv_lens, Hq=8, Hkv=2, d=128, page=16,
                              dtype=torch.bfloat16, max_q=max_q, max_kv=2000, device="cuda")
    scale = 128 ** -0.5
    paged_attention_triton(q, k, v, meta, scale, 256, det)     # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        out = paged_attention_triton(q, k, v, meta, scale, 256, det)

    # New contents in every captured input (same q_lens, hence same T and cu_q).
    new = make_case(q_lens, kv_lens_for(q_lens, seed=8), Hq=8, Hkv=2, d=128, page=16,
                    dtype=torch.bfloat16, max_q=max_q, max_kv=2000, device="cuda", seed=1)
    for dst, src in zip((q, k, v), new[:3]):
        dst.copy_(src)
    for f in ("table", "rows", "kv_lens", "positions"):
        getattr(meta, f).copy_(getattr(new[3], f))
    graph.replay()
    torch.cuda.synchronize()
    eager = paged_attention_triton(q, k, v, meta, scale, 256, det)
    assert torch.equal(out, eager)
    check((q, k, v, meta), 256, atol=TOL[torch.bfloat16])


# ---- long rows: split-KV (the row cut in parts + the reduce pass) ------------------------

def long_case(kind: str, dtype, d=128, Hq=32, Hkv=8, kv_lens=(9000, 33000), seed=0):
    Q = {"decode": 1, "tree": 8, "shared": 4}[kind]
    return make_case([Q] * len(kv_lens), list(kv_lens), Hq=Hq, Hkv=Hkv, d=d, page=16,
                     tree=kind == "tree", kv_shared=kind == "shared", dtype=dtype,
                     device="cuda", seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["decode", "tree", "shared"])
@pytest.mark.parametrize("window", [0, 1024])
def test_long_rows_split(dtype, kind, window):
    """Paged (shuffled pages of 16), windowed and tree lanes at 9k and 33k entries: the split
    plan of the engine (auto) and explicit ones, against the reference."""
    check(long_case(kind, dtype), window, atol=TOL[dtype], splits=(None, 1, 7, 40))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_long_rows_head_dim_256(dtype):
    # the gemma presets' head shape: 32 q / 16 kv heads of 256
    check(long_case("tree", dtype, d=256, Hq=32, Hkv=16, kv_lens=(5000, 20000)), 1024,
          atol=TOL[dtype], splits=(None, 3))


@pytest.mark.parametrize("kind", ["decode", "tree", "shared"])
def test_sliding_window_reads_only_the_window_at_long_context(kind):
    """V before the window is NaN: a single load of it would poison the output."""
    q, k, v, meta = long_case(kind, torch.bfloat16)
    window, scale = 1024, 128 ** -0.5
    ref = paged_attention_triton(q, k, v, meta, scale, window)
    for b in range(meta.batch_size):
        pos = meta.positions[meta.cu_q[b]:meta.cu_q[b + 1]]
        v[meta.table[meta.rows[b], :int(pos.min()) - window + 1].long()] = float("nan")
    for splits in (None, 1, 9):
        out = paged_attention_triton(q, k, v, meta, scale, window, num_splits=splits)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref, atol=TOL[torch.bfloat16], rtol=0)


@pytest.mark.parametrize("max_q", [1, 8])
def test_split_plan_is_captured_and_replays(max_q):
    """bs 1 over a 33k-entry row splits in many parts; a captured call replays with new
    lengths (the chunk size is computed on the device)."""
    q, k, v, meta = make_case([max_q], [20000], Hq=32, Hkv=8, d=128, page=16,
                              tree=max_q > 1, dtype=torch.bfloat16, max_kv=33000,
                              device="cuda")
    scale = 128 ** -0.5
    paged_attention_triton(q, k, v, meta, scale)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(graph):
        out = paged_attention_triton(q, k, v, meta, scale)
    meta.kv_lens.fill_(31000)
    meta.positions.add_(11000)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, paged_attention_triton(q, k, v, meta, scale))
    check((q, k, v, meta), 0, atol=TOL[torch.bfloat16])


def test_the_attn_figure_times_each_shape_and_sweeps_the_named_ones(monkeypatch):
    """attention_figures.measure (bench_long_context's attn figure): a cell per shape with its
    split plan, floor and one µs per repeat; the swept shape gets one entry per launch shape
    of SWEEP (two here); the engine's launch tables are left as they were."""
    from mtplab.kernels import triton_attention as ta
    from mtplab.studies.long_context import attention_figures as af
    monkeypatch.setattr(af, "SWEEP", dict(block_n=(32,), warps=(4,), stages=(2, 3),
                                          per_sm=(4,)))
    before = {c: dict(t) for c, t in ta.LAUNCHES.items()}
    cells = af.measure(["llama decode bs1 1k", "llama decode bs1 8k"], ["llama decode bs1 1k"],
                       3.0e12, 2)
    assert [c["shape"] for c in cells] == ["llama decode bs1 1k", "llama decode bs1 8k"]
    assert all(len(c["us"]) == 2 and min(c["us"]) > 0 and c["splits"] >= 1 for c in cells)
    assert cells[0]["floor_us"] == pytest.approx(1024 * 8 * 128 * 4 / 3.0e12 * 1e6)
    assert [r["launch"] for r in cells[0]["sweep"]] == ["32/4/2/4", "32/4/3/4"]
    assert "sweep" not in cells[1]
    assert {c: dict(t) for c, t in ta.LAUNCHES.items()} == before
