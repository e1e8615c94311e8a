"""Draft selection (mtplab/speculative/draft_select.py) against a plain-Python reference."""
import numpy as np
import pytest
import torch

from mtplab.speculative.draft_select import branch_topk, num_candidates, select_root, select_step
from mtplab.speculative.tree import organize


# ---------------------------------------------------------------- plain-Python reference
def ref_select(root_logp, root_tok, steps, num_draft_tokens):
    """One request. root_logp/root_tok [K] lists; steps: [(logp [K][K], tok [K][K])] for s >= 1.
    Scores in float32 (numpy) like the torch code. Returns (tokens, parents) of nodes 1..D-1."""
    K = len(root_tok)
    cands = [dict(score=np.float32(root_logp[i]), token=root_tok[i], parent=-1) for i in range(K)]
    branches = list(range(K))
    for lp, tk in steps:
        start = len(cands)
        new = [dict(score=np.float32(cands[br]["score"] + np.float32(lp[j][i])),
                    token=tk[j][i], parent=br)
               for j, br in enumerate(branches) for i in range(K)]
        cands.extend(new)
        order = sorted(range(len(new)), key=lambda c: (-new[c]["score"], c))[:K]
        branches = [start + c for c in order]
    best = sorted(range(len(cands)), key=lambda c: (-cands[c]["score"], c))[:num_draft_tokens - 1]
    sel = sorted(best)
    node_of = {c: i + 1 for i, c in enumerate(sel)}
    tokens, parents = [], []
    for c in sel:
        p = cands[c]["parent"]
        assert p == -1 or p in node_of, "a selected node's parent must be selected"
        parents.append(0 if p == -1 else node_of[p])
        tokens.append(cands[c]["token"])
    return tokens, parents


def ref_topk(values, k):
    order = sorted(range(len(values)), key=lambda v: (-values[v], v))[:k]
    return [values[i] for i in order], order


def run_torch(root_logp, root_tok, step_inputs, D):
    branches, cand = select_root(root_logp, root_tok)
    steps = [cand]
    for s, (lp, tk) in enumerate(step_inputs, start=1):
        # the branches handed to the next step carry their candidates' tokens and scores
        nxt, cand = select_step(branches, lp, tk, s)
        flat_tok = torch.cat([c.tokens for c in steps + [cand]], 1)
        flat_sc = torch.cat([c.scores for c in steps + [cand]], 1)
        assert torch.equal(flat_tok.gather(1, nxt.cand), nxt.tokens)
        assert torch.equal(flat_sc.gather(1, nxt.cand), nxt.scores)
        assert torch.equal(cand.parents.gather(1, nxt.cand - num_candidates(s, lp.shape[1])),
                           branches.cand.gather(1, nxt.lane))
        branches = nxt
        steps.append(cand)
    return organize(steps, D)


def check_tree_order(sel):
    idx = torch.arange(1, sel.parents.shape[1] + 1)
    assert (sel.parents >= 0).all() and (sel.parents < idx).all(), "topological order"


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("K,S", [(1, 1), (1, 4), (2, 1), (2, 3), (3, 2), (4, 3), (4, 5)])
def test_random_logits_match_reference(K, S):
    g = torch.Generator().manual_seed(100 * K + S)
    B, V = 4, 40
    for D in sorted({2, min(S * K + 1, num_candidates(S, K) + 1), S + 1 if K == 1 else K + 1}):
        root_logits = torch.randn(B, V, generator=g) * 3
        root_logp, root_tok = branch_topk(root_logits, K)
        step_logits = [torch.randn(B, K, V, generator=g) * 3 for _ in range(S - 1)]
        step_inputs = [branch_topk(x, K) for x in step_logits]
        sel = run_torch(root_logp, root_tok, step_inputs, D)
        assert sel.tokens.shape == (B, D - 1) and sel.parents.shape == (B, D - 1)
        assert sel.num_steps == S
        check_tree_order(sel)
        for b in range(B):
            full = torch.log_softmax(root_logits[b], -1).tolist()
            r_lp, r_tok = ref_topk(full, K)
            steps = []
            for x in step_logits:
                lp_rows, tk_rows = [], []
                for j in range(K):
                    lp, tk = ref_topk(torch.log_softmax(x[b, j], -1).tolist(), K)
                    lp_rows.append(lp)
                    tk_rows.append(tk)
                steps.append((lp_rows, tk_rows))
            tokens, parents = ref_select(r_lp, r_tok, steps, D)
            assert sel.tokens[b].tolist() == tokens
            assert sel.parents[b].tolist() == parents


@pytest.mark.parametrize("K,S", [(2, 3), (3, 3), (4, 4)])
def test_ties_are_deterministic_and_parents_selected(K, S):
    """Quantised log-probs (exact in float32) produce many equal cumulative scores, including
    child == parent (log-prob 0): ties go to the lower candidate index, parents stay selected."""
    g = torch.Generator().manual_seed(7 + K)
    levels = torch.tensor([0.0, -0.25, -0.5, -1.0])
    B, V = 6, 30
    for _ in range(5):
        def q(*shape):
            return levels[torch.randint(0, 4, shape, generator=g)]
        root_lp, root_tok = q(B, K), torch.randint(0, V, (B, K), generator=g)
        step_inputs = [(q(B, K, K), torch.randint(0, V, (B, K, K), generator=g))
                       for _ in range(S - 1)]
        for D in range(2, num_candidates(S, K) + 2):
            sel = run_torch(root_lp, root_tok, step_inputs, D)
            check_tree_order(sel)
            for b in range(B):
                steps = [(lp[b].tolist(), tk[b].tolist()) for lp, tk in step_inputs]
                tokens, parents = ref_select(root_lp[b].tolist(), root_tok[b].tolist(), steps, D)
                assert sel.tokens[b].tolist() == tokens
                assert sel.parents[b].tolist() == parents


def test_topk1_is_a_chain():
    g = torch.Generator().manual_seed(3)
    B, V, S = 3, 20, 4
    root = torch.randn(B, V, generator=g)
    lp, tk = branch_topk(root, 1)
    branches, cand = select_root(lp, tk)
    steps, expect = [cand], [root.argmax(-1)]
    for s in range(1, S):
        logits = torch.randn(B, 1, V, generator=g)
        branches, cand = select_step(branches, *branch_topk(logits, 1), s)
        assert torch.equal(branches.lane, torch.zeros(B, 1, dtype=torch.long))
        steps.append(cand)
        expect.append(logits[:, 0].argmax(-1))
    sel = organize(steps, S + 1)
    assert torch.equal(sel.tokens, torch.stack(expect, 1))
    assert sel.parents.tolist() == [list(range(S))] * B
    with pytest.raises(ValueError, match="candidates"):
        organize(steps, S + 2)


def test_empty_batch():
    lp, tk = branch_topk(torch.zeros(0, 10), 2)
    branches, c0 = select_root(lp, tk)
    _, c1 = select_step(branches, *branch_topk(torch.zeros(0, 2, 10), 2), 1)
    sel = organize([c0, c1], 4)
    assert sel.tokens.shape == (0, 3) and sel.parents.shape == (0, 3)
