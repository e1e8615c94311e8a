"""Differential tests: mtplab's draft selection, organize, tree build and greedy accept against
SGLang's own functions (the pinned `sglang-ref` extra) on the same random inputs.

Inputs are the per-step top-k of a draft model, keyed by the *path* of the branch that asks
(its candidate index), so both implementations see the same children whatever order they
keep their branches in. Probabilities are p = 2**(-n/2**16), integer n: SGLang multiplies
probabilities (float64 here), mtplab adds log-probabilities (-n/2**16, exact in float32), and the
two orders agree exactly wherever the exponent sums differ (n < 2**20: the fixed seeds give
no equal sums). `ties=True` draws p from {1/2, 1/4}
so many paths tie; there torch.topk (SGLang) and mtplab's stable sort (lower candidate index
first) may pick different members of a tie, a deliberate difference (docs/sglang.md): those
cases compare the selected score multisets and then run mtplab's tree and accept on SGLang's
own selection.
"""
from __future__ import annotations

import math

import pytest
import torch

from mtplab.speculative.accept import accept_greedy, accept_simulated
from mtplab.speculative.draft_select import (DraftBranches, branch_topk, num_candidates,
                                             select_root, select_step)
from mtplab.speculative.tree import DraftSelection, build_tree, organize
from tests.sglang_fixtures import sglang_module

SCALE = 65536.0   # p = 2 ** (-n / SCALE): n < 2**20 keeps -n/SCALE and its sums exact in fp32


@pytest.fixture(scope="module")
def sg():
    spec_utils = sglang_module("sglang.srt.speculative.spec_utils")
    eagle_utils = sglang_module("sglang.srt.speculative.eagle_utils")
    return spec_utils, eagle_utils


def draft_tables(g, B, K, S, V, ties):
    """Per step s: exponents n [B, P_s, K] and tokens [B, P_s, K] for each possible parent
    (P_0 = 1 root, P_1 = K step-0 candidates, P_s = K*K step-(s-1) candidates)."""
    tabs = []
    for s in range(S):
        P = 1 if s == 0 else (K if s == 1 else K * K)
        if ties:
            n = torch.randint(1, 3, (B, P, K), generator=g) * int(SCALE)
        else:
            n = torch.randint(1, 2 ** 20, (B, P, K), generator=g)
        n = n.sort(dim=-1).values                       # top-k outputs are best first
        tok = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(B * P)])
        tabs.append((n, tok.view(B, P, K)))
    return tabs


def children(tabs, s, cand, K):
    """Rows of step s's table for branches with global candidate indices cand [B, K]."""
    n, tok = tabs[s]
    local = cand - (0 if s == 1 else num_candidates(s - 1, K))
    idx = local[:, :, None].expand(-1, -1, K)
    return n.gather(1, idx), tok.gather(1, idx)


def run_mtplab(tabs, K, S):
    n0, t0 = tabs[0]
    br, st = select_root(-n0[:, 0].float() / SCALE, t0[:, 0])
    steps = [st]
    for s in range(1, S):
        n, tok = children(tabs, s, br.cand, K)
        br, st = select_step(br, -n.float() / SCALE, tok, s)
        steps.append(st)
    return steps


def run_sglang(spec_utils, tabs, K, S):
    """SGLang's draft loop (EAGLEWorkerV2.draft_forward) around select_top_k_tokens."""
    B = tabs[0][0].shape[0]
    n0, t0 = tabs[0]
    topk_p, topk_index = torch.exp2(-n0[:, 0].double() / SCALE), t0[:, 0]
    scores, hidden = None, torch.zeros(B, 1, dtype=torch.float64)
    score_list, token_list, parents_list, chosen = [], [], [], []
    for i in range(S):
        ids, hidden, scores, info = spec_utils.select_top_k_tokens(
            i, topk_p, topk_index, hidden, scores, K)
        score_list.append(info[0]), token_list.append(info[1]), parents_list.append(info[2])
        cand = torch.arange(K).expand(B, K) if i == 0 else info[2]
        chosen.append(DraftBranches(tokens=ids.view(B, K), scores=-exps(scores).float() / SCALE,
                                    cand=cand, lane=torch.zeros_like(cand)))
        if i == S - 1:
            break
        n, tok = children(tabs, i + 1, cand, K)
        topk_p = torch.exp2(-n.double() / SCALE).reshape(B * K, K)
        topk_index = tok.reshape(B * K, K)
    return score_list, token_list, parents_list, chosen


def run_mtplab_lockstep(tabs, chosen, K, S):
    """mtplab's select_step fed SGLang's branches at every step (ties: both choices are
    valid, so the steps are compared from the same state); returns the steps and mtplab's own
    branch choice after each step."""
    n0, t0 = tabs[0]
    br, st = select_root(-n0[:, 0].float() / SCALE, t0[:, 0])
    steps, mine = [st], [br]
    for s in range(1, S):
        n, tok = children(tabs, s, chosen[s - 1].cand, K)
        br, st = select_step(chosen[s - 1], -n.float() / SCALE, tok, s)
        steps.append(st), mine.append(br)
    return steps, mine


def exps(p):
    """SGLang's probabilities back to integer exponents n (p = 2**(-n/SCALE))."""
    return torch.round(-torch.log2(p) * SCALE).long()


def selection_from_sglang(top_idx, draft_tokens, parent_list, K, S):
    """SGLang's organize output as mtplab's DraftSelection (tree parents by candidate search,
    the same mapping SGLang's build-tree kernel performs)."""
    slot = top_idx // K                       # 0 = the root, else a parent_list slot
    if parent_list.shape[1] == 0:
        par_c = torch.full_like(top_idx, -1)
    else:
        par_c = torch.where(slot == 0, -1,
                            parent_list.gather(1, slot.clamp(max=parent_list.shape[1] - 1)))
    pos = torch.searchsorted(top_idx.contiguous(), par_c.clamp(min=0).contiguous())
    parents = torch.where(par_c < 0, torch.zeros_like(pos), pos + 1)
    return DraftSelection(tokens=draft_tokens.long(), parents=parents, num_steps=S)


def sglang_tree(eagle_utils, top_idx, parent_list, seq_lens, K, S, D, mode):
    B = seq_lens.shape[0]
    if mode == eagle_utils.TreeMaskMode.FULL_MASK:
        mask = torch.full((int(seq_lens.sum()) * D + D * D * B,), True)
    else:
        mask = torch.full((D * D * B,), True)
    ri, rn, rs = torch.full((3, B, D), -1, dtype=torch.long)
    positions = torch.empty(B * D, dtype=torch.long)
    eagle_utils.sgl_build_tree_kernel_triton(parent_list, top_idx, seq_lens, mask, positions,
                                             ri, rn, rs, K, S, D, mode)
    return mask, positions.view(B, D), ri, rn, rs


def full_mask_view(mask, seq_lens, D):
    """FULL_MASK [sum_b D*(L_b+D)] -> per request (prefix [D, L_b], tree [D, D])."""
    out, off = [], 0
    for L in seq_lens.tolist():
        m = mask[off: off + D * (L + D)].view(D, L + D)
        out.append((m[:, :L], m[:, L:]))
        off += D * (L + D)
    return out


def planted_target(g, tree, B, D, V, hit=0.7):
    """Target argmax [B, D]: at each node, one of its children's tokens with prob `hit`."""
    tgt = torch.randint(0, V, (B, D), generator=g)
    for b in range(B):
        for i in range(D):
            kids = (tree.parents[b] == i).nonzero().flatten()
            if len(kids) and float(torch.rand(1, generator=g)) < hit:
                k = kids[int(torch.randint(0, len(kids), (1,), generator=g))]
                tgt[b, i] = tree.tokens[b, k]
    return tgt


def check_case(sg, B, K, S, D, ties, seed, mask_mode="QLEN_ONLY"):
    spec_utils, eagle_utils = sg
    V = max(16, 2 * K)
    g = torch.Generator().manual_seed(seed)
    tabs = draft_tables(g, B, K, S, V, ties)
    score_list, token_list, parents_list, chosen = run_sglang(spec_utils, tabs, K, S)
    if ties:
        steps, mine = run_mtplab_lockstep(tabs, chosen, K, S)
        for a, b in zip(mine, chosen):   # the same best-K scores, whichever tied member
            assert torch.equal(a.scores.sort(dim=1).values, b.scores.sort(dim=1).values)
    else:
        steps = run_mtplab(tabs, K, S)

    # -- draft selection: per-step candidates (scores, tokens) and chosen branches' scores
    for s, st in enumerate(steps):
        assert torch.equal(exps(score_list[s].flatten(1)), torch.round(-st.scores * SCALE).long())
        assert torch.equal(token_list[s].flatten(1), st.tokens)
        if s + 1 < S and not ties:   # parents of step s+1 = the branches chosen at step s
            chosen = parents_list[0][:, 1:] if s == 0 else parents_list[s]
            assert torch.equal(steps[s + 1].parents.view(B, K, K)[:, :, 0], chosen)

    # -- organize
    parent_list, top_idx, draft_tokens = eagle_utils.organize_draft_results(
        score_list, token_list, parents_list, D)
    sel = organize(steps, D)
    all_scores = torch.cat([s.scores for s in steps], dim=1)
    if ties:
        sg_sel = exps(torch.cat([x.flatten(1) for x in score_list], 1).gather(1, top_idx))
        mt_best = torch.sort(all_scores, dim=-1, descending=True, stable=True).indices[:, :D - 1]
        mt_sel = torch.round(-all_scores.gather(1, mt_best) * SCALE).long()
        assert torch.equal(sg_sel.sort(dim=1).values, mt_sel.sort(dim=1).values)
        sel = selection_from_sglang(top_idx, draft_tokens, parent_list, K, S)
    else:
        assert torch.equal(draft_tokens, sel.tokens)
        assert torch.equal(selection_from_sglang(top_idx, draft_tokens, parent_list, K, S).parents,
                           sel.parents)

    # -- tree build
    seq_lens = torch.randint(1, 9, (B,), generator=g)
    bonus = torch.randint(0, V, (B,), generator=g)
    tree = build_tree(sel, bonus, seq_lens)
    mode = getattr(eagle_utils.TreeMaskMode, mask_mode)
    mask, positions, ri, rn, rs = sglang_tree(eagle_utils, top_idx, parent_list, seq_lens,
                                              K, S, D, mode)
    assert torch.equal(positions, tree.positions)
    assert torch.equal(ri, torch.arange(B * D).view(B, D))
    assert torch.equal(rn, tree.retrieve_next_token)
    assert torch.equal(rs, tree.retrieve_next_sibling)
    if mode == eagle_utils.TreeMaskMode.FULL_MASK:
        for b, (prefix, tm) in enumerate(full_mask_view(mask, seq_lens, D)):
            assert bool(prefix.all())
            assert torch.equal(tm, tree.mask[b])
    else:
        assert torch.equal(mask.view(B, D, D), tree.mask)

    # -- greedy verify / accept
    tgt = planted_target(g, tree, B, D, V)
    candidates = tree.tokens
    predicts = torch.zeros(B * D, dtype=torch.long)
    accept_index = torch.full((B, S + 1), -1, dtype=torch.long)
    accept_num = torch.zeros(B, dtype=torch.long)
    eagle_utils.verify_tree_greedy_triton(predicts, accept_index, accept_num, candidates,
                                          ri, rn, rs, tgt)
    res = accept_greedy(tree, tgt)
    base = (torch.arange(B) * D)[:, None]
    assert torch.equal(torch.where(accept_index >= 0, accept_index - base, -1), res.accept_index)
    assert torch.equal(accept_num + 1, res.accept_lens)
    for b in range(B):
        n = int(res.accept_lens[b])
        assert predicts[accept_index[b, :n]].tolist() == res.tokens[b, :n].tolist()


def valid_draft_tokens(K, S):
    """Every D SGLang's organize accepts: 2 <= D <= C + 1 (C = candidates over S steps)."""
    return range(2, num_candidates(S, K) + 2)


# Fast: every topk and steps value, both tie regimes, bs 1 and 4, a few D per shape.
FAST = [(B, K, S, D, ties)
        for K in (1, 2, 4, 8) for S in (1, 3, 5)
        for D in sorted({2, min(6, num_candidates(S, K) + 1)})
        for B, ties in ((1, False), (4, True))]


@pytest.mark.parametrize("B,K,S,D,ties", FAST)
def test_matches_sglang(sg, B, K, S, D, ties):
    check_case(sg, B, K, S, D, ties, seed=1000 * K + 10 * S + D)


@pytest.mark.parametrize("ties", [False, True])
def test_full_mask_matches_sglang(sg, ties):
    check_case(sg, 3, 2, 3, 6, ties, seed=7, mask_mode="FULL_MASK")


@pytest.mark.slow
@pytest.mark.parametrize("K", [1, 2, 4, 8])
@pytest.mark.parametrize("S", [1, 3, 5])
def test_matches_sglang_every_draft_token_count(sg, K, S):
    """bs 1-4 and every valid num_draft_tokens (D <= 16 through the interpreted kernels)."""
    for D in valid_draft_tokens(K, S):
        if D > 16:
            break
        for B in (1, 2, 3, 4):
            check_case(sg, B, K, S, D, ties=bool(B % 2 == 0), seed=D * 10 + B)


def test_branch_topk_matches_sglang_fast_topk(sg):
    """Step input: mtplab's log-softmax top-k == SGLang's softmax + fast_topk."""
    common = sglang_module("sglang.srt.utils.common")
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 50, generator=g) * 3
    for K in (1, 2, 4, 8):
        p, idx = common.fast_topk(torch.softmax(logits, dim=-1), K, dim=-1)
        logp, tok = branch_topk(logits, K)
        assert torch.equal(idx, tok)
        torch.testing.assert_close(torch.exp(logp), p, rtol=1e-5, atol=1e-7)


def test_simulated_accept_length_distribution_matches_sglang(sg):
    """Per-step accept length: SGLang's match-expected draw vs mtplab's accept_simulated,
    chi-square on the counts (fixed seeds; a 0.25 shift in the mean fails it)."""
    spec_utils, _ = sg
    S, mean, N = 3, 2.3, 4000
    torch.manual_seed(0)
    sg_counts = torch.zeros(S + 2)
    for _ in range(N):
        sg_counts[spec_utils._sample_simulated_acc_len(mean, "match-expected", S + 1)] += 1
    chain = DraftSelection(tokens=torch.arange(S)[None].expand(N, S).clone(),
                           parents=torch.arange(S)[None].expand(N, S).clone(), num_steps=S)
    tree = build_tree(chain, torch.zeros(N, dtype=torch.long), torch.full((N,), 5))
    u = torch.rand(N, S + 1, generator=torch.Generator().manual_seed(1))

    def counts(m):
        res = accept_simulated(tree, torch.zeros(N, S + 1, dtype=torch.long), u, mean_accept_len=m)
        return torch.bincount(res.accept_lens, minlength=S + 2).float()

    def chi2(a, b):
        keep = (a + b) > 0
        a, b = a[keep], b[keep]
        ea = (a + b) * a.sum() / (a.sum() + b.sum())
        eb = (a + b) * b.sum() / (a.sum() + b.sum())
        return float(((a - ea) ** 2 / ea + (b - eb) ** 2 / eb).sum()), int(keep.sum()) - 1

    stat, dof = chi2(sg_counts, counts(mean))
    crit = {1: 10.83, 2: 13.82, 3: 16.27}[max(dof, 1)]   # p = 0.001
    assert stat < crit, (stat, sg_counts, counts(mean))
    shifted, dof2 = chi2(sg_counts, counts(mean + 0.25))
    assert shifted > {1: 10.83, 2: 13.82, 3: 16.27}[max(dof2, 1)]
    assert math.isclose(float((sg_counts * torch.arange(S + 2)).sum() / N), mean, abs_tol=0.05)


def test_the_moe_library_arm_makes_what_sglangs_fused_moe_reads_of_a_server():
    """Outside a server SGLang's fused MoE finds neither the published config its
    launch-config lookup reads (runtime_context.get_exec() raises) nor the tensor-parallel
    group its output buffer is made for; studies/moe/moe_library.sglang_context makes both
    (a one-rank group), and a second call keeps them."""
    rc = sglang_module("sglang.srt.runtime_context")
    ps = sglang_module("sglang.srt.distributed.parallel_state")
    from mtplab.studies.moe import moe_library as ml
    try:
        ml.sglang_context("cpu")
        bag, tp = rc.get_exec(), ps.get_tp_group()
        ml.sglang_context("cpu")
        assert rc.get_exec() is bag and ps.get_tp_group() is tp
        assert bag.deterministic.enable_deterministic_inference is False
        assert tp.world_size == 1
    finally:
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()
