"""The plan of one decode step: its segments in order, each a `Call` naming the values it
reads (per parameter), the values each of its outputs becomes, and the segment function that
runs it (speculative/segments.py). The executor (speculative/executor.py) runs a plan eagerly,
as stage graphs or as one step graph; the stage of each segment: docs/design.md
"Stage → file map".

    segment       stages                       reads -> writes (value names = buffers)
    resolve       resolve                      rows -> seq_lens, draft_seq_lens, bonus, the
                                               draft's inputs | pre-drafted candidates
    draft.seed    draft.seed (unfolded         bonus, draft_hidden -> draft_hidden,
                  Frozen-KV)                   draft_topk_*
    draft         draft (+ stash if preexec)   draft_seq_lens, bonus / draft_hidden,
                                               draft_topk_* -> scores, cand_tokens,
                                               cand_parents
    tree          tree                         seq_lens, bonus, candidates -> the tree
    verify        verify                       seq_lens, tokens, positions, mask -> logits,
                                               hidden_all, finite
    accept        accept                       the tree, logits (, seeds), finite ->
                                               accept_index, accept_lens, acc_tokens, bonus
                                               (the next round's root), host_tokens
                                               (acc_tokens, NONFINITE_TOKEN rows where the
                                               verify was not finite: the host's copy)
    commit        commit, publish (+ stash)    ... -> draft_seq_lens (new lengths),
                                               hidden_path, draft_hidden (Frozen-KV: the
                                               next seed)
    draft_extend  draft_extend, stash (EAGLE)  ... -> draft_hidden, draft_topk_*
    draft         (preexec: the next round's draft on the values commit / extend wrote)
An off step (num_steps 0: a speculation schedule's bucket without speculation,
speculative/arms.py) runs resolve (seq_lens, bonus), `tree.root` (the tree is the root),
verify over that one node, accept (the target's token), commit and the draft's extend with
accept_len 1: the next draft inputs are stashed as after any verify (Frozen-KV: the token and
its target hidden, a selection; EAGLE: one draft_extend forward, its KV kept current).
A target-only step (`target_plan`, no draft) is resolve and a one-node verify that picks its
token (an argmax, or the sampler) and publishes and stashes it in the same segment.
`bonus`, `draft_seq_lens` and `draft_hidden` are overwritten in the step (after their last
reader of the old value): what the pre-executed draft reads is what the next round's draft
would.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Optional, Sequence

import torch

MOVE_ROWS = "move_rows"     # the future map's kernel: it takes its stamps from `mark.carry`
NODES = (None, None)        # begin and end stamp nodes: no kernel of ours carries them


@dataclass(frozen=True, kw_only=True)
class SpecParams:
    num_steps: int
    topk: int
    num_draft_tokens: int
    fold_seed: bool = False
    draft_preexec: bool = False
    simulate_accept_len: Optional[float] = None
    simulate_accept_rates: Optional[Sequence[float]] = None

    @property
    def simulated(self) -> bool:
        return self.simulate_accept_len is not None or self.simulate_accept_rates is not None


@dataclass(frozen=True)
class Call:
    """One segment run of a step's plan.
    `key`: its graph under stage granularity (a segment run twice with the same reads shares
    one); `carry`: the kernels that carry the segment's begin and end stamps when captured,
    (begin op, end op): dispatched ops, handed their stamps inside `dispatch` by the capture
    (graphs/runner.py `carry_ops`), or MOVE_ROWS; None where a stamp node marks it;
    `reads`: (parameter, value) pairs; `writes`: per output, the values it becomes (VALUES);
    `make(call, max_kv)`: its segment function (segments.py; max_kv the host's bound eagerly,
    the row width W captured); `graphed`: False for a segment that always runs eagerly (the
    unfolded seed in stage graphs, sampled accept)."""
    key: str
    stages: tuple[str, ...]
    carry: tuple[Optional[str], Optional[str]]
    reads: tuple[tuple[str, str], ...]
    writes: tuple[tuple[str, ...], ...]
    make: Callable[["Call", int], Callable] = field(compare=False, repr=False)
    graphed: bool = True

    @property
    def carry_begin(self) -> bool:
        """No begin node: the segment's first kernel carries its begin stamp."""
        return self.carry[0] is not None

    @property
    def plain(self) -> bool:
        """fn takes no `mark`: one stage, and no future-map kernel to hand stamps to."""
        return len(self.stages) == 1 and MOVE_ROWS not in self.carry

    @property
    def resolves(self) -> bool:
        """The segment reads the future map (it writes its values into the stage graphs'
        buffers itself; the consume-once check keeps it eager)."""
        return self.stages == ("resolve",)


class Value(NamedTuple):
    """A value of the step: its shape after the batch dim (sizes named as in
    `Segments.sizes`), its dtype ("hidden": the hidden states' dtype), its pad on
    graph-padding lanes and, for a value resolve reads, its future-map field and what resolve
    adds to it."""
    shape: tuple[str, ...]
    dtype: object
    pad: int
    field: Optional[str] = None
    add: int = 0


_L, _F, _B = torch.long, torch.float32, torch.bool
# Every value a step can hold: the plans' reads and writes name these. The stage graphs'
# persistent buffers, GraphRunner's pads, resolve's fields and pads all read here. Padding
# lanes (bs < bucket) carry row 0 (the padding page) and these pads through every segment
# (resolve pads from row 0: it must not read what padding lanes last wrote there).
VALUES = {
    # the host's (staged when the batch changes, sched/prepare.py)
    "rows": Value((), _L, 0), "seeds": Value((), _L, 0),
    "temperature": Value((), _F, 0), "top_p": Value((), _F, 1),
    "seq_lens": Value((), _L, 1, "seq_lens"), "draft_seq_lens": Value((), _L, 1, "seq_lens"),
    "kv_lens": Value((), _L, 1, "seq_lens", 1),      # target-only: the fed token's KV counted
    "bonus": Value((), _L, 0, "bonus"), "draft_hidden": Value(("H",), "hidden", 0, "hidden"),
    "draft_topk_logp": Value(("Ks",), _F, 0, "topk_logp"),
    "draft_topk_index": Value(("Ks",), _L, 0, "topk_index"),
    "scores": Value(("C",), _F, 0, "pre_scores"), "cand_tokens": Value(("C",), _L, 0, "pre_tokens"),
    "cand_parents": Value(("C",), _L, -1, "pre_parents"),
    # the tree (speculative/tree.py DraftTree, in its field order)
    "tokens": Value(("D",), _L, 0), "parents": Value(("D",), _L, -1),
    "depth": Value(("D",), _L, 0), "positions": Value(("D",), _L, 0),
    "mask": Value(("D", "D"), _B, 1), "next_token": Value(("D",), _L, -1),
    "next_sibling": Value(("D",), _L, -1),
    "logits": Value(("D", "V"), _F, 0), "hidden_all": Value(("D", "H"), "hidden", 0),
    "finite": Value((), _B, 1),
    "accept_index": Value(("E",), _L, 0), "accept_lens": Value((), _L, 1),
    "acc_tokens": Value(("E",), _L, 0), "hidden_path": Value(("E", "H"), "hidden", 0),
    "host_tokens": Value(("E",), _L, 0),
}
VALUES_PAD = {k: v.pad for k, v in VALUES.items()}
HOST_VALUES = ("rows", "seeds", "temperature", "top_p")
OUTPUTS = ("host_tokens", "accept_lens")              # what a decode step hands the host
TREE_OUT = ("tokens", "parents", "depth", "positions", "mask", "next_token", "next_sibling")
ROWS = (("rows", "rows"), ("seq_lens", "seq_lens"))


def _each(names) -> tuple[tuple[str, ...], ...]:
    return tuple((v,) for v in names)


# -- the speculative step ---------------------------------------------------------------------
def decode_plan(seg, p: SpecParams, draft, predrafted: bool, greedy: bool,
                stage_graphs: bool) -> tuple[Call, ...]:
    """One speculative decode step, top-down: draft, verify, draft-extend (module doc).
    `seg`: the worker's segment functions (segments.py); `draft`: its draft worker's flags
    (seed_forward, extend_forward)."""
    eagle, off = draft.extend_forward, p.num_steps == 0
    assert not (off and (p.draft_preexec or predrafted)), "an off step drafts nothing ahead"
    drafts = () if (predrafted or off) else draft_segments(seg, p, draft, stage_graphs)
    return (resolve(seg, predrafted, off, eagle),
            *drafts,
            root_tree(seg) if off else tree(seg),
            verify(seg),
            accept(seg, p.simulated) if greedy else accept_sample(seg),
            commit(seg, eagle),
            *((draft_extend(seg),) if eagle else ()),
            # zb_draft_preexec: the next round's draft, on what commit / extend wrote
            *(draft_segments(seg, p, draft, stage_graphs) if p.draft_preexec else ()))


def resolve(seg, predrafted: bool, off: bool, eagle: bool) -> Call:
    """The step's inputs from the future map: lengths and bonus, then the draft's inputs or
    the candidates the last round pre-drafted (an off step reads neither)."""
    vals = ("seq_lens", "bonus") + (() if off else
                                    ("scores", "cand_tokens", "cand_parents") if predrafted
                                    else ("draft_seq_lens", "draft_hidden") +
                                    (("draft_topk_logp", "draft_topk_index") if eagle else ()))
    return Call("resolve.pre" if predrafted else "resolve", ("resolve",), (MOVE_ROWS, MOVE_ROWS),
                (("rows", "rows"),), _each(vals), seg.resolve)


def draft_segments(seg, p: SpecParams, draft, stage_graphs: bool) -> tuple[Call, ...]:
    """The draft: the unfolded Frozen-KV seed (eager between stage graphs), then the S steps;
    with zb_draft_preexec the candidates are stashed for the next round."""
    rows = (("rows", "rows"), ("seq_lens", "draft_seq_lens"))
    out = []
    if draft.seed_forward and not p.fold_seed:
        out.append(Call("draft.seed", ("draft.seed",), NODES,
                        rows + (("bonus", "bonus"), ("hidden", "draft_hidden")),
                        (("draft_hidden",), ("draft_topk_logp",), ("draft_topk_index",)), seg.seed,
                        graphed=not stage_graphs))
    inputs = ((("bonus", "bonus"), ("hidden", "draft_hidden")) if p.fold_seed else
              (("hidden", "draft_hidden"), ("topk_logp", "draft_topk_logp"),
               ("topk_index", "draft_topk_index")))
    preexec = p.draft_preexec
    out.append(Call("draft", ("draft", "stash") if preexec else ("draft",),
                    (None, MOVE_ROWS if preexec else None), rows + inputs,
                    (("scores",), ("cand_tokens",), ("cand_parents",)), seg.draft))
    return tuple(out)


def tree(seg) -> Call:
    return Call("tree", ("tree",), ("organize", "build_tree"),
                ROWS + (("bonus", "bonus"), ("scores", "scores"), ("tokens", "cand_tokens"),
                        ("parents", "cand_parents")), _each(TREE_OUT), seg.tree)


def root_tree(seg) -> Call:
    """An off step's tree: its root alone (no kernel of ours: stamp nodes)."""
    return Call("tree.root", ("tree",), NODES, ROWS + (("bonus", "bonus"),), _each(TREE_OUT),
                seg.root_tree)


def verify(seg) -> Call:
    return Call("verify", ("verify",), NODES,
                ROWS + (("tokens", "tokens"), ("positions", "positions"), ("mask", "mask")),
                (("logits",), ("hidden_all",), ("finite",)), seg.verify)


_ACCEPTED = _each(("accept_index", "accept_lens", "acc_tokens", "bonus", "host_tokens"))


def accept(seg, simulated: bool) -> Call:
    """Greedy (or simulated) accept: captured, the argmax kernel carries its begin and the
    walk its end."""
    return Call("accept", ("accept",), ("argmax", "accept_chain" if simulated else "accept_greedy"),
                ROWS + tuple((k, k) for k in ("tokens", "parents", "next_token", "logits",
                                              "seeds", "finite")),
                _ACCEPTED, seg.accept)


def accept_sample(seg) -> Call:
    """Target-only tree sampling: eager (temperature / top-p per lane)."""
    return Call("accept.sample", ("accept",), NODES,
                (("seq_lens", "seq_lens"), ("logits", "logits"), ("seeds", "seeds"),
                 ("temperature", "temperature"), ("top_p", "top_p"), ("finite", "finite")) +
                tuple((k, k) for k in TREE_OUT), _ACCEPTED, seg.accept_sample, graphed=False)


def commit(seg, eagle: bool) -> Call:
    """commit -> publish (-> the Frozen-KV draft's next inputs -> stash): window_slots
    carries the begin, the future map's kernel the rest."""
    extra = () if eagle else (("tokens", "acc_tokens"), ("bonus", "bonus"))
    return Call("commit", ("commit", "publish") + (() if eagle else ("stash",)),
                ("window_slots", MOVE_ROWS),
                ROWS + (("accept_index", "accept_index"), ("accept_lens", "accept_lens"),
                        ("hidden", "hidden_all")) + extra,
                (("draft_seq_lens",), ("hidden_path",), () if eagle else ("draft_hidden",)),
                seg.commit)


def draft_extend(seg) -> Call:
    """EAGLE's draft extend over the verify window -> stash of the next draft inputs."""
    return Call("draft_extend", ("draft_extend", "stash"), (None, MOVE_ROWS),
                ROWS + (("tokens", "acc_tokens"), ("hidden_path", "hidden_path"),
                        ("accept_lens", "accept_lens"), ("bonus", "bonus")),
                (("draft_hidden",), ("draft_topk_logp",), ("draft_topk_index",)), seg.draft_extend)


# -- the target-only step ---------------------------------------------------------------------
def target_plan(seg, greedy: bool) -> tuple[Call, ...]:
    """A target-only decode step: resolve (kv_lens = seq_lens + 1, the fed token), then a
    one-node verify that picks the token (greedy: an argmax, else the sampler) and publishes
    and stashes it."""
    return (Call("resolve", ("resolve",), (MOVE_ROWS, MOVE_ROWS), (("rows", "rows"),),
                 _each(("kv_lens", "bonus")), seg.resolve),
            Call("verify.token" if greedy else "verify.token.sample",
                 ("verify", "publish", "stash"), (None, MOVE_ROWS),
                 (("rows", "rows"), ("kv_lens", "kv_lens"), ("input_ids", "bonus")) +
                 (() if greedy else (("seeds", "seeds"), ("temperature", "temperature"),
                                     ("top_p", "top_p"))),
                 _each(OUTPUTS), seg.token if greedy else seg.token_sample))
