"""The speculative (spec v2) worker: a target worker plus a draft worker (draft_worker.py).

One decode iteration over B requests (seq_lens = kv_committed_len, the bonus has no KV yet;
the file of each stage: docs/design.md "Stage → file map"):

    stage         what
    resolve       seq_lens [B], bonus [B], hidden [B,H] (+ top-k) from the future map
    draft         seed (draft.seed) + S-1 forwards, each with its top-k and cumulative
                  scores (draft.step)
    tree          best D-1 candidates + root -> tokens/positions/mask
    verify        target forward over B*D nodes, KV at seq_len+node
    accept        greedy / target-only sampling / simulated
    commit        topk>1: accepted path's KV to the window front; new lengths, path hidden
                  rows
    publish       seq_lens[rows] <- seq_lens + accept_lens
    draft_extend  eagle: forward over the S+1 window -> next top-k
                  (frozen: the next seed is selected, no forward)
    stash         future map[rows] <- next inputs
    (draft)   zb_draft_preexec: the next round's draft runs now and its candidates are
              stashed; the next iteration starts at `tree`
The host then reads tokens[:, :accept_len] and advances kv_committed_len by accept_len.

The step as data: `plan()` lists the step's segments in order, each a `Call` of the one
segment table below, naming the values it reads (per parameter) and the values each of
its outputs becomes. One executor runs a plan three ways:

    eager          values in a dict, one span per stage (`_SpanChain`): CPU, batches above
                   the largest bucket, and steps no graph covers
    stage graphs   graph_granularity="stage": one CUDA graph per segment and batch bucket.
                   Every value is a persistent device buffer (max bucket rows): a graph
                   reads its inputs from the buffers and writes its outputs into the buffers
                   its readers read (copies captured in the graph), so a replay takes no
                   input copy; the host stages rows and seeds when the batch changes
    step graph     graph_granularity="step": the whole plan captured as one graph per bucket
                   and plan (resolve .. stash, one replay per step); values flow inside it

    segment       stages                          reads -> writes (value names = buffers)
    resolve       resolve                         rows -> seq_lens, d_seq, bonus, draft
                                                  inputs | pre-drafted candidates
    draft.seed    draft.seed (unfolded frozen)    bonus, d_hidden -> d_hidden, d_topk_*
    draft         draft (+ stash if preexec)      d_seq, bonus / d_hidden, d_topk_* ->
                                                  scores, cand_tokens, cand_parents
    tree          tree                            seq_lens, bonus, candidates -> the tree
    verify        verify                          seq_lens, tokens, positions, mask ->
                                                  logits, hidden_all, finite
    accept        accept                          the tree, logits (, seeds), finite ->
                                                  accept_index, accept_lens, acc_tokens,
                                                  bonus (the next round's root), host_tokens
                                                  (acc_tokens, NONFINITE_TOKEN rows where
                                                  the verify was not finite: the host's copy)
    commit        commit, publish (+ stash)       ... -> d_seq (new lengths), hidden_path,
                                                  d_hidden (frozen: the next seed)
    draft_extend  draft_extend, stash (eagle)     ... -> d_hidden, d_topk_*
    draft         (preexec: the next round's draft on the values commit/extend wrote)
An off step (num_steps 0: a speculation schedule's bucket without speculation,
speculative/schedule.py) runs resolve (seq_lens, bonus), `tree.root` (the tree is the root),
verify over that one node, accept (the target's token), commit and the draft's extend with
accept_len 1: the next draft inputs are stashed as after any verify (Frozen-KV: the token and
its target hidden, a selection; EAGLE: one draft_extend forward, its KV kept current).
`bonus`, `d_seq` and `d_hidden` are overwritten in the step (after their last reader of the
old value): what the pre-executed draft reads is what the next round's draft would.
Graph padding lanes (bs < bucket) carry row 0 (the padding page) and the pads of `VALUES`
through every segment. A graph of several stages is replayed inside the span of its first
stage: its later stages are visible to the meter (stamps inside the graph), not to the
profiler (one replay = one host span); a step graph is replayed inside a `resolve` span.
Sampled (temperature > 0) batches accept eagerly (target-only tree sampling); under
graph_granularity="step" such a step runs by stages, eagerly.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from typing import Callable, NamedTuple, Optional, Sequence

import numpy as np
import torch

from ..core import DecodeInputs, DecodeOut, DraftInputs, PrefillInputs
from ..graphs.runner import GraphRunner, default_buckets
from ..kernels.sampling import SIMULATE, finite_rows, flag_nonfinite, position_uniform
from ..kernels.topk import argmax as vocab_argmax
from .accept import accept_greedy, accept_sample, accept_simulated
from .commit import commit
from .draft_select import StepCandidates, num_candidates
from .draft_worker import DraftWorker
from .target_worker import TargetWorker, prefill_kv_lens
from .tree import DraftTree, build_tree, organize
from .verify import verify


class _SpanChain:
    """An eager multi-stage segment: one stage span at a time; calling it with a name ends the
    current one and begins `name` (the eager twin of a graph's marks)."""

    captured = False              # the future map's tail runs as its eager ops, stage by stage

    def __init__(self, spans, stages: tuple[str, ...]):
        self.spans, self.stages = spans, stages

    def __enter__(self):
        self.cur = self.spans.stage(self.stages[0])
        self.cur.__enter__()
        return self

    def __call__(self, name: str) -> None:
        self.cur.__exit__(None, None, None)
        self.cur = self.spans.stage(name)
        self.cur.__enter__()

    def __exit__(self, *exc):
        if self.cur is not None:
            self.cur.__exit__(*exc)
            self.cur = None
        return False

    def finish(self) -> None:
        """The segment is done: its last span ends (a step's marks, `_EagerMarks`)."""
        self.__exit__(None, None, None)


class _EagerMarks:
    """`marks(i)` of a step function run eagerly: segment i's stage spans (`_SpanChain`)
    open until the step function finishes it; `close` ends one left open by an error."""

    def __init__(self, spans, plan):
        self.spans, self.plan, self.open = spans, plan, None

    def __call__(self, i: int):
        self.open = _SpanChain(self.spans, self.plan[i].stages).__enter__()
        return self.open

    def close(self, exc) -> None:
        if self.open is not None:
            self.open.__exit__(type(exc), exc, None)


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


MOVE_ROWS = "move_rows"     # the future map's kernel: it takes its stamps from `mark.carry`


@dataclass(frozen=True)
class Call:
    """One segment run of a step's plan (a row of the module's segment table).
    `key`: its graph under stage granularity (a segment run twice with the same reads shares
    one); `carry`: the kernels that carry the segment's begin and end stamps when captured,
    (begin op, end op): dispatched ops, handed their stamps inside `dispatch` by the capture
    (graphs/runner.py `carry_ops`), or MOVE_ROWS; None where a stamp node marks it;
    `reads`: (parameter, value) pairs; `writes`: per output, the values it becomes (VALUES);
    `graphed`: False for a segment that always runs eagerly (the unfolded seed in stage
    graphs, sampled accept)."""
    key: str
    stages: tuple[str, ...]
    carry: tuple[Optional[str], Optional[str]]
    reads: tuple[tuple[str, str], ...]
    writes: tuple[tuple[str, ...], ...]
    graphed: bool = True

    @property
    def carry_begin(self) -> bool:
        """No begin node: the segment's first kernel carries its begin stamp."""
        return self.carry[0] is not None

    @property
    def plain(self) -> bool:
        """fn takes no `mark`: one stage, and no future-map kernel to hand stamps to."""
        return len(self.stages) == 1 and MOVE_ROWS not in self.carry


class Value(NamedTuple):
    """A value of the step: its shape after the batch dim (sizes named as in `_sizes`), its
    dtype ("hidden": the hidden states' dtype), its pad on graph-padding lanes and, for a
    value resolve reads, its future-map field."""
    shape: tuple[str, ...]
    dtype: object
    pad: int
    field: Optional[str] = None


_L, _F, _B = torch.long, torch.float32, torch.bool
# Every value a step can hold: the segment table's reads and writes name these. The stage
# graphs' persistent buffers, GraphRunner's pads, resolve's fields and pads all read here.
# Padding lanes (bs < bucket) carry row 0 (the padding page) and these pads through every
# segment (resolve pads from row 0: it must not read what padding lanes last wrote there).
VALUES = {
    "rows": Value((), _L, 0), "seeds": Value((), _L, 0),
    "seq_lens": Value((), _L, 1, "seq_lens"), "d_seq": Value((), _L, 1, "seq_lens"),
    "bonus": Value((), _L, 0, "bonus"), "d_hidden": Value(("H",), "hidden", 0, "hidden"),
    "d_topk_logp": Value(("Ks",), _F, 0, "topk_logp"),
    "d_topk_index": Value(("Ks",), _L, 0, "topk_index"),
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
TREE_OUT = ("tokens", "parents", "depth", "positions", "mask", "next_token", "next_sibling")


class SpecWorker:
    """decode() runs the plan of the step (module doc): a step graph, stage graphs, or
    eagerly."""

    def __init__(self, target: TargetWorker, draft: DraftWorker, future_map, params: SpecParams,
                 cuda_graphs: bool = False, graph_max_bs: int = 32,
                 granularity: str = "stage", graph_buckets: Optional[list[int]] = None):
        self.spans = target.spans
        self.target = target
        self.draft_worker = draft
        self.future_map = future_map
        self.p = params
        self.table = target.table
        self.granularity = granularity
        self.graphs: dict[str, GraphRunner] = {}          # stage graphs by Call.key
        self.step_graphs: dict[tuple, GraphRunner] = {}    # step graphs by plan key
        self.bufs: dict[str, torch.Tensor] = {}            # persistent values (stage graphs)
        self._plans: dict[tuple, tuple[Call, ...]] = {}
        self._staged: dict[str, tuple] = {}                # host value -> (tensor, bs) staged
        self._views: dict[tuple, torch.Tensor] = {}        # (value, bs) -> bufs[value][:bs]
        # zb_draft_preexec, owned here: rows whose next draft already ran (in their last
        # decode, with no prefill since), and the last decode's host rows
        C = num_candidates(params.num_steps, params.topk)
        if params.draft_preexec and future_map.pre_scores.shape[1] < C:
            future_map.hold_predrafts(C)
        self._drafted = np.zeros(future_map.seq_lens.shape[0], dtype=bool)
        self._last_rows: Optional[np.ndarray] = None
        self.max_bs = 0
        buckets = default_buckets(graph_max_bs) if graph_buckets is None else graph_buckets
        if cuda_graphs and buckets:
            self._capture(buckets)

    @property
    def device(self):
        return self.target.device

    def close(self) -> None:
        """Release the captured graphs (each graph's function holds this worker), the
        target worker's too."""
        for r in self.runners():
            r.close()
        self.graphs.clear()
        self.step_graphs.clear()
        self.bufs.clear()
        self._views.clear()
        self._staged.clear()
        self.target.close()

    def runners(self) -> list[GraphRunner]:
        """Every captured graph runner (instrument/hostclock.py counts their replays)."""
        return list(self.graphs.values()) + list(self.step_graphs.values())

    # -- prefill / decode ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, x: PrefillInputs) -> torch.Tensor:
        self._drafted[x.host_rows if x.host_rows is not None else slice(None)] = False
        self._last_rows = None
        bonus, hidden, report = self.target.prefill_with_hidden(x)
        with self.spans.stage("publish"):
            self.future_map.publish(x.rows, prefill_kv_lens(x))
        nxt = self.draft_worker.after_prefill(
            bonus, hidden[x.cu_q[1:] - 1], fed_ids=x.input_ids, hidden_all=hidden, rows=x.rows,
            q_lens=x.q_lens, cu_q=x.cu_q, positions=x.positions, max_q=x.max_q,
            max_kv=x.max_kv or x.max_q, next_ids=x.next_ids)
        with self.spans.stage("stash"):
            self.future_map.stash(x.rows, nxt)
        return report

    def decode(self, x: DecodeInputs) -> DecodeOut:
        """One decode iteration. The outputs are views of graph buffers when graphed: valid
        until the next decode is launched (the scheduler copies them out before). Graph
        replays need no autograd mode; eager segments run under no_grad."""
        bs = x.rows.shape[0]
        greedy = x.all_greedy or self.p.simulated
        pre = self._predrafted(x.host_rows)
        out = None
        if bs <= self.max_bs:
            g = self.step_graphs.get((pre, greedy))
            if g is not None:
                self._stage_host(g.static, x, bs)
                with self.spans.stage("resolve", graphed=True):
                    out = g.replay(bs)
                self.future_map.mark_published()     # after the replay that published
            elif self.graphs:
                out = self._run_stages(self.plan(pre, greedy), x, bs)
        if out is None:
            with torch.no_grad():
                v = self._run_eager(self.plan(pre, greedy), x)
            out = v["host_tokens"], v["accept_lens"]
        return DecodeOut(*out, predrafted=pre, draft_tokens=self.p.num_draft_tokens - 1)

    def forget_predrafts(self, rows=None) -> None:
        """Rows (all when None) hold no candidates this worker pre-drafted: prefilled, or
        decoded by another setting's worker since (speculative/schedule.py)."""
        self._drafted[slice(None) if rows is None else rows] = False
        self._last_rows = None

    def _predrafted(self, rows: np.ndarray) -> bool:
        """This decode starts at `tree` on candidates the last round pre-drafted: every row
        was decoded with zb_draft_preexec and not prefilled since. Then the rows hold
        pre-drafted candidates once this decode has run (its plan ends with the next draft)."""
        if not self.p.draft_preexec:
            return False
        pre = rows is self._last_rows or bool(self._drafted[rows].all())
        if rows is not self._last_rows:
            self._drafted[rows] = True
            self._last_rows = rows
        return pre

    # -- the plan: the segment table, in step order -----------------------------------------------
    def plan(self, predrafted: bool, greedy: bool) -> tuple[Call, ...]:
        """The Calls of one decode step (module doc), cached per (predrafted, greedy)."""
        key = (predrafted, greedy)
        if key not in self._plans:
            self._plans[key] = self._make_plan(predrafted, greedy)
        return self._plans[key]

    def _make_plan(self, predrafted: bool, greedy: bool) -> tuple[Call, ...]:
        p, dw = self.p, self.draft_worker
        eagle, preexec = dw.extend_forward, p.draft_preexec
        off = p.num_steps == 0          # target-only steps that keep the draft's inputs
        assert not (off and (preexec or predrafted)), "an off step drafts nothing ahead"
        seed_call = dw.seed_forward and not p.fold_seed
        stage_graphs = self.granularity == "stage"
        draft_in = ("bonus", "d_hidden") if p.fold_seed else \
            ("d_hidden", "d_topk_logp", "d_topk_index")
        nodes = (None, None)   # begin and end stamp nodes: no kernel carries them

        def draft_calls() -> list[Call]:
            out = []
            if seed_call:      # the unfolded seed: eager between stage graphs
                out.append(Call("draft.seed", ("draft.seed",), nodes,
                                (("rows", "rows"), ("seq_lens", "d_seq"), ("bonus", "bonus"),
                                 ("hidden", "d_hidden")),
                                (("d_hidden",), ("d_topk_logp",), ("d_topk_index",)),
                                graphed=not stage_graphs))
            params = ("bonus", "hidden") if p.fold_seed else ("hidden", "topk_logp", "topk_index")
            out.append(Call("draft", ("draft", "stash") if preexec else ("draft",),
                            (None, MOVE_ROWS if preexec else None),
                            (("rows", "rows"), ("seq_lens", "d_seq")) + tuple(zip(params, draft_in)),
                            (("scores",), ("cand_tokens",), ("cand_parents",))))
            return out

        res = ("seq_lens", "bonus") + (() if off else
                                       ("scores", "cand_tokens", "cand_parents") if predrafted
                                       else ("d_seq", "d_hidden") +
                                       (("d_topk_logp", "d_topk_index") if eagle else ()))
        calls = [Call("resolve.pre" if predrafted else "resolve", ("resolve",),
                      (MOVE_ROWS, MOVE_ROWS),
                      (("rows", "rows"),), tuple((v,) for v in res))]
        if not (predrafted or off):
            calls += draft_calls()
        common = (("rows", "rows"), ("seq_lens", "seq_lens"))
        if off:                # the tree is its root: no kernel of ours, stamp nodes
            calls.append(Call("tree.root", ("tree",), nodes, common + (("bonus", "bonus"),),
                              tuple((v,) for v in TREE_OUT)))
        else:
            calls.append(Call("tree", ("tree",), ("organize", "build_tree"),
                              common + (("bonus", "bonus"), ("scores", "scores"),
                                        ("tokens", "cand_tokens"),
                                        ("parents", "cand_parents")),
                              tuple((v,) for v in TREE_OUT)))
        calls.append(Call("verify", ("verify",), nodes,
                          common + (("tokens", "tokens"), ("positions", "positions"),
                                    ("mask", "mask")),
                          (("logits",), ("hidden_all",), ("finite",))))
        acc_writes = (("accept_index",), ("accept_lens",), ("acc_tokens",), ("bonus",),
                      ("host_tokens",))
        if greedy:
            walk = "accept_chain" if p.simulated else "accept_greedy"
            calls.append(Call("accept", ("accept",), ("argmax", walk),
                              common + tuple((k, k) for k in ("tokens", "parents", "next_token",
                                                              "logits", "seeds", "finite")),
                              acc_writes))
        else:
            calls.append(Call("accept.sample", ("accept",), nodes,
                              (("seq_lens", "seq_lens"), ("logits", "logits"), ("seeds", "seeds"),
                               ("temperature", "temperature"), ("top_p", "top_p"),
                               ("finite", "finite")) +
                              tuple((k, k) for k in TREE_OUT), acc_writes, graphed=False))
        extra = () if eagle else (("tokens", "acc_tokens"), ("bonus", "bonus"))
        calls.append(Call("commit", ("commit", "publish") + (() if eagle else ("stash",)),
                          ("window_slots", MOVE_ROWS),
                          common + (("accept_index", "accept_index"),
                                    ("accept_lens", "accept_lens"),
                                    ("hidden", "hidden_all")) + extra,
                          (("d_seq",), ("hidden_path",), () if eagle else ("d_hidden",))))
        if eagle:
            calls.append(Call("draft_extend", ("draft_extend", "stash"), (None, MOVE_ROWS),
                              common + (("tokens", "acc_tokens"), ("hidden_path", "hidden_path"),
                                        ("accept_lens", "accept_lens"), ("bonus", "bonus")),
                              (("d_hidden",), ("d_topk_logp",), ("d_topk_index",))))
        if preexec:            # the next round's draft, on what commit / extend wrote
            calls += draft_calls()
        return tuple(calls)

    def _fn(self, c: Call, max_kv: int) -> Callable:
        """The segment function of a Call (pure tensor functions: eager with a host max_kv,
        or captured with W)."""
        if c.key.startswith("resolve"):
            return self._resolve_fn(c)
        if c.key == "accept.sample":
            return self._accept_sample_fn()
        make = {"draft.seed": self._seed_fn, "draft": self._draft_fn, "tree": self._tree_fn,
                "tree.root": self._root_tree_fn,
                "verify": self._verify_fn, "accept": self._accept_fn,
                "commit": self._commit_fn, "draft_extend": self._extend_fn}[c.key]
        return make(max_kv)

    # -- the executor ----------------------------------------------------------------------------
    def _run_eager(self, plan: tuple[Call, ...], x: DecodeInputs) -> dict:
        """The step function a step graph captures, run eagerly with spans as its marks."""
        marks = _EagerMarks(self.spans, plan)
        try:
            return self._step_fn(plan, x.max_kv)(
                marks, rows=x.rows, seeds=x.sampling.seeds,
                temperature=x.sampling.temperature, top_p=x.sampling.top_p)
        except BaseException as e:
            marks.close(e)
            raise

    def _step_fn(self, plan: tuple[Call, ...], max_kv: int) -> Callable:
        """step(marks, **host values) -> every value of the step: the plan's segments in
        order, `marks(i)` beginning segment i (a graph's stamps or an eager twin's spans)
        and its `finish()` ending it."""
        fns = [self._fn(c, max_kv) for c in plan]

        def step(marks, **v):
            for i, (c, fn) in enumerate(zip(plan, fns)):
                m = marks(i)
                args = {p: v[val] for p, val in c.reads}
                out = fn(**args) if c.plain else fn(**args, mark=m)
                m.finish()
                if not m.captured and "publish" in c.stages:
                    self.future_map.mark_published()
                self._bind(v, c, out)
            return v
        return step

    def _call_eager(self, c: Call, fn, args: dict, bs: int) -> None:
        """One segment eagerly, its outputs written into the graph buffers, all inside its
        stage spans (its last span covers the writes: no device work outside a stage)."""
        with torch.no_grad(), _SpanChain(self.spans, c.stages) as chain:
            out = fn(**args) if c.plain else fn(**args, mark=chain)
            for vals, o in zip(c.writes, out):
                for val in vals:
                    self._fill(val, o, bs)

    @staticmethod
    def _bind(v: dict, c: Call, out) -> None:
        for vals, o in zip(c.writes, out):
            for val in vals:
                v[val] = o

    def _run_stages(self, plan: tuple[Call, ...], x: DecodeInputs, bs: int) -> tuple:
        """Stage graphs: each graphed segment one replay on the buffers (no input copy); an
        eager segment reads the buffers and writes its outputs into them.
        -> (host_tokens, accept_lens) views of the buffers."""
        self._stage_host(self.bufs, x, bs)
        for c in plan:
            if c.graphed:
                with self.spans.stage(c.stages[0], graphed=True):
                    self.graphs[c.key].replay(bs)
            else:
                args = {p: self._view(val, bs) if val in self.bufs else
                        self._host_value(val, x) for p, val in c.reads}
                self._call_eager(c, self._fn(c, self.table.shape[1]), args, bs)
            if "publish" in c.stages:
                self.future_map.mark_published()
        return self._view("host_tokens", bs), self._view("accept_lens", bs)

    @staticmethod
    def _host_value(val: str, x: DecodeInputs) -> torch.Tensor:
        """A value the host hands an eager segment directly (sampling parameters)."""
        return {"temperature": x.sampling.temperature, "top_p": x.sampling.top_p}[val]

    def _view(self, val: str, bs: int) -> torch.Tensor:
        v = self._views.get((val, bs))
        if v is None:
            v = self._views[(val, bs)] = self.bufs[val][:bs]
        return v

    def _fill(self, val: str, t: torch.Tensor, bs: int) -> None:
        """An eager value into its buffer, padding lanes up to the bucket with its pad."""
        buf = self.bufs[val]
        buf[:bs].copy_(t)
        b = self._bucket(bs)
        if b > bs:
            buf[bs:b].fill_(VALUES_PAD[val])

    def _bucket(self, bs: int) -> int:
        return next(b for b in self._buckets if b >= bs)

    def _stage_host(self, static: dict, x: DecodeInputs, bs: int) -> None:
        """rows (and seeds) into their graph buffers when they are new tensors: the batch's
        are reused (never written in place) while it stays the same (sched/prepare.py)."""
        for val, t in (("rows", x.rows), ("seeds", x.sampling.seeds)):
            last = self._staged.get(val)
            if val not in static or (last is not None and last[0] is t and last[1] == bs):
                continue
            buf = static[val]
            buf[:bs].copy_(t, non_blocking=True)
            b = self._bucket(bs)
            if b > bs:
                buf[bs:b].fill_(VALUES_PAD[val])
            self._staged[val] = (t, bs)

    # -- segments (pure tensor functions; eager with a host max_kv, or captured with W) ---
    def _resolve_fn(self, c: Call):
        """resolve -> the Call's values from the future map. Captured: one kernel, carrying
        resolve's stamps (`carry_begin`), writing into `dst` (the stage graphs' buffers) or
        fresh tensors (a step graph); padding lanes (row 0) get the values' pads. Eager: the
        future map's gathers (with the consume-once checks of debug_future_map)."""
        fm = self.future_map
        names = tuple(vals[0] for vals in c.writes)

        def fn(rows, mark, dst=None):
            if not mark.captured:
                seq, inp = fm.resolve_seq_lens(rows), fm.gather(rows)
                pre = fm.gather_predraft(rows, self._sizes()["C"]) if "scores" in names \
                    else (None,) * 3
                got = dict(seq_lens=seq, d_seq=seq, bonus=inp.bonus, d_hidden=inp.hidden,
                           d_topk_logp=inp.topk_logp, d_topk_index=inp.topk_index,
                           scores=pre[0], cand_tokens=pre[1], cand_parents=pre[2])
                return tuple(got[k] for k in names)
            bs, size = rows.shape[0], self._sizes()
            out = []
            for k in names:      # this worker's widths (a schedule arm may read fewer columns)
                f = getattr(fm, VALUES[k].field)
                out.append(dst[k][:bs] if dst is not None else
                           f.new_empty((bs,) + tuple(size[d] for d in VALUES[k].shape)))
            fm.resolve_into(rows, [(o, VALUES[k].field, VALUES[k].pad, 0)
                                   for o, k in zip(out, names)], mark.carry("resolve"))
            return tuple(out)
        return fn

    def _seed_fn(self, max_kv: int):
        """The unfolded Frozen-KV seed: (bonus, hidden) -> (h0, topk_logp, topk_index)."""
        dw = self.draft_worker

        def fn(rows, seq_lens, bonus, hidden):
            out = dw.seed(DraftInputs(bonus, hidden), rows, seq_lens, max_kv)
            return out.hidden, out.topk_logp, out.topk_index
        return fn

    def _draft_fn(self, max_kv: int):
        """-> the S steps' candidates concatenated: (scores, tokens, parents) [B, C]
        (+ stash of them as the pre-drafted candidates with zb_draft_preexec)."""
        dw, fold, fm = self.draft_worker, self.p.fold_seed, self.future_map

        def fn(rows, seq_lens, mark=None, **fields):
            inp = DraftInputs(fields.pop("bonus", None), **fields)
            if fold:
                with self.spans.stage("draft.seed"):
                    inp = dw.seed(inp, rows, seq_lens, max_kv)
            steps = dw.steps(inp, rows, seq_lens, max_kv)
            cands = (torch.cat([c.scores for c in steps], 1),
                     torch.cat([c.tokens for c in steps], 1),
                     torch.cat([c.parents for c in steps], 1))
            if mark is not None:
                fm.write(rows, mark, predraft=cands)
            return cands
        return fn

    def _tree_fn(self, max_kv: int):
        """organize + build_tree (captured, the two kernels carry the stage's stamps)."""
        p = self.p

        def fn(rows, seq_lens, bonus, scores, tokens, parents):
            steps = [StepCandidates(tokens, scores, parents)]
            sel = replace(organize(steps, p.num_draft_tokens), num_steps=p.num_steps)
            return astuple(build_tree(sel, bonus, seq_lens))[:-1]
        return fn

    def _root_tree_fn(self, max_kv: int):
        """The tree of an off step: the root alone (the bonus at seq_len)."""
        def fn(rows, seq_lens, bonus):
            B, dev = bonus.shape[0], bonus.device
            none = torch.full((B, 1), -1, dtype=torch.long, device=dev)
            return (bonus.long()[:, None], none, torch.zeros_like(none),
                    seq_lens.long()[:, None], torch.ones(B, 1, 1, dtype=torch.bool, device=dev),
                    none, none.clone())
        return fn

    def _verify_fn(self, max_kv: int):
        """-> (logits [B, D, V], hidden [B, D, H], finite [B]: kernels/sampling.py
        finite_rows over request b's D nodes)."""
        def fn(rows, seq_lens, tokens, positions, mask):
            logits, hidden = verify(self.target, tokens, positions, rows, seq_lens, mask,
                                    max_kv)
            return logits, hidden, finite_rows(logits, hidden, rows.shape[0])
        return fn

    def _accept_fn(self, max_kv: int):
        """Greedy or simulated accept (the engine's static mode): graph friendly; captured,
        the argmax kernel carries the stage's begin and the walk its end."""
        p = self.p

        def fn(rows, seq_lens, tokens, parents, next_token, logits, seeds, finite):
            tree = DraftTree(tokens, parents, None, None, None, next_token, None, p.num_steps)
            # = logits.argmax(-1); split-V kernel on CUDA
            argmax = vocab_argmax(logits)
            if not p.simulated:
                acc = accept_greedy(tree, argmax)
            else:
                # level k decides position seq_len + 1 + k (not keyed by the step)
                u = position_uniform(seeds, seq_lens + 1, p.num_steps + 1, SIMULATE)
                acc = accept_simulated(tree, argmax, u, mean_accept_len=p.simulate_accept_len,
                                       accept_rates=p.simulate_accept_rates)
            # the committed tokens for the host (a copy: the device keeps acc.tokens), each
            # request's row NONFINITE_TOKEN where its verify logits were not finite
            return astuple(acc) + (flag_nonfinite(acc.tokens, finite),)
        return fn

    def _accept_sample_fn(self):
        """Target-only tree sampling (eager: temperature / top-p per lane)."""
        S = self.p.num_steps

        def fn(seq_lens, logits, seeds, temperature, top_p, finite, **tree):
            t = DraftTree(tree["tokens"], tree["parents"], tree["depth"], tree["positions"],
                          tree["mask"], tree["next_token"], tree["next_sibling"], S)
            # level k decides position seq + 1 + k: the uniform target-only sampling uses there
            u = position_uniform(seeds, seq_lens + 1, S + 1)
            acc = accept_sample(t, logits, temperature, top_p, u)
            return astuple(acc) + (flag_nonfinite(acc.tokens, finite),)
        return fn

    def _commit_fn(self, max_kv: int):
        """commit -> publish (-> the draft's selection -> stash, frozen); captured,
        window_slots carries commit's begin and the future map's kernel the rest."""
        p, fm, dw = self.p, self.future_map, self.draft_worker

        def fn(rows, seq_lens, accept_index, accept_lens, hidden, mark, tokens=None,
               bonus=None):
            new_seq, hidden_path, hidden_last = commit(
                self.target.kv, self.table, rows, seq_lens, accept_index, accept_lens, hidden,
                p.num_draft_tokens, move_kv=p.topk > 1)
            # no draft_extend forward: extend is a selection (no device work)
            nxt = None if dw.extend_forward else dw.extend(
                rows, seq_lens, tokens, bonus, hidden_path, hidden_last, accept_lens, max_kv)
            fm.write(rows, mark, seq_lens=new_seq, inputs=nxt)
            return new_seq, hidden_path, hidden_last
        return fn

    def _extend_fn(self, max_kv: int):
        """eagle's draft extend -> stash of the next draft inputs."""
        fm = self.future_map

        def fn(rows, seq_lens, tokens, hidden_path, accept_lens, bonus, mark):
            out = self.draft_worker.extend(rows, seq_lens, tokens, None, hidden_path, None,
                                           accept_lens, max_kv)
            fm.write(rows, mark, inputs=DraftInputs(bonus, out.hidden, out.topk_logp,
                                                    out.topk_index))
            return out.hidden, out.topk_logp, out.topk_index
        return fn

    # -- CUDA graphs -------------------------------------------------------------------------
    def _sizes(self) -> dict:
        """The sizes VALUES' shapes name: H hidden, Ks the stashed top-k's width (EAGLE: the
        run's topk, this worker reads its first topk), C draft candidates, D tree nodes,
        E = S+1 path lanes, V vocabulary."""
        p, fm = self.p, self.future_map
        return {"H": fm.hidden.shape[1],
                "Ks": p.topk if fm.topk_logp is None else fm.topk_logp.shape[1],
                "C": num_candidates(p.num_steps, p.topk) if p.num_steps else 0,
                "D": p.num_draft_tokens,
                "E": p.num_steps + 1, "V": self.target.model.config.vocab_size}

    def _capture(self, buckets: list[int]) -> None:
        """Capture the graphs of every plan the engine can run: one step graph per greedy
        (or simulated) plan, or the stage graphs of every plan's graphed segments over
        persistent value buffers (sampled steps accept eagerly between them). The consume-
        once check (debug_future_map) syncs: resolve then runs eagerly, between stage
        graphs (the config refuses it with graph_granularity "step")."""
        self._buckets = sorted(buckets)
        self.max_bs = max_bs = self._buckets[-1]
        W = self.table.shape[1]
        pres = (False, True) if self.p.draft_preexec else (False,)
        if self.granularity == "step":
            if self.future_map.poison:
                raise ValueError("a step graph captures resolve; debug_future_map cannot be.")
            dev = self.device
            self._step_static = {v: torch.zeros(max_bs, dtype=torch.long, device=dev)
                                 for v in ("rows", "seeds")}
            for pre in pres:
                self.step_graphs[(pre, True)] = self._capture_step(self.plan(pre, True), W)
            return
        plans = [self.plan(pre, greedy) for pre in pres for greedy in (True, False)]
        if self.future_map.poison:
            self._plans = {k: tuple(replace(c, graphed=False) if c.key.startswith("resolve")
                                    else c for c in plan) for k, plan in self._plans.items()}
            plans = list(self._plans.values())
        used = {val for plan in plans for c in plan for _, val in c.reads if val in VALUES}
        size, hdt, dev = self._sizes(), self.future_map.hidden.dtype, self.device
        self.bufs = {}
        for v in sorted(used | {"host_tokens", "accept_lens"}):
            shape, dtype, pad, _ = VALUES[v]
            self.bufs[v] = torch.full((max_bs,) + tuple(size[d] for d in shape), pad,
                                      dtype=hdt if dtype == "hidden" else dtype, device=dev)
        for plan in plans:
            for c in plan:
                if c.graphed and c.key not in self.graphs:
                    self.graphs[c.key] = self._capture_stage(c, W)

    def _capture_stage(self, c: Call, W: int) -> GraphRunner:
        """One segment's graph: reads its buffers, writes its outputs into the buffers of the
        values they become (resolve writes them itself)."""
        bufs, fn = self.bufs, self._fn(c, W)
        static = {p: bufs[val] for p, val in c.reads}
        resolve = c.key.startswith("resolve")

        def seg(mark=None, **args):
            bs = next(iter(args.values())).shape[0]
            if resolve:
                fn(**args, mark=mark, dst=bufs)
                return ()
            out = fn(**args) if c.plain else fn(**args, mark=mark)
            for vals, o in zip(c.writes, out):
                for val in vals:
                    if val in bufs:
                        bufs[val][:bs].copy_(o)
            return ()
        r = GraphRunner(torch.no_grad()(seg), static, {p: VALUES_PAD[v] for p, v in c.reads},
                        self._buckets, meter=self.spans.meter, stage=c.stages,
                        carry_begin=c.carry_begin, carry_ops=c.carry)
        with self.spans.paused():
            r.capture()
        return r

    def _capture_step(self, plan: tuple[Call, ...], W: int) -> GraphRunner:
        """The whole plan as one graph: static inputs rows and seeds, values flowing inside,
        each segment's stamps as in its own graph (GraphRunner `segments`)."""
        run = self._step_fn(plan, W)
        static = self._step_static             # shared by the plans' graphs: staged once

        def step(rows, seeds, marks):
            v = run(marks, rows=rows, seeds=seeds)
            return v["host_tokens"], v["accept_lens"]
        r = GraphRunner(torch.no_grad()(step), static, {"rows": 0, "seeds": 0}, self._buckets,
                        meter=self.spans.meter,
                        segments=[(c.stages, c.carry_begin, c.carry) for c in plan])
        with self.spans.paused():
            r.capture()
        return r

