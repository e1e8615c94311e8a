"""The speculative (spec v2) worker: a target worker plus a draft worker (draft_worker.py).

One decode iteration over B requests (seq_lens = kv_committed_len, the bonus has no KV yet):

    stage         file                       what
    resolve       sched/future_map.py        seq_lens [B], bonus [B], hidden [B,H] (+ top-k)
    draft         draft_frozen.py / draft_eagle.py   seed (draft.seed) + S-1 forwards
                  draft_select.py            per-step top-k, cumulative scores (draft.step)
    tree          tree.py                    best D-1 candidates + root -> tokens/positions/mask
    verify        verify.py                  target forward over B*D nodes, KV at seq_len+node
    accept        accept.py                  greedy / target-only sampling / simulated
    commit        commit.py                  topk>1: accepted path's KV to the window front;
                                             new lengths, path hidden rows
    publish       sched/future_map.py        seq_lens[rows] <- seq_lens + accept_lens (+ event)
    draft_extend  draft_eagle.py             eagle: forward over the S+1 window -> next top-k
                                             (frozen: the next seed is selected, no forward)
    stash         sched/future_map.py        future map[rows] <- next inputs
    (draft)   zb_draft_preexec: the next round's draft runs now and its candidates are
              stashed; the next iteration starts at `tree`
The host then reads tokens[:, :accept_len] and advances kv_committed_len by accept_len.

CUDA graphs (bucketed by batch size, padded lanes on row 0), one per segment, each replay
wrapped in the span of its first stage; the small future-map stages ride in the graph
next to them, so a graphed step issues no eager launch between replays (and the bubble
meter's stamps of every stage are inside graphs):
    resolve graph   the future-map gathers, written straight into the static inputs of the
                    draft and tree graphs (padding lanes: seq_len 1, zeros)
    draft graph     frozen fold_seed=True : seed + S-1 steps in one replay
                    frozen fold_seed=False: seed eager (draft.seed, its own launches), then steps
                    eagle                 : S-1 steps
                    + stash (pre-drafted candidates) when zb_draft_preexec
    tree graph      organize + build_tree
    verify graph    the target over B*D tree nodes
    accept graph    greedy or simulated accept (sampled batches: eager tree sampling)
    commit graph    KV compaction, path hidden rows, new lengths + publish
                    (+ the draft's selection and stash when it has no draft_extend forward)
    draft_extend graph  eagle's draft extend + stash
A graph's stages after the first are visible to the meter (stamps inside the graph), not
to the profiler (one replay = one host span). Without graphs every stage runs eagerly in
its own span.
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from typing import Optional, Sequence

import torch

from ..core import DecodeInputs, DecodeOut, DraftInputs, PrefillInputs
from ..graphs.runner import GraphRunner, default_buckets
from ..kernels.sampling import SIMULATE, finite_rows, flag_nonfinite, position_uniform
from ..kernels.topk import argmax as vocab_argmax
from .accept import AcceptResult, accept_greedy, accept_sample, accept_simulated
from .commit import commit
from .draft_select import StepCandidates, num_candidates
from .draft_worker import DraftWorker
from .target_worker import TargetWorker, prefill_kv_lens
from .tree import DraftTree, build_tree, organize
from .verify import verify


class _SpanChain:
    """An eager multi-stage segment: one stage span at a time; calling it with a name ends the
    current one and begins `name` (the eager twin of a graph's marks)."""

    fused = False                 # the future map's tail runs as its eager ops, stage by stage

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
        self.cur.__exit__(*exc)
        return False

    def begin(self) -> None:
        """No stamp to carry: an eager stage's span stamps it (the graph twin's `begin`)."""
        return None


# segments whose first kernel is one of ours and carries the segment's begin stamp when
# captured (GraphRunner `carry_begin`): the future map's gathers, organize, the argmax, and
# window_slots; draft, verify and draft_extend begin with a stamp node
CARRY_BEGIN = ("resolve", "tree", "accept", "commit")


def _begin(mark):
    """A single-stage segment's begin stamp for its first kernel (None when eager)."""
    return mark.begin() if mark is not None else None


def _end(mark):
    """A single-stage segment's end stamp for its last kernel (None when eager)."""
    return mark.carry() if mark is not None else None


@dataclass(frozen=True)
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


class SpecWorker:
    """decode() is the stage list of the module map above; each stage is one `_run` (a graph
    replay when captured, else eager) or a future-map call, named as its stage."""

    def __init__(self, target: TargetWorker, draft: DraftWorker, future_map, params: SpecParams,
                 cuda_graphs: bool = False, graph_max_bs: int = 32):
        self.spans = target.spans
        self.target = target
        self.draft_worker = draft
        self.future_map = future_map
        self.p = params
        self.table = target.table
        self.graphs: dict[str, GraphRunner] = {}
        if cuda_graphs:
            self._capture(graph_max_bs)

    @property
    def device(self):
        return self.target.device

    def close(self) -> None:
        """Release the captured graphs (each graph's function holds this worker), the
        target worker's too."""
        for r in self.graphs.values():
            r.close()
        self.graphs.clear()
        self.target.close()

    # -- prefill / decode: the stage lists ---------------------------------------------------
    @torch.no_grad()
    def prefill(self, x: PrefillInputs) -> torch.Tensor:
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

    @torch.no_grad()
    def decode(self, x: DecodeInputs) -> DecodeOut:
        p, fm, M = self.p, self.future_map, x.max_kv
        rows, seq, inp, bonus, cands = self._resolve(x)
        if cands is None:
            cands = self._draft(rows, seq, inp, M)
        tree = self._tree(rows, seq, bonus, cands, M)
        logits, hidden, finite = self._run("verify", self._verify_fn, dict(
            rows=rows, seq_lens=seq, tokens=tree.tokens, positions=tree.positions,
            mask=tree.mask), M)
        acc = self._accept(tree, logits, x, seq)
        # commit + publish (+ the draft's selection + stash: no draft_extend forward)
        new_seq, hidden_path, hidden_last = self._run("commit", self._commit_fn, dict(
            rows=rows, seq_lens=seq, accept_index=acc.accept_index,
            accept_lens=acc.accept_lens, hidden=hidden,
            **self._commit_extra(acc)), M)
        fm.mark_published()
        nxt = self._extend(rows, seq, acc, hidden_path, hidden_last, M)
        if p.draft_preexec:     # the next round's draft (+ stash), before the host sees this
            self._draft(rows, new_seq, nxt, min(self.table.shape[1], M + p.num_steps + 1))
        # the committed tokens for the host (a copy: the device keeps acc.tokens), each
        # request's row NONFINITE_TOKEN where its verify logits were not finite
        return DecodeOut(flag_nonfinite(acc.tokens, finite), acc.accept_lens)

    # -- stages ---------------------------------------------------------------------------
    def _resolve(self, x: DecodeInputs):
        """resolve: lengths and draft inputs from the future map -> (rows, seq_lens, draft
        inputs, the tree's bonus, pre-drafted candidates or None). Graphed: one replay
        writing straight into the draft and tree graphs' static inputs (views come back)."""
        g = self.graphs.get("resolve")
        if g is None or x.rows.shape[0] > g.max_bs:
            fm = self.future_map
            with self.spans.stage("resolve"):
                seq = fm.resolve_seq_lens(x.rows)
                inp = fm.gather(x.rows)
                cands = fm.gather_predraft(x.rows) if x.predrafted else None
                rows, seq = self._stage_common(x.rows, seq)
            return rows, seq, inp, inp.bonus, cands
        bs = x.rows.shape[0]
        rows = g.stage("rows", x.rows)
        with self.spans.stage("resolve", graphed=True):
            out = g.run({"rows": rows}, clone=False)
        t = self.graphs["tree"].static
        if self._resolve_direct:
            d = self.graphs["draft"].static
            inp = DraftInputs(**{k: d[k][:bs] if k in self._draft_inputs else None
                                 for k in ("bonus", "hidden", "topk_logp", "topk_index")})
        else:
            inp = DraftInputs(*out)
        cands = tuple(t[k][:bs] for k in ("scores", "tokens", "parents")) \
            if x.predrafted else None
        return rows, self.graphs["verify"].static["seq_lens"][:bs], inp, t["bonus"][:bs], cands

    def _draft(self, rows, seq, inp: DraftInputs, max_kv: int):
        """draft: seed (eager unless folded) + steps -> candidates (scores, tokens, parents);
        with zb_draft_preexec they are also stashed (the pre-drafted candidates)."""
        if not self.p.fold_seed:
            inp = self.draft_worker.seed(inp, rows, seq, max_kv)
        return self._run("draft", self._draft_fn, dict(
            rows=rows, seq_lens=seq, **{k: getattr(inp, k) for k in self._draft_inputs}), max_kv)

    def _commit_extra(self, acc: AcceptResult) -> dict:
        """The commit segment's extra inputs when it also runs the draft's selection."""
        if self.draft_worker.extend_forward:
            return {}
        return dict(tokens=acc.tokens, bonus=acc.bonus)

    def _tree(self, rows, seq, bonus, cands, max_kv: int) -> DraftTree:
        scores, tokens, parents = cands
        return DraftTree(*self._run("tree", self._tree_fn, dict(
            rows=rows, seq_lens=seq, bonus=bonus, scores=scores, tokens=tokens,
            parents=parents), max_kv), num_steps=self.p.num_steps)

    def _accept(self, tree: DraftTree, logits: torch.Tensor, x: DecodeInputs,
                seq: torch.Tensor) -> AcceptResult:
        p, s = self.p, x.sampling
        if x.all_greedy or p.simulated:
            return AcceptResult(*self._run("accept", self._accept_fn, dict(
                rows=x.rows, seq_lens=seq, tokens=tree.tokens, parents=tree.parents,
                next_token=tree.retrieve_next_token, logits=logits, seeds=s.seeds), x.max_kv))
        with self.spans.stage("accept"):   # target-only tree sampling (eager)
            # level k decides position seq + 1 + k: the uniform target-only sampling uses there
            u = position_uniform(s.seeds, seq + 1, p.num_steps + 1)
            return accept_sample(tree, logits, s.temperature, s.top_p, u)

    def _extend(self, rows, seq, acc: AcceptResult, hidden_path, hidden_last,
                max_kv: int) -> DraftInputs:
        """The next iteration's draft inputs (already stashed): a `draft_extend` forward +
        stash, or the selection the commit segment made and stashed."""
        dw = self.draft_worker
        if not dw.extend_forward:
            return dw.extend(rows, seq, acc.tokens, acc.bonus, hidden_path, hidden_last,
                             acc.accept_lens, max_kv)
        h, lp, ix = self._run("draft_extend", self._extend_fn, dict(
            rows=rows, seq_lens=seq, tokens=acc.tokens, hidden_path=hidden_path,
            accept_lens=acc.accept_lens, bonus=acc.bonus), max_kv)
        return DraftInputs(acc.bonus, h, lp, ix)

    def _run(self, name: str, make_fn, args: dict, max_kv: int):
        """One segment as its stage span(s): a graph replay when captured, else eager (one
        span per stage: `mark` switches them). Replay outputs are views of the graph's
        buffers (consumed later in this step, on this stream) except accept's lengths, which
        leave the step (D2H, the scheduler's results; its tokens leave through
        flag_nonfinite's copy)."""
        g = self.graphs.get(name)
        if g is not None and args["rows"].shape[0] <= g.max_bs:
            with self.spans.stage(name, graphed=True):
                return g.run(args, clone=(1,) if name == "accept" else False)
        stages = self._stages(name)
        if len(stages) == 1:
            with self.spans.stage(name):
                return make_fn(max_kv)(**args)
        with _SpanChain(self.spans, stages) as chain:
            return make_fn(max_kv)(**args, mark=chain)

    def _stages(self, name: str) -> tuple[str, ...]:
        """The stages a segment runs (the first names it): see the module map."""
        if name == "draft" and self.p.draft_preexec:
            return ("draft", "stash")
        if name == "commit":
            return ("commit", "publish") + (() if self.draft_worker.extend_forward
                                            else ("stash",))
        if name == "draft_extend":
            return ("draft_extend", "stash")
        return (name,)

    def _stage_common(self, rows: torch.Tensor, seq: torch.Tensor):
        """rows/seq_lens into the static buffers every segment graph shares: copied once per
        step instead of once per replay."""
        g = self.graphs.get("verify")
        if g is None or rows.shape[0] > g.max_bs:
            return rows, seq
        return g.stage("rows", rows), g.stage("seq_lens", seq)

    # -- segments (pure tensor functions; eager with a host max_kv, or captured with W) ---
    @property
    def _draft_inputs(self) -> tuple[str, ...]:
        """The DraftInputs fields the draft segment reads: folded, seed runs inside it."""
        return ("bonus", "hidden") if self.p.fold_seed else ("hidden", "topk_logp", "topk_index")

    def _draft_fn(self, max_kv: int):
        """-> the S steps' candidates concatenated: (scores, tokens, parents) [B, C]
        (+ stash of them as the pre-drafted candidates with zb_draft_preexec)."""
        dw, fold, fm = self.draft_worker, self.p.fold_seed, self.future_map

        def fn(rows, seq_lens, mark=None, **fields):
            inp = DraftInputs(fields.pop("bonus", None), **fields)
            if fold:
                inp = dw.seed(inp, rows, seq_lens, max_kv)
            steps = dw.steps(inp, rows, seq_lens, max_kv)
            cands = (torch.cat([c.scores for c in steps], 1),
                     torch.cat([c.tokens for c in steps], 1),
                     torch.cat([c.parents for c in steps], 1))
            if mark is not None:
                fm.write(rows, mark, predraft=cands)
            return cands
        return fn

    def _resolve_fn(self, max_kv: int):
        """Graphed resolve: lengths (+ pre-drafted candidates) into the shared and the tree
        graph's static inputs; the draft inputs into the draft graph's static inputs when
        the draft segment reads them unchanged (`_resolve_direct`), else returned (the eager
        seed runs on them). Padding lanes (row 0): seq_len 1 and zeros, as GraphRunner pads.
        One kernel, carrying resolve's stamps (`carry_begin`)."""
        fm, common = self.future_map, self.graphs["verify"].static
        d, t = self.graphs["draft"].static, self.graphs["tree"].static
        direct = self._resolve_direct
        with_topk = fm.topk_logp is not None

        def fn(rows, mark):
            bs = rows.shape[0]
            fields = [(common["seq_lens"][:bs], "seq_lens", 1, 0), (t["bonus"][:bs], "bonus", 0, 0)]
            if self.p.draft_preexec:
                fields += [(t[k][:bs], "pre_" + k, pad, 0)
                           for k, pad in (("scores", 0), ("tokens", 0), ("parents", -1))]
            names = ("bonus", "hidden") + (("topk_logp", "topk_index") if with_topk else ())
            if direct:
                out = {k: d[k][:bs] for k in self._draft_inputs}
            else:                                # graph outputs: the eager seed's inputs
                out = {k: getattr(fm, k).new_empty((bs,) + getattr(fm, k).shape[1:])
                       for k in names}
            fm.resolve_into(rows, fields + [(v, k, 0, 0) for k, v in out.items()],
                            mark.carry("resolve"))
            return () if direct else tuple(out[k] for k in names)
        return fn

    @property
    def _resolve_direct(self) -> bool:
        """The draft segment reads the future map's fields unchanged: the seed is folded into
        it, or the draft's seed runs no forward (eagle: the stashed top-k)."""
        return self.p.fold_seed or not self.draft_worker.seed_forward

    def _tree_fn(self, max_kv: int):
        """organize + build_tree; captured, the two kernels carry the stage's begin and end."""
        p = self.p

        def fn(rows, seq_lens, bonus, scores, tokens, parents, mark=None):
            steps = [StepCandidates(tokens, scores, parents)]
            sel = replace(organize(steps, p.num_draft_tokens, _begin(mark)),
                          num_steps=p.num_steps)
            return astuple(build_tree(sel, bonus, seq_lens, _end(mark)))[:-1]
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

        def fn(rows, seq_lens, tokens, parents, next_token, logits, seeds, mark=None):
            tree = DraftTree(tokens, parents, None, None, None, next_token, None, p.num_steps)
            # = logits.argmax(-1); split-V kernel on CUDA
            argmax = vocab_argmax(logits, _begin(mark))
            if not p.simulated:
                acc = accept_greedy(tree, argmax, _end(mark))
            else:
                # level k decides position seq_len + 1 + k (not keyed by the step)
                u = position_uniform(seeds, seq_lens + 1, p.num_steps + 1, SIMULATE)
                acc = accept_simulated(tree, argmax, u, mean_accept_len=p.simulate_accept_len,
                                       accept_rates=p.simulate_accept_rates, end=_end(mark))
            return astuple(acc)
        return fn

    def _commit_fn(self, max_kv: int):
        """commit -> publish (-> the draft's selection -> stash, `_commit_extra` inputs);
        captured, window_slots carries commit's begin and the future map's kernel the rest."""
        p, fm, dw = self.p, self.future_map, self.draft_worker

        def fn(rows, seq_lens, accept_index, accept_lens, hidden, mark, tokens=None,
               bonus=None):
            new_seq, hidden_path, hidden_last = commit(
                self.target.kv, self.table, rows, seq_lens, accept_index, accept_lens, hidden,
                p.num_draft_tokens, move_kv=p.topk > 1, begin=mark.begin())
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
    def _capture(self, max_bs: int) -> None:
        p, dev = self.p, self.device
        W = self.table.shape[1]
        L, K, D, E = max_bs, p.topk, p.num_draft_tokens, p.num_steps + 1
        H = self.future_map.hidden.shape[1]
        hdt = self.future_map.hidden.dtype
        z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt, device=dev)  # noqa: E731
        common = dict(rows=z(L), seq_lens=z(L))
        pad = dict(rows=0, seq_lens=1, bonus=0, hidden=0, topk_logp=0, topk_index=0, tokens=0,
                   positions=0, mask=1, hidden_path=0, accept_lens=1, scores=0,
                   parents=-1, logits=0, seeds=0, accept_index=0, next_token=-1)
        buckets = default_buckets(max_bs)

        def runner(name, fn, static):
            r = GraphRunner(torch.no_grad()(fn), static, {k: pad[k] for k in static}, buckets,
                            meter=self.spans.meter, stage=self._stages(name),
                            carry_begin=name in CARRY_BEGIN)
            with self.spans.paused():
                r.capture()
            self.graphs[name] = r

        draft_in = dict(bonus=z(L), hidden=z(L, H, dt=hdt), topk_logp=z(L, K, dt=torch.float32),
                        topk_index=z(L, K))
        runner("draft", self._draft_fn(W), dict(common, **{k: draft_in[k]
                                                          for k in self._draft_inputs}))
        C = num_candidates(p.num_steps, K)
        runner("tree", self._tree_fn(W),
               dict(common, bonus=z(L), scores=z(L, C, dt=torch.float32), tokens=z(L, C),
                    parents=z(L, C)))
        runner("verify", self._verify_fn(W),
               dict(common, tokens=z(L, D), positions=z(L, D), mask=z(L, D, D, dt=torch.bool)))
        V = self.target.model.config.vocab_size
        runner("accept", self._accept_fn(W),
               dict(common, tokens=z(L, D), parents=z(L, D), next_token=z(L, D),
                    logits=z(L, D, V, dt=torch.float32), seeds=z(L)))
        extra = {} if self.draft_worker.extend_forward else dict(tokens=z(L, E), bonus=z(L))
        runner("commit", self._commit_fn(W),
               dict(common, accept_index=z(L, E), accept_lens=z(L), hidden=z(L, D, H, dt=hdt),
                    **extra))
        if self.draft_worker.extend_forward:
            runner("draft_extend", self._extend_fn(W),
                   dict(common, tokens=z(L, E), hidden_path=z(L, E, H, dt=hdt),
                        accept_lens=z(L), bonus=z(L)))
        if not self.future_map.poison:      # the consume-once check syncs: resolve eagerly
            runner("resolve", self._resolve_fn(W), dict(rows=common["rows"]))
