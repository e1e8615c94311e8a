"""Batch-invariant kernels (mtplab/kernels/batch_invariant.py, the deterministic attention
kernel) on CPU under the Triton interpreter: each against its plain-torch reference, and the
same row alone and inside bigger batches (M = 1, 8, 33, a tree-verify M = B*D) BIT-IDENTICAL.

The matmul runs both its CPU tiles and the CUDA tiles (passed explicitly): invariance is a
property of the kernel's fixed tiles, which the interpreter reproduces. bf16 is left to
tests/gpu (the interpreter's tl.dot mishandles bf16 operands); fp16 stands in for 16-bit.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mtplab.kernels import batch_invariant as bi
from mtplab.kernels.attention_ref import paged_attention_ref
from mtplab.kernels.attn_meta import AttnMeta
from mtplab.kernels.triton_attention import paged_attention_triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CONFIGS = {"cpu_tiles": None} if DEVICE == "cuda" else {
    "cpu_tiles": None,
    "cuda_fp32_tiles": bi.mm_config(torch.float32, "cuda"),
    "cuda_16bit_tiles": bi.mm_config(torch.float16, "cuda")}
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def rows_invariant(fn, x: torch.Tensor, sizes=(1, 8, 33)) -> None:
    """fn(x[:m]) row r == fn(x) row r bit for bit, for every m (row r < m), and a row
    moved to another place of the batch gives the same bits."""
    full = fn(x)
    for m in (s for s in sizes if s < len(x)):
        part = fn(x[:m])
        assert torch.equal(part, full[:m]), f"rows of a batch of {m} differ from {len(x)}'s"
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1)).to(x.device)
    assert torch.equal(fn(x[perm]), full[perm]), "a row's bits depend on its place in the batch"


# -- matmul ------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", list(CONFIGS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_matches_torch_and_is_batch_invariant(cfg, dtype):
    config = CONFIGS[cfg]
    K, N = 160, 72                                   # ragged against every tile size
    w = rand(N, K, dtype=dtype, seed=1)              # nn.Linear layout: x @ w.T (strided)
    x = rand(33, K, dtype=dtype, seed=2)
    out = bi.matmul(x, w.t(), config)
    ref = x.double() @ w.double().t()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref, atol=tol * K ** 0.5, rtol=tol)
    assert out.dtype == dtype
    rows_invariant(lambda a: bi.matmul(a, w.t(), config), x)


def test_matmul_tree_verify_shape_equals_decode_rows():
    """M = B*D (verify) vs M = B (decode): the same rows give the same bits."""
    B, D, K, N = 4, 5, 128, 96
    w = rand(K, N, seed=3)
    nodes = rand(B * D, K, seed=4)
    verify = bi.matmul(nodes, w)
    decode = bi.matmul(nodes.view(B, D, K)[:, 2].contiguous(), w)
    assert torch.equal(verify.view(B, D, N)[:, 2], decode)


def test_matmul_degenerate_shapes():
    assert bi.matmul(rand(0, 8), rand(8, 4)).shape == (0, 4)
    assert torch.equal(bi.matmul(rand(3, 0), rand(0, 4)), torch.zeros(3, 4, device=DEVICE))


# -- row reductions ------------------------------------------------------------------------
# N = 1500: several blocks per row (BLOCK 1024, a ragged tail)
@pytest.mark.parametrize("dtype,N", [(dt, 48) for dt in DTYPES] + [(torch.float32, 1500)])
def test_row_mean_and_softmax_match_torch_and_are_batch_invariant(dtype, N):
    x = rand(33, N, dtype=dtype, seed=5) * 4
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(bi.row_mean(x, -1, True).float(),
                               x.float().mean(-1, keepdim=True), **tol)
    torch.testing.assert_close(bi.row_softmax(x, -1, log=True).float(),
                               torch.log_softmax(x.float(), -1), **tol)
    torch.testing.assert_close(bi.row_softmax(x, -1, log=False).float(),
                               torch.softmax(x.float(), -1), **tol)
    rows_invariant(lambda a: bi.row_mean(a, -1), x)
    rows_invariant(lambda a: bi.row_softmax(a, -1, log=True), x)
    rows_invariant(lambda a: bi.row_softmax(a, -1, log=False), x)


def test_row_reductions_other_dims_and_edge_rows():
    x = rand(5, 7, 9, seed=6)
    torch.testing.assert_close(bi.row_mean(x, 1, False), x.mean(1))
    torch.testing.assert_close(bi.row_softmax(x, 0, log=False), torch.softmax(x, 0))
    inf = torch.tensor([[float("-inf"), 0.0, 1.0], [float("-inf")] * 3], device=DEVICE)
    torch.testing.assert_close(bi.row_softmax(inf[:1], -1, log=False), torch.softmax(inf[:1], -1))
    assert torch.equal(bi.row_softmax(inf[1:], -1, log=False).isnan(),
                       torch.softmax(inf[1:], -1).isnan())


# -- the aten scope ------------------------------------------------------------------------
def test_scope_routes_aten_and_restores_torch_after():
    x, w, b = rand(9, 40, seed=7), rand(24, 40, seed=8), rand(24, seed=9)
    native = F.linear(x, w, b)
    with bi.batch_invariant_mode(DEVICE):
        with bi.batch_invariant_mode(DEVICE):          # nests
            assert bi.is_active()
        assert bi.is_active()
        assert torch.equal(F.linear(x, w), bi.matmul(x, w.t()))          # aten::mm
        assert torch.equal(F.linear(x, w, b), bi.matmul(x, w.t()) + b)   # aten::addmm
        assert torch.equal(x.pow(2).mean(-1, keepdim=True), bi.row_mean(x.pow(2), -1, True))
        assert torch.equal(torch.log_softmax(x, -1), bi.row_softmax(x, -1, log=True))
        assert torch.equal(torch.softmax(x.half(), -1, dtype=torch.float32),
                           bi.row_softmax(x.half(), -1, False, torch.float32))
        ints = torch.ones(2, 3, dtype=torch.long, device=DEVICE)          # torch's out= path
        assert torch.equal(ints @ ints.t(), torch.full((2, 2), 3, device=DEVICE))
        torch.testing.assert_close(x.mean((0, 1)), x.double().mean().float())
    assert not bi.is_active()
    assert torch.equal(F.linear(x, w, b), native)


# -- attention: decode == prefill == tree verify for the same position ------------------------
def _attn_case(S: int, window: int, Hq=4, Hkv=2, d=32, dtype=torch.float32):
    """One token sequence of S + 4 positions (keys/values/queries), laid out three ways:
    decode lanes (one query each, consecutive entries, in a batch with other lanes), one
    prefill lane over the whole sequence, and a tree-verify lane where the sequence's last 4
    tokens are the path 0 -> 2 -> 3 -> 5 of a 6-node tree (siblings interleaved between them).
    Returns {layout: out rows of the 4 path positions} ([4, Hq, d] each)."""
    g = torch.Generator().manual_seed(S + window)
    P = S + 4
    kseq, vseq = torch.randn(P, Hkv, d, generator=g), torch.randn(P, Hkv, d, generator=g)
    qseq = torch.randn(P, Hq, d, generator=g)
    scale, res = d ** -0.5, {}

    def run(table, lanes, k, v, q, positions, tree=None, max_q=1):
        """lanes: (row, kv_len, q_len) per lane; cache slots = table entries."""
        rows = torch.tensor([r for r, _, _ in lanes])
        kv_lens = torch.tensor([n for _, n, _ in lanes], dtype=torch.int32)
        q_lens = torch.tensor([ql for _, _, ql in lanes])
        cu_q = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)])
        meta = AttnMeta(table.to(DEVICE), rows.to(DEVICE), kv_lens.to(DEVICE), q_lens.to(DEVICE),
                        cu_q.to(DEVICE), positions.to(DEVICE), max_q, int(kv_lens.max()),
                        None if tree is None else tree.to(DEVICE))
        args = (q.to(DEVICE, dtype), k.to(DEVICE, dtype), v.to(DEVICE, dtype), meta, scale, window)
        out = paged_attention_triton(*args, deterministic=True)
        ref = paged_attention_ref(*args)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)
        return out

    # decode: lane r holds the sequence up to position S + r at consecutive slots of a
    # shuffled cache; two unrelated lanes ride along (other rows, other lengths).
    W = P + 8
    perm = torch.randperm(6 * W, generator=g)
    table = perm.view(6, W).to(torch.int32)
    k = torch.randn(6 * W, Hkv, d, generator=g)
    v = torch.randn(6 * W, Hkv, d, generator=g)
    slots = table[0, :P].long()
    k[slots], v[slots] = kseq, vseq
    lanes, qs, pos = [], [], []
    for r in range(4):
        lanes.append((0, S + r + 1, 1))
        qs.append(qseq[S + r:S + r + 1])
        pos.append(S + r)
        if r == 1:
            lanes.append((3, 17, 1))
            qs.append(torch.randn(1, Hq, d, generator=g))
            pos.append(16)
    out = run(table, lanes, k, v, torch.cat(qs), torch.tensor(pos))
    res["decode"] = out[torch.tensor([0, 1, 3, 4])]
    alone = run(table, [(0, S + 3, 1)], k, v, qseq[S + 2:S + 3], torch.tensor([S + 2]))
    res["decode_alone"] = torch.cat([res["decode"][:2], alone, res["decode"][3:]])

    # prefill: the whole sequence as one extend lane, plus a short lane in front of it.
    out = run(table, [(3, 5, 5), (0, P, P)], k, v,
              torch.cat([torch.randn(5, Hq, d, generator=g), qseq]),
              torch.cat([torch.arange(5), torch.arange(P)]), max_q=P)
    res["prefill"] = out[5 + S:5 + P]

    # tree verify: prefix S at row 1, nodes at entries S + j; path nodes 0, 2, 3, 5.
    parents = [-1, 0, 0, 2, 1, 3]
    depth = [0, 1, 1, 2, 2, 3]
    D = len(parents)
    mask = torch.zeros(D, D, dtype=torch.bool)
    for i in range(D):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    tslots = table[1, :S + D].long()
    k[tslots[:S]], v[tslots[:S]] = kseq[:S], vseq[:S]
    qt = torch.randn(2 * D, Hq, d, generator=g)           # lane 0: another tree
    for node, dpt in zip((0, 2, 3, 5), range(4)):
        k[tslots[S + node]], v[tslots[S + node]] = kseq[S + dpt], vseq[S + dpt]
        qt[D + node] = qseq[S + dpt]
    positions = torch.cat([10 + torch.tensor(depth), S + torch.tensor(depth)])
    out = run(table, [(4, 10 + D, D), (1, S + D, D)], k, v, qt, positions,
              tree=torch.stack([mask, mask]), max_q=D)
    res["tree"] = out[D + torch.tensor([0, 2, 3, 5])]
    return res


@pytest.mark.parametrize("S,window,dtype", [
    (9, 0, torch.float32), (70, 0, torch.float32), (70, 16, torch.float32),
    (70, 16, torch.float16),
    pytest.param(130, 64, torch.float32, marks=pytest.mark.slow)] +
    [(70, 16, dt) for dt in DTYPES[2:]])
def test_attention_same_position_same_bits_across_layouts(S, window, dtype):
    """S = 70, 130: the path straddles a BLOCK_N boundary (64) / several key blocks; window 16
    starts the blocks off 0; 64 = BLOCK_N."""
    res = _attn_case(S, window, dtype=dtype)
    for name in ("decode_alone", "prefill", "tree"):
        assert torch.equal(res[name], res["decode"]), f"{name} != decode"

