"""The executor: runs a worker's decode plans (plan.py) three ways, for target-only and
speculative steps alike. It is handed the plan function and, through each Call, the segment
functions (segments.py); it imports neither worker.

    eager          values in a dict, one span per stage (`_SpanChain`): CPU, batches above
                   the largest bucket, and steps no graph covers
    stage graphs   graph_granularity="stage": one CUDA graph per segment and batch bucket.
                   Every value is a persistent device buffer (max bucket rows): a graph
                   reads its inputs from the buffers and writes its outputs into the buffers
                   its readers read (copies captured in the graph), so a replay takes no
                   input copy; the host stages its values (rows, sampling parameters) when
                   the batch changes
    step graph     graph_granularity="step": the whole plan captured as one graph per bucket
                   and plan (resolve .. stash, one replay per step); values flow inside it;
                   a plan with a segment that always runs eagerly (sampled accept) runs by
                   stages, eagerly
Graph padding lanes (bs < bucket) carry row 0 (the padding page) and the pads of `VALUES`
through every segment. A graph of several stages is replayed inside the span of its first
stage: its later stages are visible to the meter (stamps inside the graph), not to the
profiler (one replay = one host span); a step graph is replayed inside a `resolve` span.
The outputs (host_tokens, accept_lens) are views of graph buffers when graphed: valid until
the next decode is launched (the scheduler copies them out before).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from ..core import DecodeInputs
from ..graphs.runner import GraphRunner
from .plan import HOST_VALUES, OUTPUTS, VALUES, VALUES_PAD, Call

Plan = tuple[Call, ...]
PlanKey = tuple[bool, bool]           # (predrafted, greedy)


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

    def __init__(self, spans, plan: Plan):
        self.spans, self.plan, self.open = spans, plan, None

    def __call__(self, i: int):
        self.open = _SpanChain(self.spans, self.plan[i].stages).__enter__()
        return self.open

    def close(self, exc) -> None:
        if self.open is not None:
            self.open.__exit__(type(exc), exc, None)


def _host_value(val: str, x: DecodeInputs) -> torch.Tensor:
    """A value the host hands the step (HOST_VALUES)."""
    return x.rows if val == "rows" else getattr(x.sampling, val)


class Executor:
    """Runs `plan(predrafted, greedy)` (cached per key) for one worker: a step graph, stage
    graphs, or eagerly (module doc). `sizes`: the sizes VALUES' shapes name."""

    def __init__(self, plan: Callable[[bool, bool], Plan], sizes: dict, *, future_map, spans,
                 width: int, device, granularity: str = "stage"):
        self._make_plan = plan
        self.sizes, self.future_map, self.spans = sizes, future_map, spans
        self.width, self.device, self.granularity = width, device, granularity
        self.graphs: dict[str, GraphRunner] = {}          # stage graphs by Call.key
        self.step_graphs: dict[PlanKey, GraphRunner] = {}  # step graphs by plan key
        self.bufs: dict[str, torch.Tensor] = {}            # persistent values (stage graphs)
        self._plans: dict[PlanKey, Plan] = {}
        self._staged: dict[str, tuple] = {}                # host value -> (tensor, bs) staged
        self._views: dict[tuple, torch.Tensor] = {}        # (value, bs) -> bufs[value][:bs]
        self._buckets: list[int] = []
        self._host_static: tuple[str, ...] = ()          # host values with graph buffers
        self.max_bs = 0

    def plan(self, predrafted: bool, greedy: bool) -> Plan:
        key = (predrafted, greedy)
        if key not in self._plans:
            self._plans[key] = self._make_plan(predrafted, greedy)
        return self._plans[key]

    def runners(self) -> list[GraphRunner]:
        """Every captured graph runner (instrument/hostclock.py counts their replays)."""
        return list(self.graphs.values()) + list(self.step_graphs.values())

    def close(self) -> None:
        """Release the captured graphs (each graph's function holds the segment functions,
        which hold the worker's parts)."""
        for r in self.runners():
            r.close()
        self.graphs.clear()
        self.step_graphs.clear()
        self.bufs.clear()
        self._views.clear()
        self._staged.clear()
        self._plans.clear()

    # -- one decode step --------------------------------------------------------------------------
    def run(self, x: DecodeInputs, key: PlanKey) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step -> (host_tokens, accept_lens). Graph replays need no autograd
        mode; eager segments run under no_grad."""
        bs = x.rows.shape[0]
        if bs <= self.max_bs:
            g = self.step_graphs.get(key)
            if g is not None:
                self._stage_host(g.static, x, bs)
                with self.spans.stage("resolve", graphed=True):
                    out = g.replay(bs)
                self.future_map.mark_published()     # after the replay that published
                return out
            if self.graphs:
                return self._run_stages(self.plan(*key), x, bs)
        with torch.no_grad():
            v = self._run_eager(self.plan(*key), x)
        return v["host_tokens"], v["accept_lens"]

    def _run_eager(self, plan: Plan, x: DecodeInputs) -> dict:
        """The step function a step graph captures, run eagerly with spans as its marks."""
        marks = _EagerMarks(self.spans, plan)
        try:
            return self._step_fn(plan, x.max_kv)(marks, **{v: _host_value(v, x)
                                                            for v in HOST_VALUES})
        except BaseException as e:
            marks.close(e)
            raise

    def _step_fn(self, plan: Plan, max_kv: int) -> Callable:
        """step(marks, **host values) -> every value of the step: the plan's segments in
        order, `marks(i)` beginning segment i (a graph's stamps or an eager twin's spans)
        and its `finish()` ending it."""
        fns = [c.make(c, max_kv) for c in plan]
        future_map = self.future_map

        def step(marks, **v):
            for i, (c, fn) in enumerate(zip(plan, fns)):
                m = marks(i)
                args = {p: v[val] for p, val in c.reads}
                out = fn(**args) if c.plain else fn(**args, mark=m)
                m.finish()
                if not m.captured and "publish" in c.stages:
                    future_map.mark_published()
                for vals, o in zip(c.writes, out):
                    for val in vals:
                        v[val] = o
            return v
        return step

    def _run_stages(self, plan: Plan, x: DecodeInputs, bs: int) -> tuple:
        """Stage graphs: each graphed segment one replay on the buffers (no input copy); an
        eager segment reads the buffers and writes its outputs into them.
        -> (host_tokens, accept_lens) views of the buffers."""
        self._stage_host(self.bufs, x, bs)
        for c in plan:
            if c.graphed:
                with self.spans.stage(c.stages[0], graphed=True):
                    self.graphs[c.key].replay(bs)
            else:
                args = {p: self._view(val, bs) if val in self.bufs else _host_value(val, x)
                        for p, val in c.reads}
                self._call_eager(c, c.make(c, self.width), args, bs)
            if "publish" in c.stages:
                self.future_map.mark_published()
        return self._view("host_tokens", bs), self._view("accept_lens", bs)

    def _call_eager(self, c: Call, fn, args: dict, bs: int) -> None:
        """One segment eagerly, its outputs written into the graph buffers, all inside its
        stage spans (its last span covers the writes: no device work outside a stage)."""
        with torch.no_grad(), _SpanChain(self.spans, c.stages) as chain:
            out = fn(**args) if c.plain else fn(**args, mark=chain)
            for vals, o in zip(c.writes, out):
                for val in vals:
                    self._fill(val, o, bs)

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
        """The host's values into their graph buffers when they are new tensors: the batch's
        are reused (never written in place) while it stays the same (sched/prepare.py)."""
        for val in self._host_static:
            t = _host_value(val, x)
            last = self._staged.get(val)
            if last is not None and last[0] is t and last[1] == bs:
                continue
            buf = static[val]
            buf[:bs].copy_(t, non_blocking=True)
            b = self._bucket(bs)
            if b > bs:
                buf[bs:b].fill_(VALUES_PAD[val])
            self._staged[val] = (t, bs)

    # -- CUDA graphs ------------------------------------------------------------------------------
    def capture(self, buckets: list[int], keys: list[PlanKey]) -> None:
        """Capture the graphs of the plans `keys`: one step graph per plan whose segments
        all graph, or the stage graphs of every plan's graphed segments over persistent
        value buffers (eager segments run between them). The consume-once check
        (debug_future_map) syncs: resolve then runs eagerly, between stage graphs (the
        config refuses it with graph_granularity "step")."""
        self._buckets = sorted(buckets)
        self.max_bs = max_bs = self._buckets[-1]
        plans = {k: self.plan(*k) for k in keys}
        if self.granularity == "step":
            if self.future_map.poison:
                raise ValueError("a step graph captures resolve; debug_future_map cannot be.")
            graphed = {k: p for k, p in plans.items() if all(c.graphed for c in p)}
            host = {val for p in graphed.values() for c in p for _, val in c.reads
                    if val in HOST_VALUES}
            self._host_static = tuple(v for v in HOST_VALUES if v in host)
            static = self._buffers(self._host_static, max_bs)   # shared: staged once
            for k, p in graphed.items():
                self.step_graphs[k] = self._capture_step(p, static)
            return
        if self.future_map.poison:
            for k, p in plans.items():
                plans[k] = self._plans[k] = tuple(replace(c, graphed=False) if c.resolves
                                                  else c for c in p)
        calls = [c for p in plans.values() for c in p]
        graphed_reads = {val for c in calls if c.graphed for _, val in c.reads}
        used = {val for c in calls for _, val in c.reads
                if val in VALUES and (val not in HOST_VALUES or val in graphed_reads)}
        self.bufs = self._buffers(sorted(used | set(OUTPUTS)), max_bs)
        self._host_static = tuple(v for v in HOST_VALUES if v in self.bufs)
        for c in calls:
            if c.graphed and c.key not in self.graphs:
                self.graphs[c.key] = self._capture_stage(c)

    def _buffers(self, names, rows: int) -> dict[str, torch.Tensor]:
        size, hdt = self.sizes, self.future_map.hidden.dtype
        out = {}
        for v in names:
            shape, dtype, pad, *_ = VALUES[v]
            out[v] = torch.full((rows,) + tuple(size[d] for d in shape), pad,
                                dtype=hdt if dtype == "hidden" else dtype, device=self.device)
        return out

    def _capture_stage(self, c: Call) -> GraphRunner:
        """One segment's graph: reads its buffers, writes its outputs into the buffers of the
        values they become (resolve writes them itself)."""
        bufs, fn = self.bufs, c.make(c, self.width)
        static = {p: bufs[val] for p, val in c.reads}

        def seg(mark=None, **args):
            bs = next(iter(args.values())).shape[0]
            if c.resolves:
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

    def _capture_step(self, plan: Plan, static: dict) -> GraphRunner:
        """The whole plan as one graph: static inputs the host's values, values flowing
        inside, each segment's stamps as in its own graph (GraphRunner `segments`)."""
        run = self._step_fn(plan, self.width)

        def step(marks, **host):
            v = run(marks, **host)
            return v["host_tokens"], v["accept_lens"]
        r = GraphRunner(torch.no_grad()(step), static, {v: VALUES_PAD[v] for v in static},
                        self._buckets, meter=self.spans.meter,
                        segments=[(c.stages, c.carry_begin, c.carry) for c in plan])
        with self.spans.paused():
            r.capture()
        return r
