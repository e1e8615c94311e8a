"""Triton paged attention (default and deterministic kernels) vs the torch reference on CPU
(TRITON_INTERPRET=1, see conftest.py). Batch invariance of the deterministic kernel: tests/
kernels/test_deterministic_kernels.py.

Shapes are tiny: the interpreter runs every program in Python. On a CUDA machine the same cases
run compiled on the GPU (the interpreter is off there, and Triton cannot read CPU tensors).
"""
from __future__ import annotations

import pytest
import torch

from mtplab.kernels.attention_ref import paged_attention_ref
from mtplab.kernels.attn_meta import AttnMeta
from mtplab.kernels.triton_attention import paged_attention_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_tree_mask(Q: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tree of Q nodes (node 0 is the root, parents precede children).
    Returns (mask [Q,Q]: node i sees its ancestors and itself, depth [Q])."""
    mask = torch.zeros(Q, Q, dtype=torch.bool)
    depth = torch.zeros(Q, dtype=torch.long)
    mask[0, 0] = True
    for i in range(1, Q):
        p = int(torch.randint(0, i, (1,), generator=gen))
        mask[i] = mask[p]
        mask[i, i] = True
        depth[i] = depth[p] + 1
    return mask, depth


def make_case(q_lens, kv_lens, *, Hq=4, Hkv=1, d=32, page=4, tree=False, dtype=torch.float32,
              max_q=None, max_kv=None, device=DEVICE, seed=0, kv_shared=False):
    """Random q / paged KV cache / AttnMeta. Pages come from a random permutation, and lanes map
    to shuffled rows of the table, so every indirection is exercised."""
    gen = torch.Generator().manual_seed(seed)
    B = len(q_lens)
    max_q = max_q or max(max(q_lens), 1)
    max_kv = max_kv or max(kv_lens)
    pages_per_row = -(-max_kv // page)
    R = B + 2                                                   # spare rows: rows[b] != b
    perm = torch.randperm(R * pages_per_row, generator=gen).view(R, pages_per_row)
    j = torch.arange(pages_per_row * page)
    table = (perm[:, j // page] * page + j % page).to(torch.int32)
    rows = torch.randperm(R, generator=gen)[:B]
    N = R * pages_per_row * page
    T = sum(q_lens)
    q = torch.randn(T, Hq, d, generator=gen)
    k_cache = torch.randn(N, Hkv, d, generator=gen)
    v_cache = torch.randn(N, Hkv, d, generator=gen)
    q_lens_t = torch.tensor(q_lens)
    kv_lens_t = torch.tensor(kv_lens, dtype=torch.int32)
    cu_q = torch.zeros(B + 1, dtype=torch.long)
    cu_q[1:] = q_lens_t.cumsum(0)
    prefix = kv_lens_t.long() - (0 if kv_shared else q_lens_t)
    tree_mask = None
    if tree:
        assert all(ql == max_q for ql in q_lens), "tree lanes all have q_len == max_q"
        masks, depths = zip(*(random_tree_mask(max_q, gen) for _ in range(B)))
        tree_mask = torch.stack(masks)
        positions = torch.cat([prefix[b] + depths[b] for b in range(B)])
    elif kv_shared:     # a draft step's branches: all at the row's last position
        positions = torch.cat([torch.full((q_lens[b],), int(prefix[b]) - 1) for b in range(B)])
    else:
        positions = torch.cat([prefix[b] + torch.arange(q_lens[b]) for b in range(B)])
    meta = AttnMeta(table=table, rows=rows, kv_lens=kv_lens_t, q_lens=q_lens_t, cu_q=cu_q,
                    positions=positions, max_q=max_q, max_kv=max_kv, tree_mask=tree_mask,
                    kv_shared=kv_shared)
    moved = {f: getattr(meta, f).to(device) for f in
             ("table", "rows", "kv_lens", "q_lens", "cu_q", "positions")}
    meta = AttnMeta(**moved, max_q=max_q, max_kv=max_kv,
                    tree_mask=None if tree_mask is None else tree_mask.to(device),
                    kv_shared=kv_shared)
    return (q.to(device, dtype), k_cache.to(device, dtype), v_cache.to(device, dtype), meta)


def check(case, window=0, atol=1e-4, splits=(None,)):
    """Both kernels families (default, with each split count, and deterministic) against the
    reference."""
    q, k, v, meta = case
    scale = q.shape[-1] ** -0.5
    ref = paged_attention_ref(q, k, v, meta, scale, window)
    runs = [dict(num_splits=n) for n in splits] + [dict(deterministic=True)]
    for kw in runs:
        out = paged_attention_triton(q, k, v, meta, scale, window, **kw)
        assert out.shape == ref.shape and out.dtype == q.dtype
        torch.testing.assert_close(out.float(), ref.float(), atol=atol, rtol=atol,
                                   msg=lambda m, kw=kw: f"{kw}: {m}")


# ---- decode (max_q == 1) ------------------------------------------------------------------

@pytest.mark.parametrize("kv_lens,page,Hq,Hkv,d,window", [
    ([37], 1, 4, 1, 32, 0),
    ([37], 16, 2, 2, 64, 0),
    ([5, 70, 23], 4, 4, 1, 32, 0),
    ([5, 70, 23], 16, 4, 1, 32, 9),      # window < kv_len on two lanes
    ([1, 130, 64], 1, 2, 2, 128, 0),
    ([1, 130, 64], 4, 8, 2, 32, 40),
    ([9, 33], 4, 6, 2, 32, 0),           # GQA group of 3 (not a power of two)
])
def test_decode(kv_lens, page, Hq, Hkv, d, window):
    check(make_case([1] * len(kv_lens), kv_lens, Hq=Hq, Hkv=Hkv, d=d, page=page), window)


def test_decode_strided_q_and_padded_max_kv():
    q, k, v, meta = make_case([1, 1], [20, 45], Hq=4, Hkv=2, max_kv=100)
    wide = torch.randn(q.shape[0], 6, q.shape[2], device=q.device)
    wide[:, 1:5] = q
    check((wide[:, 1:5], k, v, meta))                 # q strided over heads


def test_decode_zero_q_lane_writes_nothing():
    # lane 1 has no query: its cu_q points at lane 2's token, which it must not overwrite
    check(make_case([1, 0, 1], [12, 30, 7]))


# ---- split-KV: the row cut in parts + the reduce pass -------------------------------------

@pytest.mark.parametrize("kv_lens,Hq,Hkv,d,window,splits", [
    ([300], 8, 2, 64, 0, (1, 2, 5)),          # chunks of 192 / 64 entries; 5: two empty splits
    ([5, 300, 129], 4, 1, 32, 0, (3, 8)),     # short rows leave splits empty
    ([5, 300, 129], 4, 2, 32, 100, (4,)),     # a window: only [pos - 99, pos] is split
    ([1, 70], 6, 2, 32, 0, (2,)),             # GQA group of 3
])
def test_decode_split(kv_lens, Hq, Hkv, d, window, splits):
    check(make_case([1] * len(kv_lens), kv_lens, Hq=Hq, Hkv=Hkv, d=d, page=16), window,
          splits=splits)


def test_an_eager_step_splits_its_rows_as_its_graph_does():
    """An eager step bounds its rows by the host's max_kv, its graph by the row width W; both
    carry split_kv = W, so they make one split plan and give the same bits."""
    from dataclasses import replace

    from mtplab.kernels.triton_attention import MIN_CHUNK
    W = 3 * MIN_CHUNK
    q, k, v, graph = make_case([1, 1], [40, 70], Hq=4, Hkv=2, page=16, max_kv=W)
    graph = replace(graph, split_kv=W)
    eager = replace(graph, max_kv=70)
    scale = q.shape[-1] ** -0.5
    want = paged_attention_triton(q, k, v, graph, scale)
    assert torch.equal(paged_attention_triton(q, k, v, eager, scale), want)
    # without split_kv the eager bound makes one split (no reduce pass): other rounding
    unplanned = paged_attention_triton(q, k, v, replace(eager, split_kv=0), scale)
    assert not torch.equal(unplanned, want)
    torch.testing.assert_close(unplanned, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("Q,kv_lens,window,splits", [
    (4, [200, 9], 0, (1, 3)),
    (8, [150, 40, 8], 30, (2, 6)),             # the window hides prefix entries, not nodes
])
def test_tree_split(Q, kv_lens, window, splits):
    check(make_case([Q] * len(kv_lens), kv_lens, Hq=4, Hkv=2, tree=True, seed=7), window,
          splits=splits)


@pytest.mark.parametrize("q_lens,kv_lens,window", [([4, 1, 3], [150, 20, 3], 0),
                                                   ([4, 2], [150, 60], 25)])
def test_short_extend_split(q_lens, kv_lens, window):
    # a causal extend whose queries fit one tile (eagle's draft extend) takes the split kernel
    check(make_case(q_lens, kv_lens, Hq=4, Hkv=2), window, splits=(1, 3))


@pytest.mark.parametrize("K,kv_lens,window", [(4, [90, 7, 33], 0), (2, [130, 1], 20)])
def test_kv_shared_branches_read_one_row(K, kv_lens, window):
    # K queries per lane at the row's last position, owning no entry: a draft step's branches
    check(make_case([K] * len(kv_lens), kv_lens, Hq=4, Hkv=2, kv_shared=True), window,
          splits=(1, 3))


@pytest.mark.parametrize("tree", [False, True])
def test_entries_outside_the_window_are_never_loaded(tree):
    """V of every entry before the oldest query's window is NaN: one load of it would make
    the output NaN (0 x NaN), so a finite, correct output shows the kernel never read it."""
    Q = 4 if tree else 1
    q, k, v, meta = make_case([Q, Q], [200, 120], Hq=4, Hkv=2, tree=tree, page=16, seed=3)
    window, scale = 40, q.shape[-1] ** -0.5
    ref = paged_attention_ref(q, k, v, meta, scale, window)
    poisoned = v.clone()
    for b in range(2):
        lo = int(meta.positions[meta.cu_q[b]:meta.cu_q[b + 1]].min()) - window + 1
        slots = meta.table[meta.rows[b], :lo].long()
        poisoned[slots] = float("nan")
    for splits in (1, 3):
        out = paged_attention_triton(q, k, poisoned, meta, scale, window, num_splits=splits)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


# ---- extend / prefill ----------------------------------------------------------------------

@pytest.mark.parametrize("q_lens,kv_lens,Hq,Hkv,d,page,window", [
    ([5], [5], 2, 2, 32, 4, 0),                              # prefix == 0
    ([1, 5, 17], [30, 25, 17], 4, 1, 32, 4, 0),              # mixed q_lens, prefix 29 / 20 / 0
    ([1, 5, 17], [30, 25, 60], 2, 2, 64, 16, 0),
    ([1, 5, 17], [30, 25, 60], 4, 1, 32, 1, 7),              # window < kv_len
    ([17, 3], [90, 40], 2, 1, 128, 4, 20),
    ([70, 2], [100, 2], 1, 1, 32, 4, 0),                     # several query tiles
    ([5, 17], [20, 40], 6, 2, 32, 4, 9),                     # GQA group of 3, padded tile rows
])
def test_extend(q_lens, kv_lens, Hq, Hkv, d, page, window):
    check(make_case(q_lens, kv_lens, Hq=Hq, Hkv=Hkv, d=d, page=page), window)


def test_extend_padded_max_q_and_empty_lane():
    # static max_q above every q_len (padded rows and a fully padded tile), one lane with q_len 0
    check(make_case([3, 0, 6], [10, 4, 33], Hq=2, Hkv=1, max_q=20, max_kv=64))


# ---- tree mask -----------------------------------------------------------------------------

@pytest.mark.parametrize("Q,kv_lens,window,seed", [
    (4, [4, 19], 0, 1),
    (8, [40, 8, 23], 0, 2),
    (8, [40, 8, 23], 10, 3),     # window hides old prefix entries, never tree nodes
    (6, [50], 3, 4),             # window smaller than the tree depth
])
def test_tree(Q, kv_lens, window, seed):
    check(make_case([Q] * len(kv_lens), kv_lens, Hq=4, Hkv=2, tree=True, seed=seed), window)


def test_tree_single_node_uses_extend():
    check(make_case([1, 1], [9, 1], tree=True))


# ---- low precision and errors --------------------------------------------------------------

# fp16 only: the triton 3.9 interpreter's tl.dot multiplies the raw bits of bf16 operands;
# bf16 is covered by tests/gpu/test_triton_attention_gpu.py.
@pytest.mark.parametrize("dtype", [torch.float16])
def test_half_precision(dtype):
    check(make_case([1, 1], [30, 50], Hq=4, Hkv=2, dtype=dtype), atol=2e-2)
    check(make_case([4, 9], [30, 50], Hq=4, Hkv=2, dtype=dtype), window=12, atol=2e-2)


def test_bad_head_dim_raises():
    q, k, v, meta = make_case([1], [4], d=32)
    with pytest.raises(ValueError, match="head_dim"):
        paged_attention_triton(q[..., :24], k[..., :24], v[..., :24], meta, 1.0)


# ---- launch per shape class ---------------------------------------------------------------

def test_the_split_plan_gives_a_16_bit_verify_its_own_launch():
    """A bf16 tree or causal verify at head_dim 128 takes the verify class's launch and its
    longer chunks; a decode, a draft step's shared branches and an fp32 verify the decode
    class's; a head_dim without a verify launch the decode one."""
    from mtplab.kernels import triton_attention as ta
    verify, decode = ta.LAUNCHES["verify"][128], ta.LAUNCHES["decode"][128]
    cases = {  # name: (case, dtype, the launch wanted)
        "tree": (make_case([4], [32768], Hq=4, Hkv=1, d=128, tree=True, device="cpu"),
                 torch.bfloat16, verify),
        "chain": (make_case([4], [32768], Hq=4, Hkv=1, d=128, device="cpu"), torch.bfloat16,
                  verify),
        "fp32": (make_case([4], [32768], Hq=4, Hkv=1, d=128, tree=True, device="cpu"),
                 torch.float32, decode),
        "decode": (make_case([1], [32768], Hq=4, Hkv=1, d=128, device="cpu"), torch.bfloat16,
                   decode),
        "branches": (make_case([4], [32768], Hq=4, Hkv=1, d=128, kv_shared=True,
                               device="cpu"), torch.bfloat16, decode),
        "d64": (make_case([4], [32768], Hq=4, Hkv=1, d=64, tree=True, device="cpu"),
                torch.bfloat16, ta.LAUNCHES["decode"][64]),
    }
    for name, ((q, _, _, meta), dtype, want) in cases.items():
        mode, block_m, launch, ns = ta.split_plan(meta, q.shape[-1], 4, 1, dtype, 132)
        assert launch == want, name
        assert ns == ta.split_count(1, 32768, 132, want), name
    assert ta.split_count(8, 32768, 132, verify) == 32768 // verify.min_chunk   # bs 1, 8 heads
    assert ta.split_count(64, 32768, 132, verify) == 17                          # bs 8


@pytest.mark.parametrize("tree", [True, False])
def test_the_verify_launch_matches_the_reference(tree, monkeypatch):
    """The verify class's launch (BLOCK_N 128, 2 stages, chunks of 1024) over rows of several
    chunks, a ragged tail and shuffled pages. The interpreter's bf16 dots are unreliable, so
    the launch runs fp32 here (as the decode class, which fp32 takes); bf16 on CUDA:
    tests/gpu/test_triton_attention_gpu.py."""
    from mtplab.kernels import triton_attention as ta
    monkeypatch.setitem(ta.LAUNCHES["decode"], 128, ta.LAUNCHES["verify"][128])
    case = make_case([4, 4], [2500, 700], Hq=4, Hkv=2, d=128, page=16, tree=tree, seed=3)
    _, block_m, launch, ns = ta.split_plan(case[3], 128, 2, 2, torch.float32, 132)
    assert launch.block_n == 128 and ns == 3                 # 2500 entries in chunks of 1024
    check(case, splits=(None, 2))
