"""Speculative stages as a few kernels each: tree organize, tree build, greedy accept walk,
simulated-accept chain, verify-window slots and accept compaction moves. One program per
request; every array of a request fits one block (BLOCK_C candidates, BLOCK_D tree nodes), so
the kernels are plain loads, compares and reductions.

The semantics (and the plain-torch references the tests compare against) are the stage
functions in mtplab/speculative/{tree,accept}.py; they call these kernels on CUDA and fall
back to their torch bodies (logged once) when a kernel fails. `MAX_CANDIDATES` bounds the
pairwise [C, C] tiles: larger candidate sets run the torch bodies.

Static grids, no host synchronisation: CUDA-graph capturable. Each kernel can carry a
captured stage's begin and/or end stamp (kernels/stamp.py `carried_begin` / `carried_end`):
organize the tree's begin, build_tree its end, the accept walks accept's end, window_slots
commit's begin.
"""
from __future__ import annotations

import torch

from ..lazy_triton import tl, triton
from .stamp import CARRY_CODES, Carried, carried_begin, carried_end, carry_args

MAX_CANDIDATES = 128


@triton.jit(do_not_specialize=CARRY_CODES)
def _organize_kernel(Scores, Tokens, Parents, OutTok, OutPar, C, n_sel,
                     stride_s, stride_t, stride_p, stride_ot, stride_op,
                     BLOCK_C: tl.constexpr,
                     Ring, Count, Clock, Done, code_b, code_e, st_mask,
                     STAMP_B: tl.constexpr, STAMP_E: tl.constexpr, GLOBALTIMER: tl.constexpr):
    """Best n_sel of C candidates by score (desc, ties to the lower index), in candidate
    order: node of a selected c = 1 + #selected below c; parent node = node of its parent
    candidate (0 = root)."""
    carried_begin(Ring, Count, Clock, code_b, st_mask, STAMP_B, GLOBALTIMER)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_C)
    ok = i < C
    s_i = tl.load(Scores + b * stride_s + i, mask=ok, other=float("-inf"))
    s_j = s_i[None, :]
    j = i[None, :]
    ahead = ((s_j > s_i[:, None]) | ((s_j == s_i[:, None]) & (j < i[:, None]))) & (j < C)
    rank = tl.sum(ahead.to(tl.int32), axis=1)
    sel = (rank < n_sel) & ok
    below = sel[None, :] & (j <= i[:, None])
    node = tl.sum(below.to(tl.int32), axis=1)               # 1-based node id where selected
    par_c = tl.load(Parents + b * stride_p + i, mask=ok, other=-1)
    is_par = (j == par_c[:, None].to(tl.int32))
    par_node = tl.sum(tl.where(is_par, node[None, :], 0), axis=1)   # 0 for the root (-1)
    tok = tl.load(Tokens + b * stride_t + i, mask=ok, other=0)
    tl.store(OutTok + b * stride_ot + node - 1, tok.to(tl.int64), mask=sel)
    tl.store(OutPar + b * stride_op + node - 1, par_node.to(tl.int64), mask=sel)
    carried_end(Done, Ring, Count, Clock, code_e, st_mask, STAMP_E, GLOBALTIMER)


def organize_triton(scores: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                    n: int, begin: Carried | None = None, end: Carried | None = None,
                    clock: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """scores/tokens/parents [B, C] -> (tokens, tree parents) [B, n] int64 (tree.organize);
    `begin` / `end`: the stamps it carries (kernels/stamp.py)."""
    B, C = scores.shape
    if C > MAX_CANDIDATES or n > C:
        raise ValueError(f"organize_triton selects n <= C <= {MAX_CANDIDATES} candidates, "
                         f"got n={n}, C={C}.")
    # no fill: exactly n candidates rank below n, so the kernel writes every entry (and is
    # the graph's first kernel, carrying the tree stage's begin)
    out_tok = torch.empty(B, n, dtype=torch.long, device=scores.device)
    out_par = torch.empty(B, n, dtype=torch.long, device=scores.device)
    if B and (n or begin or end):
        _organize_kernel[(B,)](scores, tokens, parents, out_tok, out_par, C, n,
                               scores.stride(0), tokens.stride(0), parents.stride(0),
                               out_tok.stride(0), out_par.stride(0),
                               BLOCK_C=max(16, triton.next_power_of_2(C)), num_warps=4,
                               **carry_args(begin, end, scores, clock))
    return out_tok, out_par


@triton.jit(do_not_specialize=CARRY_CODES)
def _build_tree_kernel(SelTok, SelPar, Bonus, Seq, Tok, Par, Depth, Pos, Mask, Next, Sib,
                       D, stride_sel_t, stride_sel_p, BLOCK_D: tl.constexpr,
                       Ring, Count, Clock, Done, code_b, code_e, st_mask,
                       STAMP_B: tl.constexpr, STAMP_E: tl.constexpr, GLOBALTIMER: tl.constexpr):
    """Node 0 = bonus (parent -1), nodes 1.. = the selection. Ancestors by walking parents
    (at most D-1 hops; parents of this request are re-read from SelPar)."""
    carried_begin(Ring, Count, Clock, code_b, st_mask, STAMP_B, GLOBALTIMER)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_D)
    ok = i < D
    draft = ok & (i > 0)
    par = tl.load(SelPar + b * stride_sel_p + i - 1, mask=draft, other=-1).to(tl.int32)
    par = tl.where(i == 0, -1, par)
    tok = tl.load(SelTok + b * stride_sel_t + i - 1, mask=draft, other=0)
    bonus = tl.load(Bonus + b)
    tok = tl.where(i == 0, bonus.to(tl.int64), tok.to(tl.int64))
    j = i[None, :]
    anc = (j == i[:, None]).to(tl.int32)            # int32, not i1, as a loop-carried value
    depth = tl.zeros([BLOCK_D], dtype=tl.int32)
    cur = par
    for _ in range(0, D - 1):
        anc = anc | (j == cur[:, None]).to(tl.int32)
        depth += (cur >= 0).to(tl.int32)
        nxt = tl.load(SelPar + b * stride_sel_p + cur - 1, mask=cur > 0, other=-1).to(tl.int32)
        cur = tl.where(cur > 0, nxt, -1)
    anc = (anc != 0) & (j < D) & ok[:, None]
    child = (par[None, :] == i[:, None]) & (j < D)           # [i, j]: j is a child of i
    first_child = tl.min(tl.where(child, j, BLOCK_D), axis=1)
    sib = (par[None, :] == par[:, None]) & (j > i[:, None]) & (j < D)
    next_sib = tl.min(tl.where(sib, j, BLOCK_D), axis=1)
    seq = tl.load(Seq + b).to(tl.int64)
    row = b * D + i
    tl.store(Tok + row, tok, mask=ok)
    tl.store(Par + row, par.to(tl.int64), mask=ok)
    tl.store(Depth + row, depth.to(tl.int64), mask=ok)
    tl.store(Pos + row, seq + depth.to(tl.int64), mask=ok)
    tl.store(Next + row, tl.where(first_child < BLOCK_D, first_child, -1).to(tl.int64), mask=ok)
    tl.store(Sib + row, tl.where(next_sib < BLOCK_D, next_sib, -1).to(tl.int64), mask=ok)
    tl.store(Mask + b * D * D + i[:, None] * D + j, anc.to(tl.uint8),
             mask=ok[:, None] & (j < D))
    carried_end(Done, Ring, Count, Clock, code_e, st_mask, STAMP_E, GLOBALTIMER)


def build_tree_triton(sel_tokens: torch.Tensor, sel_parents: torch.Tensor, bonus: torch.Tensor,
                      seq_lens: torch.Tensor, begin: Carried | None = None,
                      end: Carried | None = None, clock: torch.Tensor | None = None):
    """-> (tokens, parents, depth, positions, mask, next_token, next_sibling), as
    tree.build_tree (sel_* [B, D-1] from organize, bonus/seq_lens [B]); `begin` / `end`:
    the stamps it carries."""
    B, n = sel_tokens.shape
    D = n + 1
    dev = sel_tokens.device
    outs = [torch.empty(B, D, dtype=torch.long, device=dev) for _ in range(4)]
    nxt, sib = (torch.empty(B, D, dtype=torch.long, device=dev) for _ in range(2))
    mask = torch.empty(B, D, D, dtype=torch.bool, device=dev)
    if B:
        _build_tree_kernel[(B,)](sel_tokens, sel_parents, bonus, seq_lens, *outs,
                                 mask.view(torch.uint8), nxt, sib, D, sel_tokens.stride(0),
                                 sel_parents.stride(0),
                                 BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=4,
                                 **carry_args(begin, end, bonus, clock))
    tok, par, depth, pos = outs
    return tok, par, depth, pos, mask, nxt, sib


@triton.jit(do_not_specialize=CARRY_CODES)
def _accept_greedy_kernel(Tok, Par, Argmax, Index, Lens, Out, Bonus, D,
                          S: tl.constexpr, BLOCK_D: tl.constexpr,
                          Ring, Count, Clock, Done, code_b, code_e, st_mask,
                          STAMP_B: tl.constexpr, STAMP_E: tl.constexpr, GLOBALTIMER: tl.constexpr):
    """Walk from the root: at each level the target's token after `cur` is accepted when a
    child of `cur` (lowest index first) carries it."""
    carried_begin(Ring, Count, Clock, code_b, st_mask, STAMP_B, GLOBALTIMER)
    b = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK_D)
    ok = j < D
    tok = tl.load(Tok + b * D + j, mask=ok, other=-1)
    par = tl.load(Par + b * D + j, mask=ok, other=-2)
    base = b * (S + 1)
    cur = tl.full([], 0, tl.int64)
    alive = tl.full([], 1, tl.int32)
    n = tl.full([], 1, tl.int64)
    bonus = tl.full([], 0, tl.int64)
    tl.store(Index + base, cur)
    for k in tl.static_range(S):
        x = tl.load(Argmax + b * D + cur).to(tl.int64)
        tl.store(Out + base + k, tl.where(alive > 0, x, -1))
        bonus = tl.where(alive > 0, x, bonus)
        hit = (par == cur) & (tok == x) & ok & (alive > 0)
        nxt = tl.min(tl.where(hit, j, BLOCK_D), axis=0).to(tl.int64)
        alive = (nxt < BLOCK_D).to(tl.int32)
        cur = tl.where(alive > 0, nxt, cur)
        n += alive.to(tl.int64)
        tl.store(Index + base + k + 1, tl.where(alive > 0, nxt, -1))
    x = tl.load(Argmax + b * D + cur).to(tl.int64)
    tl.store(Out + base + S, tl.where(alive > 0, x, -1))
    tl.store(Lens + b, n)
    tl.store(Bonus + b, tl.where(alive > 0, x, bonus))
    carried_end(Done, Ring, Count, Clock, code_e, st_mask, STAMP_E, GLOBALTIMER)


def _accept_outputs(B: int, S: int, dev):
    """The AcceptResult buffers: (accept_index [B,S+1], accept_lens [B], tokens [B,S+1],
    bonus [B]) int64, written by the accept kernels."""
    return (torch.empty(B, S + 1, dtype=torch.long, device=dev),
            torch.empty(B, dtype=torch.long, device=dev),
            torch.empty(B, S + 1, dtype=torch.long, device=dev),
            torch.empty(B, dtype=torch.long, device=dev))


def accept_greedy_triton(tokens: torch.Tensor, parents: torch.Tensor, argmax: torch.Tensor,
                         num_steps: int, begin: Carried | None = None,
                         end: Carried | None = None, clock: torch.Tensor | None = None):
    """-> (accept_index [B,S+1], accept_lens [B], tokens [B,S+1], bonus [B]) int64, as
    accept.accept_greedy (tokens/parents/argmax [B, D] contiguous); `begin` / `end`: the
    stamps it carries."""
    B, D = tokens.shape
    S = num_steps
    index, lens, out, bonus = _accept_outputs(B, S, tokens.device)
    if B:
        _accept_greedy_kernel[(B,)](tokens.contiguous(), parents.contiguous(),
                                    argmax.contiguous(), index, lens, out, bonus, D, S=S,
                                    BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=1,
                                    **carry_args(begin, end, lens, clock))
    return index, lens, out, bonus


@triton.jit(do_not_specialize=CARRY_CODES)
def _accept_chain_kernel(Tok, Next, Argmax, N, Index, Lens, Out, Bonus, D,
                         S: tl.constexpr,
                         Ring, Count, Clock, Done, code_b, code_e, st_mask,
                         STAMP_B: tl.constexpr, STAMP_E: tl.constexpr, GLOBALTIMER: tl.constexpr):
    """Simulated acceptance: the first n nodes of the first chain (first children from the
    root), n clipped to the chain's length; then the bonus = argmax at the last of them."""
    carried_begin(Ring, Count, Clock, code_b, st_mask, STAMP_B, GLOBALTIMER)
    b = tl.program_id(0).to(tl.int64)
    row = b * D
    base = b * (S + 1)
    cur = tl.full([], 0, tl.int64)
    m = tl.full([], 1, tl.int64)                       # chain length (nodes)
    for _ in tl.static_range(S):
        nxt = tl.load(Next + row + cur)
        m += (nxt >= 0).to(tl.int64)
        cur = tl.where(nxt >= 0, nxt, cur)
    n = tl.minimum(tl.load(N + b).to(tl.int64), m)
    cur = tl.full([], 0, tl.int64)
    bonus = tl.full([], 0, tl.int64)
    for k in tl.static_range(S + 1):
        nxt = tl.load(Next + row + cur)
        am = tl.load(Argmax + row + cur).to(tl.int64)
        dtok = tl.load(Tok + row + tl.maximum(nxt, 0)).to(tl.int64)
        tl.store(Index + base + k, tl.where(k < n, cur, -1))
        tl.store(Out + base + k, tl.where(k < n - 1, dtok, tl.where(k == n - 1, am, -1)))
        bonus = tl.where(k == n - 1, am, bonus)
        cur = tl.where((k + 1 < n) & (nxt >= 0), nxt, cur)
    tl.store(Lens + b, n)
    tl.store(Bonus + b, bonus)
    carried_end(Done, Ring, Count, Clock, code_e, st_mask, STAMP_E, GLOBALTIMER)


def accept_chain_triton(tokens: torch.Tensor, next_token: torch.Tensor, argmax: torch.Tensor,
                        n: torch.Tensor, num_steps: int, begin: Carried | None = None,
                        end: Carried | None = None, clock: torch.Tensor | None = None):
    """-> (accept_index [B,S+1], accept_lens [B], tokens [B,S+1], bonus [B]) int64, as the
    chain part of accept.accept_simulated (tokens/next_token/argmax [B, D], n [B]);
    `begin` / `end`: the stamps it carries."""
    B, D = tokens.shape
    S = num_steps
    index, lens, out, bonus = _accept_outputs(B, S, tokens.device)
    if B:
        _accept_chain_kernel[(B,)](tokens.contiguous(), next_token.contiguous(),
                                   argmax.contiguous(), n.contiguous(), index, lens, out, bonus,
                                   D, S=S, num_warps=1, **carry_args(begin, end, lens, clock))
    return index, lens, out, bonus


@triton.jit(do_not_specialize=CARRY_CODES)
def _window_slots_kernel(Table, Rows, Seq, Out, stride_t, D, BLOCK_D: tl.constexpr,
                         Ring, Count, Clock, Done, code_b, code_e, st_mask,
                         STAMP_B: tl.constexpr, STAMP_E: tl.constexpr, GLOBALTIMER: tl.constexpr):
    carried_begin(Ring, Count, Clock, code_b, st_mask, STAMP_B, GLOBALTIMER)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_D)
    ok = i < D
    row = tl.load(Rows + b).to(tl.int64)
    seq = tl.load(Seq + b).to(tl.int64)
    slot = tl.load(Table + row * stride_t + seq + i, mask=ok, other=0)
    tl.store(Out + b * D + i, slot.to(tl.int64), mask=ok)
    carried_end(Done, Ring, Count, Clock, code_e, st_mask, STAMP_E, GLOBALTIMER)


def window_slots_triton(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                        num_draft_tokens: int, begin: Carried | None = None,
                        end: Carried | None = None,
                        clock: torch.Tensor | None = None) -> torch.Tensor:
    """[B, D] int64 req_to_token[rows, seq_lens + 0..D-1] (commit.window_slots); `begin` /
    `end`: the stamps it carries."""
    B, D = rows.shape[0], num_draft_tokens
    out = torch.empty(B, D, dtype=torch.long, device=rows.device)
    if B:
        _window_slots_kernel[(B,)](req_to_token, rows.contiguous(), seq_lens.contiguous(), out,
                                   req_to_token.stride(0), D,
                                   BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=1,
                                   **carry_args(begin, end, out, clock))
    return out


@triton.jit
def _accept_moves_kernel(Window, Index, Src, Dst, Valid, RowIdx, D, L,
                         BLOCK_L: tl.constexpr):
    """Lane k: valid = index[k] >= 0; src = window[index[k]], dst = window[k] (k < D), the
    root slot window[0] on invalid lanes; row_index = b*D + node (root if invalid)."""
    b = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, BLOCK_L)
    ok = k < L
    idx = tl.load(Index + b * L + k, mask=ok, other=-1).to(tl.int64)
    valid = idx >= 0
    node = tl.where(valid, idx, 0)
    root = tl.load(Window + b * D)
    src = tl.load(Window + b * D + node, mask=ok, other=0)
    front = tl.load(Window + b * D + k, mask=ok & (k < D), other=0)
    tl.store(Src + b * L + k, tl.where(valid, src, root), mask=ok)
    tl.store(Dst + b * L + k, tl.where(valid & (k < D), front, root), mask=ok)
    tl.store(Valid + b * L + k, valid.to(tl.uint8), mask=ok)
    tl.store(RowIdx + b * L + k, b * D + node, mask=ok)


def accept_moves_triton(window: torch.Tensor, accept_index: torch.Tensor):
    """-> (src_slots, dst_slots, valid, row_index) [B, S+1] (commit.accept_moves)."""
    B, D = window.shape
    L = accept_index.shape[1]
    dev = window.device
    src, dst, row = (torch.empty(B, L, dtype=torch.long, device=dev) for _ in range(3))
    valid = torch.empty(B, L, dtype=torch.bool, device=dev)
    if B:
        _accept_moves_kernel[(B,)](window.contiguous(), accept_index.contiguous(), src, dst,
                                   valid.view(torch.uint8), row, D, L,
                                   BLOCK_L=max(16, triton.next_power_of_2(L)), num_warps=1)
    return src, dst, valid, row
