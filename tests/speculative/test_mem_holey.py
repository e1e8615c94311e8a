"""Holey draft KV layout (mtplab/speculative/draft_kv.py) against plain-Python references."""
import math

import pytest
import torch

from mtplab.kernels.attention_ref import paged_attention_ref
from mtplab.kernels.attn_meta import AttnMeta
from mtplab.speculative.draft_kv import (branch_table, draft_entries, draft_slots,
                                         duplicate_prefix_tail,
                              prefix_tail_moves)
from mtplab.mem.sizing import alloc_len_per_decode, row_width


def ref_layout(seq_len, S, K, P):
    """-> (draft entries [K][S], holes {t: [entries]}, tail entries, region end)."""
    last = seq_len % P
    base = seq_len - last
    R = math.ceil((last + S) / P) * P
    drafts = [[base + t * R + last + s for s in range(S)] for t in range(K)]
    holes = {t: [base + t * R + j for j in range(last)] for t in range(1, K)}
    return drafts, holes, list(range(base, base + last)), base + K * R


def sizes(S, K, P, context_len=200):
    D = S + 1 if K == 1 else S * K + 1
    alloc = alloc_len_per_decode(speculative=True, num_steps=S, topk=K, num_draft_tokens=D,
                                 page_size=P, draft_owns_kv=True)
    return alloc, row_width(context_len, alloc, D, P)


def make_rows(g, B, W):
    """req_to_token [B+1, W] of distinct random slots (row 0 = padding), rows = 1..B shuffled."""
    table = torch.randperm((B + 1) * W, generator=g).to(torch.int32).view(B + 1, W)
    return table, torch.randperm(B, generator=g) + 1


def test_reference_example():
    # seq_len 37, P 16, S 3: last 5, base 32, N 1; branch 1 holes 48..52, drafts 53..55
    e = draft_entries(torch.tensor([37]), num_steps=3, topk=4, page_size=16)
    assert e[0, 1].tolist() == [53, 54, 55] and e[0, 3].tolist() == [85, 86, 87]
    assert ref_layout(37, 3, 4, 16)[1][1] == [48, 49, 50, 51, 52]


@pytest.mark.parametrize("P,K,S", [(16, 4, 3), (4, 3, 5), (2, 2, 1), (8, 2, 8), (64, 4, 5)])
def test_slot_formula(P, K, S):
    g = torch.Generator().manual_seed(P + K + S)
    B = 9
    seq = torch.tensor([q * P + r for q in (1, 3, 7) for r in (0, 1, P - 1)])
    _, W = sizes(S, K, P)
    table, rows = make_rows(g, B, W)
    entries = draft_entries(seq, S, K, P)
    slots = draft_slots(table, rows, seq, S, K, P)
    for b in range(B):
        drafts, _, _, _ = ref_layout(int(seq[b]), S, K, P)
        assert entries[b].tolist() == drafts
        assert slots[b].tolist() == [[int(table[rows[b], e]) for e in row] for row in drafts]


@pytest.mark.parametrize("P,K,S", [(1, 4, 3), (16, 1, 3), (1, 1, 5), (4, 1, 7)])
def test_degenerates_to_linear(P, K, S):
    seq = torch.arange(1, 40)
    e = draft_entries(seq, S, K, P)
    t = torch.arange(K)[None, :, None]
    s = torch.arange(S)[None, None, :]
    assert torch.equal(e, seq[:, None, None] + t * S + s)
    src, dst, valid = prefix_tail_moves(torch.zeros(40, 64, dtype=torch.int32),
                                        torch.arange(1, 40), seq, S, K, P)
    assert valid.sum() == 0 and src.numel() == (K - 1) * (P - 1) * 39


@pytest.mark.parametrize("P,K,S", [(16, 4, 3), (4, 3, 5), (8, 2, 2)])
def test_duplicate_prefix_tail_writes_only_holes(P, K, S):
    g = torch.Generator().manual_seed(31 * P + K)
    seq = torch.tensor([5 * P, 5 * P + 1, 5 * P + P - 1, 2 * P + P // 2, P + 3])
    B = seq.shape[0]
    _, W = sizes(S, K, P)
    table, rows = make_rows(g, B, W)
    N = (B + 1) * W
    kv_k = torch.randn(2, N, 2, 4, generator=g)
    kv_v = torch.randn(2, N, 2, 4, generator=g)
    k_old, v_old = kv_k.clone(), kv_v.clone()
    duplicate_prefix_tail(kv_k, kv_v, table, rows, seq, S, K, P)
    changed = (kv_k != k_old).flatten(2).any(-1).any(0)               # [N] slots written
    expect = torch.zeros(N, dtype=torch.bool)
    _, _, valid = prefix_tail_moves(table, rows, seq, S, K, P)
    for b in range(B):
        _, holes, tail, _ = ref_layout(int(seq[b]), S, K, P)
        row = table[rows[b]].long()
        for t, hole in holes.items():
            assert len(hole) == int(seq[b]) % P == int(valid[b, t - 1].sum())
            for h, src in zip(hole, tail):
                expect[row[h]] = True
                assert torch.equal(kv_k[:, row[h]], k_old[:, row[src]])
                assert torch.equal(kv_v[:, row[h]], v_old[:, row[src]])
    assert torch.equal(changed, expect)
    assert torch.equal((kv_v != v_old).flatten(2).any(-1).any(0), expect)


@pytest.mark.parametrize("P", [1, 2, 4, 16, 64])
@pytest.mark.parametrize("K", [1, 2, 4])
@pytest.mark.parametrize("S", [1, 3, 5])
def test_footprint_fits_alloc_len_and_row(P, K, S):
    context_len = 300
    alloc, W = sizes(S, K, P, context_len)
    seq = torch.arange(max(1, context_len - 2 * P - 3), context_len + 1)
    e = draft_entries(seq, S, K, P)
    for b, sl in enumerate(seq.tolist()):
        _, _, _, end = ref_layout(sl, S, K, P)
        if K == 1:      # linear: one branch, drafts at sl + s (its page end is not used)
            end = sl + S
        assert int(e[b].max()) < end <= sl + alloc
        assert end <= W


@pytest.mark.parametrize("P,K,S", [(4, 3, 3), (16, 2, 4), (1, 3, 2), (8, 1, 3)])
def test_branch_table_attention_equals_reference(P, K, S):
    """Draft step s of branch t through branch_table sees prefix + own drafts 0..s only."""
    g = torch.Generator().manual_seed(P * 7 + K * 3 + S)
    seq = torch.tensor([3 * P, 3 * P + 1, 4 * P - 1 if P > 1 else 7, 2 * P + P // 2 + 1])
    B = seq.shape[0]
    _, W = sizes(S, K, P, context_len=64)
    table, rows = make_rows(g, B, W)
    Nslots, Hq, Hkv, d = (B + 1) * W, 4, 2, 8
    kv_k = torch.randn(1, Nslots, Hkv, d, generator=g)
    kv_v = torch.randn(1, Nslots, Hkv, d, generator=g)
    duplicate_prefix_tail(kv_k, kv_v, table, rows, seq, S, K, P)
    bt = branch_table(table, rows, seq, S, K, P, W)
    assert bt.shape == (B * K, W) and bt.dtype == table.dtype
    slots = draft_slots(table, rows, seq, S, K, P)
    lanes = B * K
    for s in range(S):
        q = torch.randn(lanes, Hq, d, generator=g)
        kv_lens = (seq + s + 1).repeat_interleave(K)
        meta = AttnMeta(table=bt, rows=torch.arange(lanes), kv_lens=kv_lens,
                        q_lens=torch.ones(lanes, dtype=torch.long),
                        cu_q=torch.arange(lanes + 1), positions=kv_lens - 1, max_q=1,
                        max_kv=int(seq.max()) + S)
        out = paged_attention_ref(q, kv_k[0], kv_v[0], meta, sm_scale=d ** -0.5)
        for b in range(B):
            prefix = table[rows[b], : int(seq[b])].long()
            for t in range(K):
                keys = torch.cat([prefix, slots[b, t, : s + 1]])
                k = kv_k[0, keys].repeat_interleave(Hq // Hkv, dim=1)       # [n, Hq, d]
                v = kv_v[0, keys].repeat_interleave(Hq // Hkv, dim=1)
                lane = b * K + t
                w = torch.softmax(torch.einsum("hd,nhd->hn", q[lane], k) * d ** -0.5, -1)
                ref = torch.einsum("hn,nhd->hd", w, v)
                torch.testing.assert_close(out[lane], ref, atol=1e-5, rtol=1e-5)


def test_branch_table_entries_match_reference():
    g = torch.Generator().manual_seed(2)
    P, K, S = 4, 3, 5
    seq = torch.tensor([9, 12, 15, 22])
    B = 4
    _, W = sizes(S, K, P, context_len=32)
    table, rows = make_rows(g, B, W)
    bt = branch_table(table, rows, seq, S, K, P, W)
    for b in range(B):
        sl = int(seq[b])
        drafts, holes, tail, _ = ref_layout(sl, S, K, P)
        row = table[rows[b]].tolist()
        for t in range(K):
            own = (tail if t == 0 else holes[t]) + drafts[t]            # entries [base, sl+S)
            expect = row[: sl - sl % P] + [row[e] for e in own]
            assert bt[b * K + t, : sl + S].tolist() == expect


def test_empty_batch():
    table = torch.zeros(1, 64, dtype=torch.int32)
    seq, rows = torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    assert draft_slots(table, rows, seq, 3, 4, 16).shape == (0, 4, 3)
    assert branch_table(table, rows, seq, 3, 4, 16, 64).shape == (0, 64)
    kv = torch.zeros(1, 16, 1, 1)
    duplicate_prefix_tail(kv, kv.clone(), table, rows, seq, 3, 4, 16)
