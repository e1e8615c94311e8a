"""Tree build and verify (mtplab/speculative/tree.py, verify.py) against plain-Python references."""
import math

import numpy as np
import pytest
import torch

from mtplab.speculative.draft_select import branch_topk, select_root, select_step
from mtplab.speculative.tree import DraftSelection, build_tree, organize
from mtplab.speculative.accept import sampling_probs, accept_simulated, accept_greedy, accept_sample


# ---------------------------------------------------------------- random trees
def random_selection(g, B, D, S, V, distinct_siblings=True):
    """Random topological trees of depth <= S (and == S for request 0 where D allows),
    sibling tokens distinct (as top-k children are)."""
    toks = torch.zeros(B, D - 1, dtype=torch.long)
    pars = torch.zeros(B, D - 1, dtype=torch.long)
    for b in range(B):
        depth, used = [0], {0: set()}
        for i in range(1, D):
            if b == 0 and i <= S:
                p = i - 1                        # a full-depth chain first
            else:
                cands = [n for n in range(i) if depth[n] < S and len(used[n]) < V]
                p = cands[int(torch.randint(0, len(cands), (1,), generator=g))]
            free = [v for v in range(V) if v not in used[p]] if distinct_siblings else range(V)
            t = free[int(torch.randint(0, len(free), (1,), generator=g))]
            used[p].add(t)
            used[i] = set()
            depth.append(depth[p] + 1)
            toks[b, i - 1], pars[b, i - 1] = t, p
    return DraftSelection(tokens=toks, parents=pars, num_steps=S)


def ref_tree(tokens_sel, parents_sel, bonus, seq_len):
    tokens, parents = [bonus] + tokens_sel, [-1] + parents_sel
    D = len(tokens)
    children = {i: [] for i in range(D)}
    for i in range(1, D):
        children[parents[i]].append(i)
    depth, anc = {0: 0}, {0: {0}}
    for i in range(1, D):
        depth[i] = depth[parents[i]] + 1
        anc[i] = anc[parents[i]] | {i}
    nxt_tok = [children[i][0] if children[i] else -1 for i in range(D)]
    nxt_sib = [-1] * D
    for i in range(D):
        sibs = children[i]
        for a, c in zip(sibs, sibs[1:]):
            nxt_sib[a] = c
    return dict(tokens=tokens, parents=parents, depth=[depth[i] for i in range(D)],
                positions=[seq_len + depth[i] for i in range(D)],
                mask=[[j in anc[i] for j in range(D)] for i in range(D)],
                next_token=nxt_tok, next_sibling=nxt_sib, children=children)


def ref_greedy(tree, argmax, S):
    """Brute force: every root-to-node path whose child tokens equal the argmax at their
    parents; the longest wins (ties: the first in child order)."""
    best = [0]
    for n in range(len(tree["tokens"])):
        path = [n]
        while path[0] != 0:
            path.insert(0, tree["parents"][path[0]])
        ok = all(tree["tokens"][c] == argmax[p] for p, c in zip(path, path[1:]))
        if ok and len(path) > len(best):
            best = path
    toks = [argmax[n] for n in best]
    pad = [-1] * (S + 1 - len(best))
    return best + pad, len(best), toks + pad, argmax[best[-1]]


def ref_sample(tree, probs, u, S):
    """Walk with inverse-CDF draws (float32 cumsum, as on the device)."""
    cur, path, toks = 0, [0], []
    for k in range(S + 1):
        p = np.asarray(probs[cur], dtype=np.float32)
        cdf = np.cumsum(p, dtype=np.float32)
        thr = np.float32(u[k]) * cdf[-1]
        x = min(int(np.searchsorted(cdf, thr, side="right")), int(np.nonzero(p > 0)[0].max()))
        toks.append(x)
        kids = [c for c in tree["children"][cur] if tree["tokens"][c] == x]
        if k == S or not kids:
            break
        cur = kids[0]
        path.append(cur)
    pad = [-1] * (S + 1 - len(path))
    return path + pad, len(path), toks + pad, toks[-1]


def ref_probs(logits, temp, top_p):
    if temp <= 0:
        out = [0.0] * len(logits)
        out[max(range(len(logits)), key=lambda v: (logits[v], -v))] = 1.0
        return out
    m = max(logits)
    e = [math.exp((x - m) / temp) for x in logits]
    p = [x / sum(e) for x in e]
    order = sorted(range(len(p)), key=lambda v: -p[v])
    keep, mass = set(), 0.0
    for v in order:
        if mass < top_p or top_p >= 1 or not keep:   # the most likely token always stays
            keep.add(v)
        mass += p[v]
    z = sum(p[v] for v in keep)
    return [p[v] / z if v in keep else 0.0 for v in range(len(p))]


# ---------------------------------------------------------------- tree
@pytest.mark.parametrize("D,S", [(1, 1), (2, 1), (4, 3), (8, 3), (9, 4), (16, 6)])
def test_build_tree_matches_reference(D, S):
    g = torch.Generator().manual_seed(D * 10 + S)
    B = 5
    sel = random_selection(g, B, D, S, V=3)
    bonus = torch.randint(0, 50, (B,), generator=g)
    seq_lens = torch.randint(1, 100, (B,), generator=g, dtype=torch.int32)
    tree = build_tree(sel, bonus, seq_lens)
    assert tree.num_nodes == D and tree.num_steps == S and tree.mask.shape == (B, D, D)
    for b in range(B):
        r = ref_tree(sel.tokens[b].tolist(), sel.parents[b].tolist(), int(bonus[b]),
                     int(seq_lens[b]))
        assert tree.tokens[b].tolist() == r["tokens"]
        assert tree.parents[b].tolist() == r["parents"]
        assert tree.depth[b].tolist() == r["depth"]
        assert tree.positions[b].tolist() == r["positions"]
        assert tree.mask[b].tolist() == r["mask"]
        assert tree.retrieve_next_token[b].tolist() == r["next_token"]
        assert tree.retrieve_next_sibling[b].tolist() == r["next_sibling"]
    assert int(tree.depth.max()) <= S


def test_tree_from_draft_selection():
    """draft_select -> build_tree: topological, depth <= S, depth = candidate step + 1."""
    g = torch.Generator().manual_seed(11)
    B, V, K, S, D = 4, 30, 3, 4, 10
    branches, c = select_root(*branch_topk(torch.randn(B, V, generator=g), K))
    steps = [c]
    for s in range(1, S):
        branches, c = select_step(branches, *branch_topk(torch.randn(B, K, V, generator=g), K), s)
        steps.append(c)
    sel = organize(steps, D)
    tree = build_tree(sel, torch.zeros(B, dtype=torch.long), torch.full((B,), 5))
    assert (tree.parents[:, 1:] < torch.arange(1, D)).all()
    assert int(tree.depth.max()) <= S
    assert torch.equal(tree.positions, 5 + tree.depth)


# ---------------------------------------------------------------- greedy verify
@pytest.mark.parametrize("D,S,V", [(4, 3, 2), (8, 3, 3), (12, 5, 3), (6, 2, 4), (3, 5, 2)])
def test_greedy_matches_brute_force(D, S, V):
    g = torch.Generator().manual_seed(D + 100 * S + V)
    B = 64
    sel = random_selection(g, B, D, min(S, D - 1), V)
    sel.num_steps = S
    tree = build_tree(sel, torch.randint(0, V, (B,), generator=g), torch.full((B,), 9))
    argmax = torch.randint(0, V, (B, D), generator=g)
    res = accept_greedy(tree, argmax)
    assert res.accept_index.shape == (B, S + 1) and res.tokens.shape == (B, S + 1)
    lens = []
    for b in range(B):
        r = ref_tree(sel.tokens[b].tolist(), sel.parents[b].tolist(), 0, 9)
        idx, n, toks, bonus = ref_greedy(r, argmax[b].tolist(), S)
        assert res.accept_index[b].tolist() == idx
        assert int(res.accept_lens[b]) == n
        assert res.tokens[b].tolist() == toks
        assert int(res.bonus[b]) == bonus
        lens.append(n)
    assert min(lens) == 1 and max(lens) > 2          # the draw covers the extremes


def test_greedy_extremes_and_first_child_wins():
    # root -> 1 (tok 5), root -> 2 (tok 5, duplicate sibling), 1 -> 3 (tok 6)
    sel = DraftSelection(tokens=torch.tensor([[5, 5, 6]] * 3),
                         parents=torch.tensor([[0, 0, 1]] * 3),
                         num_steps=2)
    tree = build_tree(sel, torch.tensor([1, 1, 1]), torch.tensor([4, 4, 4]))
    argmax = torch.tensor([[5, 6, 7, 8], [9, 6, 7, 8], [5, 0, 7, 8]])
    res = accept_greedy(tree, argmax)
    assert res.accept_index.tolist() == [[0, 1, 3], [0, -1, -1], [0, 1, -1]]
    assert res.accept_lens.tolist() == [3, 1, 2]
    assert res.tokens.tolist() == [[5, 6, 8], [9, -1, -1], [5, 0, -1]]
    assert res.bonus.tolist() == [8, 9, 0]


# ---------------------------------------------------------------- sampling verify
def test_sampling_probs_match_reference():
    g = torch.Generator().manual_seed(5)
    B, D, V = 6, 3, 7
    logits = torch.randn(B, D, V, generator=g) * 2
    temp = torch.tensor([0.0, 0.5, 1.0, 1.3, 0.7, 1.0])
    top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.0, 0.999])
    probs = sampling_probs(logits, temp, top_p)
    for b in range(B):
        for d in range(D):
            ref = ref_probs(logits[b, d].tolist(), float(temp[b]), float(top_p[b]))
            assert probs[b, d].tolist() == pytest.approx(ref, abs=1e-5)


def test_sample_matches_reference_walk():
    g = torch.Generator().manual_seed(21)
    B, D, S, V = 200, 6, 3, 3
    sel = random_selection(g, B, D, S, V)
    tree = build_tree(sel, torch.zeros(B, dtype=torch.long), torch.full((B,), 3))
    logits = torch.randn(B, D, V, generator=g)
    temp = torch.rand(B, generator=g) + 0.3
    temp[::7] = 0.0
    top_p = torch.rand(B, generator=g) * 0.5 + 0.5
    u = torch.rand(B, S + 1, generator=g)
    res = accept_sample(tree, logits, temp, top_p, u)
    probs = sampling_probs(logits, temp, top_p)
    for b in range(B):
        r = ref_tree(sel.tokens[b].tolist(), sel.parents[b].tolist(), 0, 3)
        idx, n, toks, bonus = ref_sample(r, probs[b].tolist(), u[b].tolist(), S)
        assert res.accept_index[b].tolist() == idx
        assert int(res.accept_lens[b]) == n
        assert res.tokens[b].tolist() == toks
        assert int(res.bonus[b]) == bonus
    greedy = accept_greedy(tree, logits.argmax(-1))
    assert torch.equal(res.tokens[::7], greedy.tokens[::7])   # temperature 0 == greedy


def _chi2_pvalue(counts, probs):
    counts = torch.as_tensor(counts, dtype=torch.float64)
    probs = torch.as_tensor(probs, dtype=torch.float64)
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token outside the target's support"
    n = counts.sum()
    exp = probs[support] * n
    chi2 = ((counts[support] - exp) ** 2 / exp).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), chi2 / 2))


@pytest.mark.parametrize("temp,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_sample_follows_target_distribution(temp, top_p):
    """V=6, D=4: root -> 1 (tok 2) -> 3 (tok 1), root -> 2 (tok 4). The first committed token
    follows p(root); the next one, given the first hit node 1 / node 2, follows p(node)."""
    N, V = 60000, 6
    g = torch.Generator().manual_seed(1234)
    sel = DraftSelection(tokens=torch.tensor([[2, 4, 1]]).expand(N, 3),
                         parents=torch.tensor([[0, 0, 1]]).expand(N, 3), num_steps=2)
    tree = build_tree(sel, torch.zeros(N, dtype=torch.long), torch.full((N,), 10))
    base = torch.randn(1, 4, V, generator=g)
    base[0, 0, 2] += 1.0     # make the drafted tokens likely enough to test the deeper levels
    base[0, 1, 1] += 1.0
    logits = base.expand(N, 4, V)
    res = accept_sample(tree, logits, torch.full((N,), temp), torch.full((N,), top_p),
                        torch.rand(N, 3, generator=g))
    p = sampling_probs(base, torch.tensor([temp]), torch.tensor([top_p]))[0]
    first = res.tokens[:, 0]
    assert _chi2_pvalue(torch.bincount(first, minlength=V), p[0]) > 1e-3
    for tok, node in ((2, 1), (4, 2)):
        nxt = res.tokens[first == tok, 1]
        assert (res.accept_lens[first == tok] >= 2).all()
        assert _chi2_pvalue(torch.bincount(nxt, minlength=V), p[node]) > 1e-3
    deep = (first == 2) & (res.tokens[:, 1] == 1)
    assert (res.accept_lens[deep] == 3).all()
    assert _chi2_pvalue(torch.bincount(res.tokens[deep, 2], minlength=V), p[3]) > 1e-3
    off_tree = ~torch.isin(first, torch.tensor([2, 4]))
    assert (res.accept_lens[off_tree] == 1).all()
    assert torch.equal(res.bonus, res.tokens.gather(1, (res.accept_lens - 1)[:, None])[:, 0])


# ---------------------------------------------------------------- simulated acceptance
def chain_tree(B, S, g):
    sel = DraftSelection(tokens=torch.randint(0, 50, (B, S), generator=g),
                         parents=torch.arange(S).expand(B, S), num_steps=S)
    return build_tree(sel, torch.zeros(B, dtype=torch.long), torch.full((B,), 7))


@pytest.mark.parametrize("mean", [1.0, 2.3, 3.5, 5.0])
def test_simulate_mean(mean):
    g = torch.Generator().manual_seed(int(mean * 10))
    B, S = 100000, 4
    tree = chain_tree(B, S, g)
    argmax = torch.randint(0, 50, (B, S + 1), generator=g)
    res = accept_simulated(tree, argmax, torch.rand(B, S + 1, generator=g), mean_accept_len=mean)
    lens = res.accept_lens
    assert set(lens.unique().tolist()) <= {math.floor(mean), math.ceil(mean)}
    assert abs(lens.double().mean().item() - mean) < 0.01
    k = torch.arange(S + 1)
    assert torch.equal(res.accept_index, torch.where(k < lens[:, None], k, -1))
    drafts = torch.cat([tree.tokens[:, 1:], torch.zeros(B, 1, dtype=torch.long)], 1)
    bonus = argmax.gather(1, (lens - 1)[:, None])[:, 0]
    expect = torch.where(k < (lens - 1)[:, None], drafts,
                         torch.where(k == (lens - 1)[:, None], bonus[:, None], -1))
    assert torch.equal(res.tokens, expect) and torch.equal(res.bonus, bonus)


def test_simulate_per_position_rates():
    g = torch.Generator().manual_seed(99)
    B, S = 100000, 4
    rates = [0.8, 0.6, 0.5, 0.3]
    tree = chain_tree(B, S, g)
    res = accept_simulated(tree, torch.zeros(B, S + 1, dtype=torch.long),
                          torch.rand(B, S + 1, generator=g), accept_rates=rates)
    lens = res.accept_lens.double()
    expect = 1 + sum(math.prod(rates[:k]) for k in range(1, S + 1))
    assert abs(lens.mean().item() - expect) < 0.015
    for k, r in enumerate(rates, start=1):   # P(len > k | len > k-1) = r_k
        assert abs(((lens > k).sum() / (lens > k - 1).sum()).item() - r) < 0.015


def test_simulate_topk_tree_uses_first_chain_and_validates():
    # root -> 1 -> 3, root -> 2: the first chain is 0, 1, 3 (depth 2 < S = 3): clipped
    sel = DraftSelection(tokens=torch.tensor([[10, 11, 12]]), parents=torch.tensor([[0, 0, 1]]),
                         num_steps=3)
    tree = build_tree(sel, torch.tensor([1]), torch.tensor([4]))
    argmax = torch.tensor([[20, 21, 22, 23]])
    res = accept_simulated(tree, argmax, torch.zeros(1, 4), mean_accept_len=4.0)
    assert res.accept_index.tolist() == [[0, 1, 3, -1]]
    assert res.tokens.tolist() == [[10, 12, 23, -1]] and res.bonus.tolist() == [23]
    with pytest.raises(ValueError):
        accept_simulated(tree, argmax, torch.zeros(1, 4))
    with pytest.raises(ValueError):
        accept_simulated(tree, argmax, torch.zeros(1, 4), mean_accept_len=2.0,
                        accept_rates=[1, 1, 1])
    with pytest.raises(ValueError):
        accept_simulated(tree, argmax, torch.zeros(1, 4), mean_accept_len=5.5)
    with pytest.raises(ValueError):
        accept_simulated(tree, argmax, torch.zeros(1, 4), accept_rates=[0.5, 0.5])


def test_empty_batch():
    sel = DraftSelection(tokens=torch.zeros(0, 3, dtype=torch.long),
                         parents=torch.zeros(0, 3, dtype=torch.long), num_steps=2)
    tree = build_tree(sel, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    res = accept_greedy(tree, torch.zeros(0, 4, dtype=torch.long))
    assert res.accept_index.shape == (0, 3) and res.accept_lens.shape == (0,)
    res = accept_sample(tree, torch.zeros(0, 4, 5), torch.ones(0), torch.ones(0),
                        torch.zeros(0, 3))
    assert res.tokens.shape == (0, 3)
