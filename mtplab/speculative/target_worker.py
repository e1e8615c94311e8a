"""Target worker: the target model's forwards over paged KV (prefill eager, decode eager or
graph replay) and token sampling. A prefill forward feeds one chunk per request (the whole
prompt unless chunked prefill cuts it) over the KV of its earlier chunks; the token it samples
is a result only after the final chunk (the scheduler drops the others). The speculative
worker adds a draft worker beside it.

All decode inputs are device tensors and everything else is derived on the device:
    seq_lens, input token  <- the future map (resolve; published/stashed by the last forward)
    positions = kv_lens - 1 ; out_loc = req_to_token[rows, positions]
so the captured decode graph needs no host-side lengths (only the static bound W).
Graphed decode, per batch bucket and sampling mode (greedy: an argmax; else the sampler):
    granularity "stage"   resolve graph (lengths and tokens into the decode graph's inputs),
                          then the decode graph [verify | publish | stash]: two replays
    granularity "step"    one graph [resolve | verify | publish | stash]: one replay
The host stages rows and the sampling parameters only when the batch changes (they are new
tensors then, sched/prepare.py); the outputs (tokens [B, 1], accept lengths of ones) are
views of graph buffers, valid until the next decode is launched.
"""
from __future__ import annotations

import torch

from ..graphs.runner import GraphRunner, default_buckets
from ..kernels.attn_meta import AttnMeta
from ..kernels.sampling import finite_rows, flag_nonfinite, sample
from ..mem.kv_cache import KVCache
from ..models.llama import AttnFn, LlamaForCausalLM
from ..instrument.spans import NO_SPANS, Spans
from ..core import DecodeInputs, DecodeOut, DraftInputs, PrefillInputs




def prefill_kv_lens(x: PrefillInputs) -> torch.Tensor:
    """KV entries of each request once this prefill forward is done: the chunk's end."""
    return x.q_lens if x.kv_lens is None else x.kv_lens


class TargetWorker:
    def __init__(self, model: LlamaForCausalLM, kv: KVCache, table: torch.Tensor,
                 attn_fn: AttnFn, cuda_graphs: bool, graph_max_bs: int, future_map,
                 spans: Spans = NO_SPANS, granularity: str = "stage"):
        self.spans = spans
        self.future_map = future_map  # publish / resolve / stash / gather
        self.model = model
        self.kv = kv
        self.table = table
        self.attn_fn = attn_fn
        self.width = table.shape[1]
        self.device = table.device
        # Two captured decode graphs, picked per step by the host's all_greedy flag: the
        # greedy one ends in an argmax, the other samples (top-p sort, softmax, uniforms).
        self.decode_graphs: dict[bool, GraphRunner] = {}
        self.graphs: dict[str, GraphRunner] = {}     # "resolve" (stage granularity)
        self.granularity = granularity
        self._staged: dict[str, torch.Tensor] = {}   # input -> the tensor staged last
        if cuda_graphs:
            self._capture_decode(graph_max_bs)

    def close(self) -> None:
        """Release the captured graphs (each graph's function holds this worker)."""
        for r in [*self.decode_graphs.values(), *self.graphs.values()]:
            r.close()
        self.decode_graphs.clear()
        self.graphs.clear()
        self._staged.clear()

    def runners(self) -> list[GraphRunner]:
        """Every captured graph runner (instrument/hostclock.py counts their replays)."""
        return list(self.decode_graphs.values()) + list(self.graphs.values())

    @torch.no_grad()
    def prefill(self, x: PrefillInputs) -> torch.Tensor:
        """Forward every fed token, sample the next token of each request; publish the new
        lengths and stash the token as the next input. -> the tokens [B] int64 as the host
        reads them (NONFINITE_TOKEN where the logits were not finite)."""
        tok, _, report = self.prefill_with_hidden(x)
        with self.spans.stage("publish"):
            self.future_map.publish(x.rows, prefill_kv_lens(x))
        with self.spans.stage("stash"):
            self.future_map.stash(x.rows, DraftInputs(tok))
        return report

    @torch.no_grad()
    def prefill_with_hidden(self, x: PrefillInputs) -> tuple[torch.Tensor, ...]:
        """-> (next tokens [B], hidden [T, H] of every fed token, pre final norm, the tokens
        for the host: NONFINITE_TOKEN where the logits were not finite)."""
        with self.spans.stage("prefill"):
            return self._prefill(x)

    def _prefill(self, x: PrefillInputs) -> tuple[torch.Tensor, ...]:
        B = x.rows.shape[0]
        row_of_tok = torch.repeat_interleave(x.rows, x.q_lens, output_size=x.input_ids.shape[0])
        out_loc = self.table[row_of_tok, x.positions].long()
        meta = AttnMeta(self.table, x.rows, prefill_kv_lens(x), x.q_lens, x.cu_q, x.positions,
                        max_q=x.max_q, max_kv=x.max_kv or x.max_q)
        hidden, logits = self.model(x.input_ids, x.positions, self.kv.k, self.kv.v, out_loc,
                                    meta, self.attn_fn, logits_idx=x.cu_q[1:] - 1)
        s = x.sampling
        assert logits.shape[0] == B
        tok = sample(logits, s.temperature, s.top_p, s.seeds, s.counters)
        last = hidden[x.cu_q[1:] - 1]                      # the rows the logits are of
        return tok, hidden, flag_nonfinite(tok, finite_rows(logits, last, B))

    def _decode_fn(self, max_kv: int, greedy: bool = False):
        """-> fn(...) -> (token [B] for the next input, the token for the host:
        NONFINITE_TOKEN where the logits were not finite). greedy: every lane has temperature
        0, so the token is the argmax (what `sample` gives a greedy lane) and the sampling
        kernels are left out of the step."""
        def fn(input_ids, rows, kv_lens, temperature, top_p, seeds):
            counters = kv_lens                     # the sampling counter: the new length
            B = rows.shape[0]
            positions = (kv_lens - 1).long()
            out_loc = self.table[rows, positions].long()
            ones = torch.ones_like(kv_lens)
            cu_q = torch.arange(B + 1, device=rows.device)
            meta = AttnMeta(self.table, rows, kv_lens, ones, cu_q, positions, 1, max_kv,
                            split_kv=self.width)
            rec = self.model.expert_recorder
            if rec is not None:               # the real lanes (row 0: a padded lane)
                rec.begin(rows != 0)
            hidden, logits = self.model(input_ids, positions, self.kv.k, self.kv.v, out_loc,
                                        meta, self.attn_fn)
            if rec is not None:
                rec.end()
            tok = logits.argmax(-1) if greedy else sample(logits, temperature, top_p, seeds,
                                                              counters)
            return tok, flag_nonfinite(tok, finite_rows(logits, hidden, B))
        return fn

    def decode(self, x: DecodeInputs) -> DecodeOut:
        """One token per lane: the fed token's KV is written at entry seq_len (module doc).
        Graph replays need no autograd mode; the eager path runs under no_grad."""
        g = self.decode_graphs.get(x.all_greedy)
        s = x.sampling
        fm = self.future_map
        bs = x.rows.shape[0]
        if g is not None and bs <= g.max_bs and (self.granularity == "step"
                                                 or "resolve" in self.graphs):
            for k, t in (("rows", x.rows), ("temperature", s.temperature),
                         ("top_p", s.top_p), ("seeds", s.seeds)):
                if self._staged.get(k) is not t:
                    g.stage(k, t)
                    self._staged[k] = t
            if self.granularity == "stage":
                with self.spans.stage("resolve", graphed=True):
                    self.graphs["resolve"].replay(bs)
                with self.spans.stage("verify", graphed=True):
                    report, ones, _ = g.replay(bs)
            else:
                with self.spans.stage("resolve", graphed=True):
                    report, ones, _ = g.replay(bs)
            fm.mark_published()
            return DecodeOut(report, ones)
        with torch.no_grad():
            return self._decode_eager(x, g)

    def _decode_eager(self, x: DecodeInputs, g) -> DecodeOut:
        """resolve eagerly, then the decode graph (debug_future_map) or an eager forward."""
        s, fm, bs = x.sampling, self.future_map, x.rows.shape[0]
        with self.spans.stage("resolve"):
            seq = fm.resolve_seq_lens(x.rows)
            inp = fm.gather(x.rows)
        new_len = seq + 1
        args = dict(input_ids=inp.bonus, rows=x.rows, kv_lens=new_len,
                    temperature=s.temperature, top_p=s.top_p, seeds=s.seeds)
        graphed = g is not None and bs <= g.max_bs
        with self.spans.stage("verify", graphed=graphed):   # the forward of a one-node tree
            if graphed:     # debug_future_map: resolve eager, then the graph (tok: its buffer,
                report, _, tok = g.run(args)                 # stashed before its next replay)
                report = report[:, 0]
            else:
                tok, report = self._decode_fn(x.max_kv, x.all_greedy)(**args)
        with self.spans.stage("publish"):
            fm.publish(x.rows, new_len)
        with self.spans.stage("stash"):
            fm.stash(x.rows, DraftInputs(tok))
        return DecodeOut(report[:, None], torch.ones_like(report))

    def _capture_decode(self, max_bs: int) -> None:
        """The two decode graphs (greedy, sampling) over one set of static inputs. Without
        the consume-once debug check (it syncs) they publish and stash in-graph, and resolve
        fills their inputs: a graph of its own (stage) or inside them (step)."""
        dev, L, fm = self.device, max_bs, self.future_map
        static = dict(
            input_ids=torch.zeros(L, dtype=torch.long, device=dev),
            rows=torch.zeros(L, dtype=torch.long, device=dev),
            kv_lens=torch.zeros(L, dtype=torch.long, device=dev),
            temperature=torch.zeros(L, dtype=torch.float32, device=dev),
            top_p=torch.zeros(L, dtype=torch.float32, device=dev),
            seeds=torch.zeros(L, dtype=torch.long, device=dev))
        # Padding lane: row 0, one KV entry -> writes and reads slot 0 of the padding page.
        pad = dict(input_ids=0, rows=0, kv_lens=1, temperature=0, top_p=1, seeds=0)
        ones = torch.ones(L, dtype=torch.long, device=dev)    # accept lengths: one token
        in_graph = not fm.poison
        step = in_graph and self.granularity == "step"

        def resolve(rows, mark, kv_lens, input_ids):   # kv_lens = seq_lens + 1 (padding: 1)
            fm.resolve_into(rows, [(kv_lens, "seq_lens", 1, 1), (input_ids, "bonus", 0, 0)],
                            mark.carry("resolve"))
        for greedy in (True, False):
            fn = self._decode_fn(self.width, greedy)
            if in_graph:
                fn = self._with_publish_stash(fn)

            def decode(fn=fn, marks=None, mark=None, **a):
                if step:                    # [resolve | verify, publish, stash]
                    resolve(a["rows"], marks(0), a["kv_lens"], a["input_ids"])
                    mark = marks(1)
                tok, report = fn(**a) if mark is None else fn(**a, mark=mark)
                return report[:, None], ones[:tok.shape[0]], tok
            kw = (dict(segments=[(("resolve",), True), (("verify", "publish", "stash"), False)])
                  if step else dict(stage=("verify", "publish", "stash") if in_graph
                                    else "verify"))
            runner = GraphRunner(torch.no_grad()(decode), static, pad, default_buckets(max_bs),
                                 meter=self.spans.meter, **kw)
            with self.spans.paused():
                runner.capture()
            self.decode_graphs[greedy] = runner
        if in_graph and not step:
            def resolve_graph(rows, mark):
                bs = rows.shape[0]
                resolve(rows, mark, static["kv_lens"][:bs], static["input_ids"][:bs])
                return ()
            runner = GraphRunner(torch.no_grad()(resolve_graph), dict(rows=static["rows"]),
                                 dict(rows=0), default_buckets(max_bs),
                                 meter=self.spans.meter, stage="resolve", carry_begin=True)
            with self.spans.paused():
                runner.capture()
            self.graphs["resolve"] = runner

    def _with_publish_stash(self, fn):
        """fn's decode, then publish (new lengths) and stash (the token) in the same graph."""
        fm = self.future_map

        def decode_publish_stash(input_ids, rows, kv_lens, temperature, top_p, seeds, mark):
            tok, report = fn(input_ids, rows, kv_lens, temperature, top_p, seeds)
            fm.write(rows, mark, seq_lens=kv_lens, inputs=DraftInputs(tok))
            return tok, report
        return decode_publish_stash
