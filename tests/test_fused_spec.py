"""Speculative-stage kernels (kernels/fused_spec.py, TRITON_INTERPRET=1 on CPU) vs the torch
bodies of tree.organize / tree.build_tree / accept.accept_greedy: equal integer outputs on
draft trees grown by the real selection from random logits."""
from __future__ import annotations

from dataclasses import astuple

import pytest
import torch

from mtplab.kernels import fused_spec as fs
from mtplab.speculative import accept, commit, tree
from mtplab.speculative.draft_select import branch_topk, select_root, select_step


def candidates(B, K, S, V=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp, ix = branch_topk(torch.randn(B, V, generator=g), K)
    branches, cand = select_root(lp, ix)
    steps = [cand]
    for s in range(1, S):
        # Coarse logits make score ties, which the stable order must break by index.
        lp, ix = branch_topk(torch.randn(B, K, V, generator=g).round(), K)
        branches, cand = select_step(branches, lp, ix, s)
        steps.append(cand)
    return (torch.cat([c.scores for c in steps], 1), torch.cat([c.tokens for c in steps], 1),
            torch.cat([c.parents for c in steps], 1))


CASES = [(1, 1, 3, 4), (3, 1, 5, 6), (2, 4, 3, 8), (4, 2, 4, 7), (3, 4, 3, 13)]


@pytest.mark.parametrize("B,K,S,D", CASES)
def test_organize_and_build_tree_kernels_match_torch(B, K, S, D):
    scores, tokens, parents = candidates(B, K, S, seed=B * 10 + K)
    want_tok, want_par = tree._organize_torch(scores, tokens, parents, D - 1)
    got_tok, got_par = fs.organize_triton(scores, tokens, parents, D - 1)
    assert torch.equal(got_tok, want_tok) and torch.equal(got_par, want_par)
    bonus = torch.arange(B) + 7
    seq = torch.arange(B) * 3 + 5
    want = tree._build_tree_torch(want_tok, want_par, bonus, seq)
    got = fs.build_tree_triton(want_tok, want_par, bonus, seq)
    for name, w, x in zip(("tokens", "parents", "depth", "positions", "mask", "next", "sib"),
                          want, got):
        assert torch.equal(x, w), name


@pytest.mark.parametrize("B,K,S,D", CASES)
def test_accept_greedy_kernel_matches_torch(B, K, S, D):
    scores, tokens, parents = candidates(B, K, S, seed=B + K)
    t = tree.build_tree(tree.DraftSelection(*tree._organize_torch(scores, tokens, parents,
                                                                  D - 1), S),
                        torch.zeros(B, dtype=torch.long), torch.full((B,), 9))
    g = torch.Generator().manual_seed(S)
    for trial in range(4):
        # The target agrees with the draft on a random share of nodes: paths of every length.
        argmax = torch.randint(0, 50, (B, D), generator=g)
        child_tok = torch.full((B, D), -1)
        has = t.retrieve_next_token >= 0
        child_tok[has] = t.tokens.gather(1, t.retrieve_next_token.clamp(min=0))[has]
        agree = (torch.rand(B, D, generator=g) < 0.3 * trial) & has
        argmax = torch.where(agree, child_tok, argmax)
        want = accept._accept_greedy_torch(t.tokens, t.parents, argmax, S)
        got = fs.accept_greedy_triton(t.tokens, t.parents, argmax, S)
        for name, w, x in zip(("index", "lens", "tokens", "bonus"), want, got):
            assert torch.equal(x, w), (trial, name)
    # Off CUDA the stage function runs the torch body.
    assert all(torch.equal(a, b) for a, b in zip(astuple(accept.accept_greedy(t, argmax)), want))


@pytest.mark.parametrize("B,K,S,D", CASES)
def test_accept_chain_kernel_matches_torch(B, K, S, D):
    scores, tokens, parents = candidates(B, K, S, seed=B * K + 1)
    t = tree.build_tree(tree.DraftSelection(*tree._organize_torch(scores, tokens, parents,
                                                                  D - 1), S),
                        torch.zeros(B, dtype=torch.long), torch.full((B,), 9))
    g = torch.Generator().manual_seed(B)
    argmax = torch.randint(0, 50, (B, D), generator=g)
    for n_val in range(1, S + 2):
        n = torch.randint(1, S + 2, (B,), generator=g) if n_val == S + 1 else \
            torch.full((B,), n_val)
        want = accept._accept_chain_torch(t.tokens, t.retrieve_next_token, argmax, n, S)
        got = fs.accept_chain_triton(t.tokens, t.retrieve_next_token, argmax, n, S)
        for name, w, x in zip(("index", "lens", "tokens", "bonus"), want, got):
            assert torch.equal(x, w), (n_val, name)


@pytest.mark.parametrize("B,K,S,D", CASES)
def test_commit_kernels_match_torch(B, K, S, D):
    g = torch.Generator().manual_seed(D)
    table = torch.randperm(6 * 64, generator=g).view(6, 64).int()
    rows = torch.randperm(6, generator=g)[:B]
    seq = torch.randint(0, 64 - D, (B,), generator=g)
    want_w = commit._window_slots_torch(table, rows, seq, D)
    assert torch.equal(fs.window_slots_triton(table, rows, seq, D), want_w)
    index = torch.full((B, S + 1), -1)
    for b in range(B):                      # increasing accepted paths of random lengths
        n = int(torch.randint(1, min(S + 1, D) + 1, (1,), generator=g))
        index[b, :n] = torch.cat([torch.zeros(1, dtype=torch.long),
                                  torch.randperm(D - 1, generator=g)[:n - 1].sort().values + 1])
    want = commit._accept_moves_torch(want_w, index)
    got = fs.accept_moves_triton(want_w, index)
    for name, w, x in zip(("src", "dst", "valid", "row_index"), want, got):
        assert torch.equal(x, w), name
