"""The speculative (spec v2) worker: a target worker plus a draft worker.

One decode iteration over B requests (seq_lens = kv_committed_len, the bonus has no KV yet):

    resolve   future map[rows] -> seq_lens [B], bonus [B], hidden [B,H] (+ eagle's top-k)
    draft     frozen: seed forward (draft.seed) + S-1 forwards (draft.step)
              eagle : S-1 forwards from the stashed top-k
    tree      organize the best D-1 candidates, root = bonus -> tokens/positions/mask [B,D,..]
    verify    target forward over B*D nodes, KV at entries seq_len + node
    accept    greedy walk / target-only sampling / simulated -> accept_lens, tokens [B,S+1]
    commit    topk>1: move the accepted path's KV to the front of the window
    publish   future map seq_lens[rows] <- seq_lens + accept_lens (+ publish_ready event)
    next      frozen: seed = (bonus, verify hidden at the last accepted node), no forward
              eagle : draft extend over the S+1 window rows -> next step-0 top-k
    stash     future map[rows] <- next inputs
    (draft)   zb_draft_preexec: the next round's draft runs now and its candidates are
              stashed; the next iteration starts at `tree`
The host then reads tokens[:, :accept_len] and advances kv_committed_len by accept_len.

CUDA graphs (bucketed by batch size, padded lanes on row 0), one per segment, each replay
wrapped in its stage span:
    draft graph   frozen fold_seed=True : seed + S-1 steps in one replay
                  frozen fold_seed=False: seed eager (draft.seed, its own launches), then steps
                  eagle                 : S-1 steps
    tree graph    organize + build_tree
    verify graph  the target over B*D tree nodes
    accept graph  greedy or simulated accept (sampled batches: eager tree sampling)
    commit graph  KV compaction, path hidden rows, new lengths
    draft_extend graph  eagle's draft extend
Resolve, publish and stash run eagerly between the replays (small gathers/scatters).
"""
from __future__ import annotations

from dataclasses import astuple, dataclass, replace
from typing import Optional, Sequence

import torch

from ..graphs.runner import GraphRunner, default_buckets
from ..kernels.sampling import SIMULATE, position_uniform
from .commit import accept_moves, apply_kv_moves, window_slots
from .draft_select import StepCandidates, num_candidates
from ..core import DecodeInputs, DecodeOut, DraftInputs, PrefillInputs
from .target_worker import TargetWorker
from .tree import DraftTree, build_tree, organize
from .accept import AcceptResult, accept_simulated, accept_greedy, accept_sample


@dataclass(frozen=True)
class SpecParams:
    draft: str                  # frozen_kv_mtp | eagle
    num_steps: int
    topk: int
    num_draft_tokens: int
    fold_seed: bool = False
    draft_preexec: bool = False
    simulate_accept_len: Optional[float] = None
    simulate_accept_rates: Optional[Sequence[float]] = None

    @property
    def frozen(self) -> bool:
        return self.draft == "frozen_kv_mtp"

    @property
    def simulated(self) -> bool:
        return self.simulate_accept_len is not None or self.simulate_accept_rates is not None


class SpecWorker:
    def __init__(self, target: TargetWorker, draft, relay, params: SpecParams,
                 cuda_graphs: bool = False, graph_max_bs: int = 32):
        self.spans = target.spans
        self.target = target
        self.draft_worker = draft
        self.relay = relay
        self.p = params
        self.table = target.table
        self.graphs: dict[str, GraphRunner] = {}
        if cuda_graphs:
            self._capture(graph_max_bs)

    @property
    def device(self):
        return self.target.device

    # -- segments (pure tensor functions; eager with a host max_kv, or captured with W) ---
    def _draft_fn(self, max_kv: int):
        """-> the S steps' candidates concatenated: (scores, tokens, parents) [B, C]."""
        dw, p = self.draft_worker, self.p

        def cat(steps):
            return (torch.cat([c.scores for c in steps], 1), torch.cat([c.tokens for c in steps], 1),
                    torch.cat([c.parents for c in steps], 1))

        if p.frozen and p.fold_seed:
            def fn(rows, seq_lens, bonus, hidden):
                h0, lp, ix = dw.seed(bonus, hidden, rows, seq_lens, max_kv)
                return cat(dw.steps(h0, lp, ix, rows, seq_lens, max_kv))
        else:
            def fn(rows, seq_lens, bonus, hidden, topk_logp, topk_index):
                return cat(dw.steps(hidden, topk_logp, topk_index, rows, seq_lens, max_kv))
        return fn

    def _tree_fn(self, max_kv: int):
        p = self.p

        def fn(rows, seq_lens, bonus, scores, tokens, parents):
            steps = [StepCandidates(tokens, scores, parents)]
            sel = replace(organize(steps, p.num_draft_tokens), num_steps=p.num_steps)
            return astuple(build_tree(sel, bonus, seq_lens))[:-1]
        return fn

    def _verify_fn(self, max_kv: int):
        def fn(rows, seq_lens, tokens, positions, mask):
            return self.target.verify(tokens, positions, rows, seq_lens, mask, max_kv)
        return fn

    def _extend_fn(self, max_kv: int):
        def fn(rows, seq_lens, tokens, hidden_path, accept_lens):
            return self.draft_worker.draft_extend(rows, seq_lens, tokens, hidden_path,
                                                  accept_lens, max_kv)
        return fn

    def _run(self, name: str, make_fn, args: dict, max_kv: int):
        """One segment as its stage span: a graph replay when captured, else eager. Replay
        outputs are views of the graph's buffers (consumed later in this step, on this stream)
        except accept's, which leave the step (D2H, the scheduler's results)."""
        with self.spans.stage(name):
            g = self.graphs.get(name)
            if g is not None and args["rows"].shape[0] <= g.max_bs:
                return g.run(args, clone=name == "accept")
            return make_fn(max_kv)(**args)

    def _stage_common(self, rows: torch.Tensor, seq: torch.Tensor):
        """rows/seq_lens into the static buffers every segment graph shares: copied once per
        step instead of once per replay."""
        g = self.graphs.get("verify")
        if g is None or rows.shape[0] > g.max_bs:
            return rows, seq
        return g.stage("rows", rows), g.stage("seq_lens", seq)

    # -- prefill / decode ------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, x: PrefillInputs) -> torch.Tensor:
        bonus, hidden = self.target.prefill_with_hidden(x)
        ends = x.cu_q[1:] - 1
        with self.spans.stage("publish"):
            self.relay.publish(x.rows, x.q_lens)
        nxt = self.draft_worker.after_prefill(
            bonus, hidden[ends], fed_ids=x.input_ids, hidden_all=hidden, rows=x.rows,
            q_lens=x.q_lens, cu_q=x.cu_q, positions=x.positions, max_q=x.max_q)
        with self.spans.stage("stash"):
            self.relay.stash(x.rows, nxt)
        return bonus

    def _accept_fn(self, max_kv: int):
        """Greedy or simulated accept (the engine's static mode): graph friendly."""
        p = self.p

        def fn(rows, seq_lens, tokens, parents, next_token, logits, seeds):
            tree = DraftTree(tokens, parents, None, None, None, next_token, None, p.num_steps)
            argmax = logits.argmax(-1)
            if not p.simulated:
                acc = accept_greedy(tree, argmax)
            else:
                # level k decides position seq_len + 1 + k (not keyed by the step)
                u = position_uniform(seeds, seq_lens + 1, p.num_steps + 1, SIMULATE)
                acc = accept_simulated(tree, argmax, u, mean_accept_len=p.simulate_accept_len,
                                      accept_rates=p.simulate_accept_rates)
            return astuple(acc)
        return fn

    def _commit_fn(self, max_kv: int):
        """topk>1: move the accepted path's KV to the front of the window; gather the path's
        hidden rows; new lengths (and, frozen, the next seed's hidden)."""
        p = self.p
        D = p.num_draft_tokens

        def fn(rows, seq_lens, accept_index, accept_lens, hidden):
            B = rows.shape[0]
            window = window_slots(self.table, rows, seq_lens, D)
            acc = AcceptResult(accept_index, accept_lens, None, None)
            moves = accept_moves(window, acc)
            if p.topk > 1:
                apply_kv_moves(self.target.kv.k, self.target.kv.v, moves)
            hidden_path = hidden.reshape(B * D, -1)[moves.row_index]            # [B, S+1, H]
            last = (accept_lens - 1)[:, None, None].expand(B, 1, hidden.shape[-1])
            return seq_lens + accept_lens, hidden_path, hidden_path.gather(1, last)[:, 0]
        return fn

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

    def _draft(self, rows, seq, inp: DraftInputs, max_kv: int):
        """The draft segment (frozen: seed + steps; eagle: steps) -> candidates [B, C] x3."""
        p, dw = self.p, self.draft_worker
        args = dict(rows=rows, seq_lens=seq, bonus=inp.bonus, hidden=inp.hidden)
        if p.frozen and not p.fold_seed:
            h0, lp, ix = dw.seed(inp.bonus, inp.hidden, rows, seq, max_kv)
            args.update(hidden=h0, topk_logp=lp, topk_index=ix)
        elif not p.frozen:
            args.update(topk_logp=inp.topk_logp, topk_index=inp.topk_index)
        return self._run("draft", self._draft_fn, args, max_kv)

    @torch.no_grad()
    def decode(self, x: DecodeInputs) -> DecodeOut:
        p, sp = self.p, self.spans
        rows = x.rows
        with sp.stage("resolve"):
            seq = self.relay.resolve_seq_lens(rows)
            inp = self.relay.gather(rows)
            if x.predrafted:
                cands = self.relay.gather_predraft(rows)
            rows, seq = self._stage_common(rows, seq)
        if not x.predrafted:
            cands = self._draft(rows, seq, inp, x.max_kv)
        scores, toks, parents = cands
        tree = DraftTree(*self._run("tree", self._tree_fn,
                                    dict(rows=rows, seq_lens=seq, bonus=inp.bonus, scores=scores,
                                         tokens=toks, parents=parents), x.max_kv),
                         num_steps=p.num_steps)
        logits, hidden = self._run("verify", self._verify_fn,
                                   dict(rows=rows, seq_lens=seq, tokens=tree.tokens,
                                        positions=tree.positions, mask=tree.mask), x.max_kv)
        acc = self._accept(tree, logits, x, seq)
        new_seq, hidden_path, hidden_last = self._run(
            "commit", self._commit_fn, dict(rows=rows, seq_lens=seq, accept_index=acc.accept_index,
                                            accept_lens=acc.accept_lens, hidden=hidden), x.max_kv)
        with sp.stage("publish"):
            self.relay.publish(rows, new_seq)
        if p.frozen:     # the next seed is selected from the verify outputs: no forward
            nxt = DraftInputs(acc.bonus, hidden_last)
        else:
            h, lp, ix = self._run("draft_extend", self._extend_fn,
                                  dict(rows=rows, seq_lens=seq, tokens=acc.tokens,
                                       hidden_path=hidden_path, accept_lens=acc.accept_lens),
                                  x.max_kv)
            nxt = DraftInputs(acc.bonus, h, lp, ix)
        with sp.stage("stash"):
            self.relay.stash(rows, nxt)
        if p.draft_preexec:     # the next round's draft, before the host sees this result
            bound = min(self.table.shape[1], x.max_kv + p.num_steps + 1)
            cands = self._draft(rows, new_seq, nxt, bound)
            with sp.stage("stash"):
                self.relay.stash_predraft(rows, *cands)
        return DecodeOut(acc.tokens, acc.accept_lens)

    # -- CUDA graphs -------------------------------------------------------------------------
    def _capture(self, max_bs: int) -> None:
        p, dev = self.p, self.device
        W = self.table.shape[1]
        L, K, D, E = max_bs, p.topk, p.num_draft_tokens, p.num_steps + 1
        H = self.relay.hidden.shape[1]
        hdt = self.relay.hidden.dtype
        z = lambda *shape, dt=torch.long: torch.zeros(*shape, dtype=dt, device=dev)  # noqa: E731
        common = dict(rows=z(L), seq_lens=z(L))
        pad = dict(rows=0, seq_lens=1, bonus=0, hidden=0, topk_logp=0, topk_index=0, tokens=0,
                   positions=0, mask=1, hidden_path=0, accept_lens=1, scores=0,
                   parents=-1, logits=0, seeds=0, accept_index=0, next_token=-1)
        buckets = default_buckets(max_bs)

        def runner(name, fn, static):
            r = GraphRunner(torch.no_grad()(fn), static, {k: pad[k] for k in static}, buckets)
            with self.spans.paused():
                r.capture()
            self.graphs[name] = r

        draft_in = dict(common, bonus=z(L), hidden=z(L, H, dt=hdt))
        if not (p.frozen and p.fold_seed):
            draft_in.update(topk_logp=z(L, K, dt=torch.float32), topk_index=z(L, K))
        runner("draft", self._draft_fn(W), draft_in)
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
        runner("commit", self._commit_fn(W),
               dict(common, accept_index=z(L, E), accept_lens=z(L), hidden=z(L, D, H, dt=hdt)))
        if not p.frozen:
            runner("draft_extend", self._extend_fn(W),
                   dict(common, tokens=z(L, E), hidden_path=z(L, E, H, dt=hdt),
                        accept_lens=z(L)))
