"""CUDA graph capture/replay, bucketed by batch size, with padded lanes.

    static inputs (max bucket rows)   capture fn(**static[:bs]) for every bucket bs
    run(inputs, bs): copy inputs -> static[:bs], fill static[bs:bucket] with pad values
                     (padding lanes point at req_to_token row 0 -> the padding page),
                     replay the smallest bucket >= bs, return out[:bs]
                     (out: a tensor or a tuple of tensors, batch-major)
An input that already is `static[k][:bs]` (staged by the caller, e.g. a buffer several
runners share; see `stage`) is not copied again. `sticky` keys name inputs that are never
written in place once made (a batch's rows and sampling parameters): while the caller passes
the same tensor object as on the previous replay, it is not copied again. `clone=False`
returns views of the graph's output buffers: valid until this runner's next replay, so only
for values consumed by work queued on the same stream before that replay.
`meter` + `stage` (a BubbleMeter, instrument/meter.py): every captured graph is
    [stamp begin(stage), fn's kernels, stamp end(stage)]
so a replay carries its stage's device time stamps with no extra host launch; `run` logs
them for the meter's current step (the warm-up runs before capture are not stamped).
A graph of several stages (`stage` a tuple, e.g. ("commit", "publish", "stash")) calls
`fn(..., mark=mark)`; `mark(name)` ends the current stage and begins the next one with one
handover stamp (no host between them inside a graph):
    [b commit, ..., h publish, ..., h stash, ..., e stash]
(mark must name the stages in order). A segment whose tail is one self-stamping kernel (the
future map's moves, kernels/future_map.py) takes the stamps still to come with
`mark.carry(*stages)` instead: the kernel issues them itself, with no stamp node:
    draft:  [b draft, ..., move_rows{h stash, e stash}]
A segment whose first kernel is one of ours (`carry_begin=True`, fn(..., mark)) hands it the
begin with `mark.begin()`; a one-stage segment's last kernel takes the end with `mark.carry()`:
    resolve: [move_rows{b resolve, e resolve}]      (one kernel: mark.carry("resolve"))
    tree:    [organize{b tree}, build_tree{e tree}]                     (no stamp node)
    accept:  [argmax{b accept}, ..., walk{e accept}]
    commit:  [window_slots{b commit}, ..., move_rows{h publish, h stash, e stash}]
`mark.fused` tells a fn it runs captured (an eager twin's is False); in the warm-up runs marks
issue nothing and carried stamps go to a scratch ring (the same kernel variant is compiled before
the capture). The stamps stay on the graph's one chain: a stamp on a side branch would cost
less device time, but the graph would then run on two streams and its kernels would show
on two stream lanes of a trace.
`fn` must be free of host syncs and data-dependent shapes; tensors it closes over (weights,
KV cache, req_to_token) must never be reallocated after capture.
No garbage collection runs inside a capture (`gc_paused`): a collection there may free a dead
engine's CUDA graph (cudaGraphExecDestroy), pinned buffer or event, which is illegal while a
stream captures and invalidates the capture (torch.cuda.graph no longer collects first).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ..kernels.stamp import Carried
from ..nogc import gc_paused


def default_buckets(max_bs: int) -> list[int]:
    b = [1, 2, 4, 8] + list(range(16, max_bs + 1, 8))
    return sorted({x for x in b if x <= max_bs} | {max_bs})


class GraphRunner:
    def __init__(self, fn: Callable[..., torch.Tensor], static_inputs: dict[str, torch.Tensor],
                 pad_values: dict[str, int], buckets: list[int], sticky: tuple = (),
                 meter=None, stage: str | tuple[str, ...] = "", carry_begin: bool = False):
        self.fn = fn
        self.carry_begin = carry_begin
        self.meter = meter
        self.stages = (stage,) if isinstance(stage, str) else tuple(stage)
        # [begin s0, handover s1, ..., handover s(n-1), end s(n-1)]
        self.stamps = meter.launch_codes(
            (meter.stamp_code(self.stages[0], "forward", False),)
            + tuple(meter.stamp_code(s, "forward", False, handover=True) for s in self.stages[1:])
            + (meter.stamp_code(self.stages[-1], "forward", True),)) if meter is not None else ()
        if meter is not None:
            # the carrying kernel's done counter; the warm-up runs' stamps go to a scratch ring
            dev = next(iter(static_inputs.values())).device
            self._done = torch.zeros(1, dtype=torch.int32, device=dev)
            self._scratch = (torch.zeros(4, 2, dtype=torch.long, device=dev),
                             torch.zeros(1, dtype=torch.int32, device=dev))
        self.sticky = sticky
        self._last: dict = {}                   # sticky key -> the tensor copied last
        self.static = static_inputs
        self.pad = pad_values
        self.buckets = sorted(buckets)
        self.graphs: dict[int, tuple] = {}
        self.replays = 0                        # replays so far (instrument/hostclock.py)
        for k, v in self.static.items():
            v.fill_(pad_values[k])

    @property
    def max_bs(self) -> int:
        return self.buckets[-1]

    def close(self) -> None:
        """Drop the graphs, their static buffers and `fn` (whose closure usually holds the
        worker that holds this runner: a cycle, broken here)."""
        self.graphs.clear()
        self.static = {}
        self._last.clear()
        self.fn = None

    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream()
        for bs in reversed(self.buckets):
            args = {k: v[:bs] for k, v in self.static.items()}
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):          # warm-up: Triton JIT, cuBLAS workspaces
                    self._call(args, _Marks(self, warm=True))
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with gc_paused(), torch.cuda.graph(g, pool=pool):
                out = self._call(args, _Marks(self, warm=False))
            self.graphs[bs] = (g, out)
        torch.cuda.synchronize()

    def _call(self, args: dict, mark: "_Marks"):
        plain = len(self.stages) == 1 and not self.carry_begin
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
        that view: passing it to `run` costs no further copy."""
        return self._copy_in(key, v, v.shape[0], self.bucket(v.shape[0]))

    def _copy_in(self, key: str, v: torch.Tensor, bs: int, b: int) -> torch.Tensor:
        st = self.static[key]
        st[:bs].copy_(v, non_blocking=True)
        if b > bs:
            st[bs:b].fill_(self.pad[key])
        return st[:bs]

    def run(self, inputs: dict[str, torch.Tensor], clone: bool | tuple[int, ...] = True):
        """Replay for these inputs -> fn's output(s) [:bs]. `clone`: True copies every output
        out of the graph's buffers, False returns views, a tuple of indices clones those
        outputs only (the others are views)."""
        bs = next(iter(inputs.values())).shape[0]
        b = self.bucket(bs)
        for k, v in inputs.items():
            st = self.static[k]
            if v.data_ptr() == st.data_ptr() and v.shape[0] == bs and v.is_contiguous():
                continue                             # staged: already static[k][:bs]
            if k in self.sticky:
                if self._last.get(k) is v:
                    continue                         # the same immutable tensor as last time
                self._last[k] = v
            self._copy_in(k, v, bs, b)
        g, out = self.graphs[b]
        g.replay()
        self.replays += 1
        if self.stamps:
            self.meter.log(self.stamps)          # one list append (instrument/meter.py)
        if isinstance(out, torch.Tensor):
            return out[:bs].clone() if clone else out[:bs]
        keep = range(len(out)) if clone is True else clone or ()
        return tuple(o[:bs].clone() if i in keep else o[:bs] for i, o in enumerate(out))


class _Marks:
    """The stamps of one capture of `runner`, issued in order:
        codes = [b s0, h s1, ..., h s(n-1), e s(n-1)]        (s = runner.stages)
    b s0 at once (a stamp node) unless carry_begin, where the fn's first kernel takes it
    (`begin()`); `mark(s)` = the handover into s as a node; `carry(*stages)` = the codes
    still to come, for the fn's last kernel to issue; `finish()` = the end as a node unless
    carried. Warm-up runs (`warm`) issue no node and carry into the runner's scratch ring."""

    fused = True           # the future map's tail in a graph is one kernel (sched/future_map.py)

    def __init__(self, runner: GraphRunner, warm: bool):
        self.r, self.warm, self.pos = runner, warm, 0
        self.codes = runner.stamps or (0,) * (len(runner.stages) + 1)
        if not runner.carry_begin:
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
