"""CUDA graph capture/replay, bucketed by batch size, with padded lanes.

    static inputs (max bucket rows)   capture fn(**static[:b]) for every bucket b
    replay(bs)       replay the smallest bucket b >= bs on whatever static[:b] holds now
                     -> fn's output(s) [:bs] (views of the graph's buffers, cached per bs)
    run(inputs)      copy inputs -> static[:bs] (padding lanes static[bs:b] filled with pad
                     values: they point at req_to_token row 0 -> the padding page), replay
The static inputs are the graph's persistent input buffers. Where a producer writes them
(an earlier graph's captured copy, `stage` for a host input), a replay needs no copy at all:
the spec worker's segments read what the previous segment wrote (speculative/worker.py).
Output views stay valid until this runner's next replay, so they are for values consumed by
work queued before that replay (on the same stream, or on a stream ordered before it).
`meter` + segments (a BubbleMeter, instrument/meter.py): every captured graph is
    [stamp begin(stage), fn's kernels, stamp end(stage)]        per segment
so a replay carries its stages' device time stamps with no extra host launch; `replay` logs
them for the meter's current step (the warm-up runs before capture are not stamped).
A segment of several stages (`stage` a tuple, e.g. ("commit", "publish", "stash")) calls
`fn(..., mark=mark)`; `mark(name)` ends the current stage and begins the next one with one
handover stamp (no host between them inside a graph):
    [b commit, ..., h publish, ..., h stash, ..., e stash]
(mark must name the stages in order). A segment whose tail is one self-stamping kernel (the
future map's moves, kernels/move_rows.py) takes the stamps still to come with
`mark.carry(*stages)` instead: the kernel issues them itself, with no stamp node:
    draft:  [b draft, ..., move_rows{h stash, e stash}]
A segment whose first kernel is one of ours (`carry_begin=True`) has no begin node: that
kernel takes the begin (`mark.begin()`), and a one-stage segment's last kernel the end
(`mark.carry()`). Where those kernels are dispatched ops (kernels/fused_ops.py), `carry_ops`
names them, (the op carrying the begin, the op carrying the end): the capture runs fn inside
`carrying(mark.take)`, so `dispatch` hands each its stamps and fn passes none itself. The
future map's kernel (`move_rows`) takes `mark.carry(...)` from the mark it is given:
    resolve: [move_rows{b resolve, e resolve}]      (one kernel: mark.carry("resolve"))
    tree:    [organize{b tree}, build_tree{e tree}]       carry_ops ("organize", "build_tree")
    accept:  [argmax{b accept}, ..., walk{e accept}]      carry_ops ("argmax", walk's op)
    commit:  [window_slots{b commit}, ..., move_rows{h publish, h stash, e stash}]
A graph of several segments (`segments`, the whole decode step as one graph) gives fn a
`marks(i)` that begins segment i where it is called (its begin node, if not carried) and
returns its marks; fn calls `finish()` on each before the next segment begins. A replay logs
each segment's stamps as its own entry: the meter reads the same stage intervals as from one
graph per segment.
`mark.captured` tells a fn it runs in a capture (an eager twin's is False); in the warm-up
runs marks issue nothing and carried stamps go to a scratch ring (the same kernel variant is
compiled before the capture). The stamps stay on the graph's one chain: a stamp on a side
branch would cost less device time, but the graph would then run on two streams and its
kernels would show on two stream lanes of a trace.
`fn` must be free of host syncs and data-dependent shapes; tensors it closes over (weights,
KV cache, req_to_token) must never be reallocated after capture.
No garbage collection runs inside a capture (`gc_paused`): a collection there may free a dead
engine's CUDA graph (cudaGraphExecDestroy), pinned buffer or event, which is illegal while a
stream captures and invalidates the capture (torch.cuda.graph no longer collects first).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..kernels.fused_ops import carrying
from ..kernels.stamp import Carried
from ..nogc import gc_paused


def default_buckets(max_bs: int) -> list[int]:
    b = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return sorted({x for x in b if x <= max_bs} | {max_bs})


class Segment:
    """The stamps of one segment of a captured graph: its stages, where its begin stamp is
    issued, the dispatched ops that carry its begin and end (`carry_ops`), its stamp codes
    [begin s0, handover s1, ..., end s(n-1)] and the carrying kernels' done counter (one per
    segment; zero between launches)."""

    def __init__(self, stages: str | tuple[str, ...], carry_begin: bool, meter, device,
                 carry_ops: tuple = (None, None)):
        self.stages = (stages,) if isinstance(stages, str) else tuple(stages)
        self.carry_begin = carry_begin
        self.carry_ops = carry_ops
        self.meter = meter
        self.stamps = meter.launch_codes(
            (meter.stamp_code(self.stages[0], "forward", False),)
            + tuple(meter.stamp_code(s, "forward", False, handover=True) for s in self.stages[1:])
            + (meter.stamp_code(self.stages[-1], "forward", True),)) if meter is not None else ()
        if meter is not None:
            # the carrying kernel's done counter; the warm-up runs' stamps go to a scratch ring
            self._done = torch.zeros(1, dtype=torch.int32, device=device)
            self._scratch = (torch.zeros(4, 2, dtype=torch.long, device=device),
                             torch.zeros(1, dtype=torch.int32, device=device))


class GraphRunner:
    def __init__(self, fn: Callable[..., torch.Tensor], static_inputs: dict[str, torch.Tensor],
                 pad_values: dict[str, int], buckets: list[int], meter=None,
                 stage: str | tuple[str, ...] = "", carry_begin: bool = False,
                 carry_ops: tuple = (None, None), segments: Optional[list[tuple]] = None):
        """One segment (`stage`, `carry_begin`, `carry_ops`), or several: `segments`, one
        (stages, carry_begin[, carry_ops]) each (module doc)."""
        self.fn = fn
        self.meter = meter
        dev = next(iter(static_inputs.values())).device
        self.multi = segments is not None
        self.segments = [Segment(st, cb, meter, dev, *ops) for st, cb, *ops in
                         (segments if self.multi else [(stage, carry_begin, carry_ops)])]
        self.static = static_inputs
        self.pad = pad_values
        self.buckets = sorted(buckets)
        self.graphs: dict[int, tuple] = {}
        self._views: dict[int, tuple] = {}      # bs -> (its bucket's graph, output views)
        self.replays = 0                        # replays so far (instrument/hostclock.py)
        for k, v in self.static.items():
            v.fill_(pad_values[k])

    # the one segment of a single-segment runner (its stamps, stages, counters)
    stamps = property(lambda self: self.segments[0].stamps)
    stages = property(lambda self: self.segments[0].stages)
    carry_begin = property(lambda self: self.segments[0].carry_begin)
    _done = property(lambda self: self.segments[0]._done)
    _scratch = property(lambda self: self.segments[0]._scratch)

    @property
    def max_bs(self) -> int:
        return self.buckets[-1]

    def close(self) -> None:
        """Drop the graphs, their static buffers and `fn` (whose closure usually holds the
        worker that holds this runner: a cycle, broken here)."""
        self.graphs.clear()
        self.static = {}
        self._views.clear()
        self.fn = None

    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for bs in reversed(self.buckets):
            args = {k: v[:bs] for k, v in self.static.items()}
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):          # warm-up: Triton JIT, cuBLAS workspaces
                    self._call(args, warm=True)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with gc_paused(), torch.cuda.graph(g, pool=pool):
                out = self._call(args, warm=False)
            self.graphs[bs] = (g, out)
        torch.cuda.synchronize()

    def _call(self, args: dict, warm: bool):
        if self.multi:
            begun: list = []

            def marks(i: int) -> _Marks:      # segment i begins here (its begin node, if any)
                begun.append(_Marks(self.segments[i], warm))
                return begun[-1]
            # a dispatched op takes its stamps from the segment under way
            with carrying(lambda op: begun[-1].take(op) if begun else (None, None)):
                out = self.fn(**args, marks=marks)
            for m in begun:
                m.finish()
            return out
        seg = self.segments[0]
        mark = _Marks(seg, warm)
        plain = len(seg.stages) == 1 and not seg.carry_begin
        with carrying(mark.take):
            out = self.fn(**args) if plain else self.fn(**args, mark=mark)
        mark.finish()
        return out

    def bucket(self, bs: int) -> int:
        for b in self.buckets:
            if b >= bs:
                return b
        raise ValueError(f"batch size {bs} exceeds the largest captured bucket {self.max_bs}.")

    def stage(self, key: str, v: torch.Tensor) -> torch.Tensor:
        """Copy `v` into static[key][:bs] (padding lanes filled up to the bucket) and return
        that view."""
        bs = v.shape[0]
        st = self.static[key]
        st[:bs].copy_(v, non_blocking=True)
        b = self.bucket(bs)
        if b > bs:
            st[bs:b].fill_(self.pad[key])
        return st[:bs]

    def run(self, inputs: dict[str, torch.Tensor], bs: Optional[int] = None):
        """Copy `inputs` into the static inputs (an input that already is static[k][:bs] is
        not copied), then `replay(bs)`."""
        bs = next(iter(inputs.values())).shape[0] if bs is None else bs
        for k, v in inputs.items():
            st = self.static[k]
            if v.data_ptr() == st.data_ptr() and v.shape[0] == bs and v.is_contiguous():
                continue                             # staged: already static[k][:bs]
            self.stage(k, v)
        return self.replay(bs)

    def replay(self, bs: int):
        """Replay the bucket of `bs` on the static inputs as they are -> the output views
        [:bs] (see the module doc for how long they stay valid)."""
        v = self._views.get(bs)
        if v is None:
            g, out = self.graphs[self.bucket(bs)]
            v = self._views[bs] = (g, self._slice(out, bs))
        v[0].replay()
        self.replays += 1
        for seg in self.segments:
            if seg.stamps:
                self.meter.log(seg.stamps)       # one list append (instrument/meter.py)
        return v[1]

    @staticmethod
    def _slice(out, bs: int):
        if out is None or isinstance(out, torch.Tensor):
            return out if out is None else out[:bs]
        return tuple(o[:bs] for o in out)


class _Marks:
    """The stamps of one capture of a segment, issued in order:
        codes = [b s0, h s1, ..., h s(n-1), e s(n-1)]        (s = segment.stages)
    b s0 at once (a stamp node) unless carry_begin, where the fn's first kernel takes it
    (`begin()`); `mark(s)` = the handover into s as a node; `carry(*stages)` = the codes
    still to come, for the fn's last kernel to issue; `finish()` = the end as a node unless
    carried. Warm-up runs (`warm`) issue no node and carry into the segment's scratch ring.
    `take(op)` = what dispatched op `op` carries (the segment's `carry_ops`).
    `finish` may be called more than once (a step graph's fn finishes each segment)."""

    captured = True        # the future map's tail in a graph is one kernel (sched/future_map.py)

    def __init__(self, segment: Segment, warm: bool):
        self.r, self.warm, self.pos = segment, warm, 0
        self.codes = segment.stamps or (0,) * (len(segment.stages) + 1)
        if not segment.carry_begin:
            self._node()

    def _node(self) -> None:
        if self.r.stamps and not self.warm:
            self.r.meter.device_stamp(self.codes[self.pos])
        self.pos += 1

    def __call__(self, name: str) -> None:
        st = self.r.stages
        if not 0 < self.pos < len(st) or name != st[self.pos]:
            raise ValueError(f"graph stages run in the order {st}; got {name!r} at "
                             f"position {self.pos}.")
        self._node()

    def begin(self) -> Optional[Carried]:
        """The segment's begin stamp for its first kernel to carry (a runner built with
        `carry_begin`); None without a meter."""
        if not self.r.carry_begin or self.pos != 0:
            raise ValueError("only the first kernel of a graph captured with carry_begin "
                             "carries its begin stamp, once.")
        self.pos = 1
        return self._carried(self.codes[:1])

    def carry(self, *names: str) -> Optional[Carried]:
        """The stamps of the kernel that begins `names` (the segment's remaining stages, none
        when only the end is left) and ends the segment; None without a meter."""
        st = self.r.stages
        if names != st[self.pos:]:
            raise ValueError(f"a carrying kernel must run the remaining stages "
                             f"{st[self.pos:]} of {st}; got {names}.")
        codes, self.pos = self.codes[self.pos:], len(self.codes)
        return self._carried(codes)

    def take(self, op: str) -> tuple[Optional[Carried], Optional[Carried]]:
        """(begin, end) for the kernel of dispatched op `op`: the segment's begin stamp if
        `op` is its begin op, the end if it is its end op, else None (kernels/fused_ops.py
        `carrying`)."""
        begin_op, end_op = self.r.carry_ops
        begin = self.begin() if op == begin_op else None
        end = self.carry() if op == end_op else None
        return begin, end

    def _carried(self, codes: tuple) -> Optional[Carried]:
        if not self.r.stamps:
            return None
        ring, count = self.r._scratch if self.warm else (self.r.meter.ring, self.r.meter.count)
        return Carried(ring, count, codes, self.r._done)

    def finish(self) -> None:
        if self.pos == len(self.codes):
            return
        if self.pos != len(self.codes) - 1:
            raise ValueError(f"graph stages {self.r.stages}: only "
                             f"{self.r.stages[:self.pos]} were begun.")
        self._node()
