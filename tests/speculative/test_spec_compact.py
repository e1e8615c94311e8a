"""Accept compaction (mtplab/speculative/commit.py) on random trees against a plain-Python
reference."""
import pytest
import torch

from mtplab.speculative.commit import accept_moves, apply_kv_moves, window_slots
from mtplab.speculative.draft_select import branch_topk, select_root, select_step
from mtplab.speculative.tree import build_tree, organize
from mtplab.speculative.accept import accept_greedy


def random_tree(g, B, V, K, S, D, seq_lens):
    branches, c = select_root(*branch_topk(torch.randn(B, V, generator=g), K))
    steps = [c]
    for s in range(1, S):
        branches, c = select_step(branches, *branch_topk(torch.randn(B, K, V, generator=g), K), s)
        steps.append(c)
    return build_tree(organize(steps, D), torch.randint(0, V, (B,), generator=g), seq_lens)


def target_argmax_hitting(g, tree, V, p_hit=0.75):
    """At each node, the target's argmax is a random child's token with probability p_hit."""
    B, D = tree.tokens.shape
    am = torch.randint(0, V, (B, D), generator=g)
    for b in range(B):
        for i in range(D):
            kids = [j for j in range(D) if int(tree.parents[b, j]) == i]
            if kids and float(torch.rand(1, generator=g)) < p_hit:
                am[b, i] = tree.tokens[b, kids[int(torch.randint(0, len(kids), (1,), generator=g))]]
    node = int(tree.depth[0].argmax())          # request 0 accepts its deepest node's path
    while node > 0:
        parent = int(tree.parents[0, node])
        am[0, parent] = tree.tokens[0, node]
        node = parent
    return am


@pytest.mark.parametrize("K,S,D", [(1, 3, 4), (2, 3, 6), (3, 4, 10), (4, 3, 13), (3, 5, 4)])
def test_moves_bring_accepted_path_to_front(K, S, D):
    g = torch.Generator().manual_seed(K * 100 + S * 10 + D)
    B, V, W, L, H = 16, 12, 64, 2, 3
    num_slots = (B + 1) * W
    seq_lens = torch.randint(1, W - D - 1, (B,), generator=g)
    rows = torch.randperm(B, generator=g) + 1                        # row 0 = padding row
    req_to_token = torch.randperm(num_slots, generator=g).to(torch.int32).view(B + 1, W)
    tree = random_tree(g, B, V, K, S, D, seq_lens)
    res = accept_greedy(tree, target_argmax_hitting(g, tree, V))
    assert int(res.accept_lens[0]) == int(tree.depth[0].max()) + 1   # a full path accepted
    assert int(res.accept_lens.min()) == 1

    window = window_slots(req_to_token, rows, seq_lens, D)
    moves = accept_moves(window, res)
    assert moves.src_slots.shape == moves.dst_slots.shape == moves.valid.shape == (B, S + 1)

    k_cache = torch.randn(L, num_slots, H, 2, generator=g)
    v_cache = torch.randn(L, num_slots, H, 2, generator=g)
    k_old, v_old = k_cache.clone(), v_cache.clone()
    apply_kv_moves(k_cache, v_cache, moves)

    r2t = req_to_token.long().tolist()
    touched = set()
    for b in range(B):
        row, sl = int(rows[b]), int(seq_lens[b])
        path = [n for n in res.accept_index[b].tolist() if n >= 0]
        assert len(path) == int(res.accept_lens[b])
        # reference moves: path node k (entry sl + path[k]) -> entry sl + k
        src = [r2t[row][sl + n] for n in path]
        dst = [r2t[row][sl + k] for k in range(len(path))]
        n = len(path)
        assert moves.valid[b].tolist() == [k < n for k in range(S + 1)]
        assert moves.src_slots[b, :n].tolist() == src and moves.dst_slots[b, :n].tolist() == dst
        for k in range(n):
            assert torch.equal(k_cache[:, dst[k]], k_old[:, src[k]])
            assert torch.equal(v_cache[:, dst[k]], v_old[:, src[k]])
        touched.update(dst)
        assert moves.row_index[b, :n].tolist() == [b * D + p for p in path]
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[list(touched)] = False
    assert torch.equal(k_cache[:, untouched], k_old[:, untouched])
    assert torch.equal(v_cache[:, untouched], v_old[:, untouched])

    # per-node outputs (hidden, predict) compact through the same mapping
    hidden = torch.randn(B * D, H, generator=g)
    out = hidden[moves.row_index]                                    # [B, S+1, H]
    for b in range(B):
        for k, p in enumerate(res.accept_index[b].tolist()):
            if p >= 0:
                assert torch.equal(out[b, k], hidden[b * D + p])


def test_no_accept_and_all_accept_are_identity_or_chain():
    g = torch.Generator().manual_seed(0)
    B, V, K, S, D, W = 8, 10, 1, 3, 4, 32
    seq_lens = torch.arange(B) + 3
    rows = torch.arange(1, B + 1)
    req_to_token = torch.arange((B + 1) * W, dtype=torch.int32).view(B + 1, W)
    tree = random_tree(g, B, V, K, S, D, seq_lens)
    chain_argmax = torch.cat([tree.tokens[:, 1:], torch.zeros(B, 1, dtype=torch.long)], 1)
    for argmax, n in ((chain_argmax, S + 1), ((tree.tokens[:, 1:2] + 1).expand(B, D), 1)):
        res = accept_greedy(tree, argmax)
        assert res.accept_lens.tolist() == [n] * B
        moves = accept_moves(window_slots(req_to_token, rows, seq_lens, D), res)
        # topk 1: every move is an identity copy (the path is already the front)
        assert torch.equal(moves.src_slots, moves.dst_slots)
