"""Speculative-stage kernels (kernels/fused_spec.py, TRITON_INTERPRET=1 on CPU) vs the torch
bodies of tree.organize / tree.build_tree / accept.accept_greedy: equal integer outputs on
draft trees grown by the real selection from random logits."""
from __future__ import annotations

from dataclasses import astuple

import pytest
import torch

from mtplab.kernels import fused_spec as fs
from mtplab.kernels.fused_ops import carrying
from mtplab.kernels.stamp import CARRY_CODES, Carried
from mtplab.kernels.topk import argmax_triton
from mtplab.speculative import accept, commit, tree
from mtplab.speculative.draft_select import (StepCandidates, branch_topk, select_root,
                                             select_step)
from tests.helpers import sm90_ptx


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


# -- the stamps a captured stage's kernels carry (kernels/stamp.py `carried_begin/_end`) --------
T = 10**15 + 4242                                      # an ns-sized clock value


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _stamp_kernel_calls(B: int):
    """Each carrying kernel of a captured stage as f(begin, end, clock) -> its outputs."""
    K, S, D = 2, 3, 5
    scores, tokens, parents = candidates(B, K, S, seed=B + 5)
    sel_tok, sel_par = tree._organize_torch(scores, tokens, parents, D - 1)
    bonus, seq = torch.arange(B) + 7, torch.arange(B) * 3 + 5
    t = tree.build_tree(tree.DraftSelection(sel_tok, sel_par, S), bonus, seq)
    argmax = torch.randint(0, 50, (B, D), generator=torch.Generator().manual_seed(B))
    table = torch.arange(6 * 64).view(6, 64).int()
    logits = torch.randn(B, D, 300, generator=torch.Generator().manual_seed(B))
    (scores, tokens, parents, sel_tok, sel_par, bonus, seq, argmax, table, logits, t_tok,
     t_par, t_next) = (x.to(DEVICE) for x in (scores, tokens, parents, sel_tok, sel_par, bonus,
                                              seq, argmax, table, logits, t.tokens, t.parents,
                                              t.retrieve_next_token))
    n = torch.full((B,), 2, device=DEVICE)
    return {
        "organize": lambda b, e, c: fs.organize_triton(scores, tokens, parents, D - 1, b, e, c),
        "build_tree": lambda b, e, c: fs.build_tree_triton(sel_tok, sel_par, bonus, seq, b, e,
                                                           c),
        "accept_greedy": lambda b, e, c: fs.accept_greedy_triton(t_tok, t_par, argmax, S, b, e,
                                                                 c),
        "accept_chain": lambda b, e, c: fs.accept_chain_triton(t_tok, t_next, argmax, n, S, b,
                                                               e, c),
        "window_slots": lambda b, e, c: (fs.window_slots_triton(
            table, torch.arange(B, device=DEVICE), seq, D, b, e, c),),
        # argmax carries a begin only (accept's, in its graph): block 64 -> a (B*D, 5) grid
        "argmax": lambda b, e, c: (argmax_triton(logits, 64, b, c),),
    }


@pytest.mark.parametrize("B", [1, 3])                 # one program (no counter), several
@pytest.mark.parametrize("name", ["organize", "build_tree", "accept_greedy", "accept_chain",
                                  "window_slots", "argmax"])
def test_spec_kernels_carry_a_stages_begin_and_end_stamp(name, B):
    """Stamped or not, the same outputs; program 0 writes the begin record first, the last
    program out the end record, and the done counter is back at zero (the next kernel on
    the chain reuses it). The interpreter takes the time from a tensor; on CUDA it is
    %globaltimer."""
    call = _stamp_kernel_calls(B)[name]
    plain = call(None, None, None)
    ring = torch.zeros(8, 2, dtype=torch.long, device=DEVICE)
    count = torch.tensor([6], dtype=torch.int32, device=DEVICE)   # the records wrap the ring
    done = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    end = Carried(ring, count, (31,), done) if name != "argmax" else None
    clock = torch.tensor([T]) if DEVICE == "cpu" else None
    got = call(Carried(ring, count, (30,), done), end, clock)
    for a, b in zip(got, plain):
        assert torch.equal(a, b)
    rec = ring.cpu()
    codes = [30, 31] if end is not None else [30]
    assert rec[6:6 + len(codes), 0].tolist() == codes and int(count[0]) == 6 + len(codes)
    ns = rec[6:6 + len(codes), 1]
    assert (ns == T).all() if DEVICE == "cpu" else bool((ns > 0).all() and (ns[1:] >= ns[0]).all())
    assert int(done[0]) == 0 and not rec[:6].any()


def test_stage_functions_stamp_around_their_torch_fallback():
    """Where a stage runs its torch body (off CUDA here, or after a kernel failure), a
    carried stamp becomes a stamp launch before or after it: the meter's record count per
    replay does not depend on which path ran."""
    scores, tokens, parents = candidates(2, 2, 3, seed=3)
    ring, count = torch.zeros(8, 2, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    done = torch.zeros(1, dtype=torch.int32)
    steps = [StepCandidates(tokens, scores, parents)]
    carried = {"organize": (Carried(ring, count, (40,), done), None),
               "build_tree": (None, Carried(ring, count, (41,), done))}
    with carrying(lambda op: carried.get(op, (None, None))):    # a capture's hand-over
        sel = tree.organize(steps, 5)
        t = tree.build_tree(sel, torch.arange(2), torch.arange(2) + 4)
    assert torch.equal(t.tokens, tree.build_tree(tree.organize(steps, 5), torch.arange(2),
                                                 torch.arange(2) + 4).tokens)
    assert int(count[0]) == 2 and ring[:2, 0].tolist() == [40, 41]
    assert (ring[:2, 1] > 0).all() and ring[0, 1] <= ring[1, 1]       # host (or GPU) times


def test_carried_stamps_are_one_code_each():
    ring, count = torch.zeros(8, 2, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="one code"):
        fs.window_slots_triton(torch.zeros(2, 8, dtype=torch.int32), torch.arange(1),
                               torch.zeros(1, dtype=torch.long), 3,
                               Carried(ring, count, (1, 2), count))


@pytest.mark.parametrize("stamp", ["begin", "end"])
def test_carrying_kernels_compile_for_sm90_with_one_timer_read(monkeypatch, stamp):
    """Compiled ahead of time for an H100 (the interpreter cannot run %globaltimer): a begin
    is one timer read and one relaxed slot claim; an end adds the acq_rel done counter,
    skipped at run time by a one-program grid."""
    sig = {"Table": "*i32", "Rows": "*i64", "Seq": "*i64", "Out": "*i64", "stride_t": "i32",
           "D": "i32", "Ring": "*i64", "Count": "*i32", "Clock": "*i64", "Done": "*i32",
           "code_b": "i32", "code_e": "i32", "st_mask": "i32"}
    const = dict(BLOCK_D=16, STAMP_B=stamp == "begin", STAMP_E=stamp == "end",
                 GLOBALTIMER=True)
    ptx = sm90_ptx(monkeypatch, fs._window_slots_kernel, sig, const,
                   do_not_specialize=CARRY_CODES)
    atoms = [ln.strip() for ln in ptx.splitlines() if "atom.global" in ln]
    assert ptx.count("%globaltimer") == 1 and all(a.startswith("@%p") for a in atoms)
    assert sum(".relaxed" in a for a in atoms) == 1
    assert sum("acq_rel" in a for a in atoms) == (stamp == "end")
