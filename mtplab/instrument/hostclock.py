"""Host time per stage of a decode step, without any device work: what the host spends
issuing each stage (the launch of a graph segment, the Python of `process_result`, ...).

    clock = HostClock(); spans.host_clock = clock      # every stage span times itself
    ... decode steps ...
    clock.per_step()  -> {stage: host µs per decode step}, "step": the whole step

A stage span (instrument/spans.py) with a clock attached reads `perf_counter_ns` at its entry
and exit (about 0.1 µs each); when the iteration's step span closes, its spans are added to
their stage names if it was a decode step. An iteration runs from its first span (`schedule`,
which runs before the step span opens) to the end of its step span ("step"). A graphed span
times the replay's launch (the host call), never the GPU work. Spans nest (e.g. `sync` inside
`prepare` with zb_device_seq_lens off, `draft.step` inside an eager `draft`): a stage's figure
includes what nests in it, and "stages" sums the outermost spans only.

`OpCounter` counts what the host issues per decode step: aten ops by name (a
TorchDispatchMode: `copy_` into graph inputs, `fill_` of padding lanes, clones; view ops are
not launches and are counted apart) and CUDA graph replays (GraphRunner.replays). It slows
the host: count in a generate of its own, never in a timed one.

`replay_floor_us` times the host call of a captured graph replay in this process, the floor
a step of n replays cannot go under.
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Iterable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..nogc import gc_paused

_now = time.perf_counter_ns


class _HostSpan:
    __slots__ = ("clock", "name", "inner", "t0")

    def __init__(self, clock: "HostClock", name: str, inner):
        self.clock, self.name, self.inner = clock, name, inner

    def __enter__(self):
        c = self.clock
        c.depth += 1
        self.t0 = t = _now()
        if c.t_iter is None:
            c.t_iter = t
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        c = self.clock
        c.depth -= 1
        dt = _now() - self.t0
        c.pending.append((self.name, dt, not c.depth))
        return False


class StepSpan:
    """A clock's step span (HostClock, StepClock): it opens the iteration if no stage span
    has (`t_iter`) and, once closed, hands the clock `close_iteration(decode)`."""
    __slots__ = ("clock", "decode", "inner")

    def __init__(self, clock, name: str, inner):
        self.clock, self.decode, self.inner = clock, name.startswith("step[decode"), inner

    def __enter__(self):
        c = self.clock
        if c.t_iter is None:
            c.t_iter = _now()
        self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        self.clock.close_iteration(self.decode)
        return False


class HostClock:
    """Host ns per stage name over the decode steps seen while attached (module doc)."""

    def __init__(self):
        self.ns: defaultdict = defaultdict(int)
        self.calls: defaultdict = defaultdict(int)
        self.steps = 0
        self.depth = 0                 # stage spans open (a nested one is not added to "stages")
        self.pending: list = []        # (stage, ns, outermost) of the iteration under way
        self.samples: list = []        # per decode step: {stage: ns}
        self.t_iter: Optional[int] = None   # its first span's entry

    def close_iteration(self, decode: bool) -> None:
        """The step span closed: its iteration's spans count if it was a decode step."""
        if decode:
            ns, calls, step = self.ns, self.calls, defaultdict(int)
            for name, dt, top in self.pending:
                step[name] += dt
                calls[name] += 1
                if top:
                    step["stages"] += dt
            step["step"] = _now() - self.t_iter
            for k, v in step.items():
                ns[k] += v
            self.samples.append(step)
            self.steps += 1
        self.pending.clear()
        self.t_iter = None

    def span(self, name: str, inner, graphed: bool = False) -> _HostSpan:
        return _HostSpan(self, name, inner)

    def step(self, name: str, inner) -> StepSpan:
        return StepSpan(self, name, inner)

    def per_step(self) -> dict[str, float]:
        """µs per decode step by stage, plus "step" (the step span) and "stages" (the
        outermost stage spans: step - stages is the loop's own Python between them)."""
        n = max(1, self.steps)
        return {k: v / 1e3 / n for k, v in self.ns.items()}

    def median_per_step(self) -> dict[str, float]:
        """The median decode step's µs by stage (rare slow steps, e.g. a page allocation,
        weigh in `per_step`, the mean, not here)."""
        keys = {k for s in self.samples for k in s}
        out = {}
        for k in keys:
            xs = sorted(s.get(k, 0) for s in self.samples)
            out[k] = xs[len(xs) // 2] / 1e3 if xs else 0.0
        return out

    def calls_per_step(self) -> dict[str, float]:
        n = max(1, self.steps)
        return {k: v / n for k, v in self.calls.items()}


class OpCounter(TorchDispatchMode):
    """aten ops issued from Python while active, by overload name; views apart (`views`)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.is_view:
            self.views += 1
        else:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def replays(runners: Iterable) -> int:
    """Replays so far of these GraphRunners (graphs/runner.py)."""
    return sum(r.replays for r in runners)


def replay_floor_us(device: torch.device, kernels: int = 1, n: int = 2000) -> Optional[float]:
    """Host µs of one `CUDAGraph.replay()` of a graph of `kernels` tiny kernels, median of
    batches of 100 (the device drained between batches, so the launch queue never fills);
    None without CUDA."""
    if torch.device(device).type != "cuda":
        return None
    x = torch.zeros(16, device=device)
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(kernels):
            x.add_(1)
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        for _ in range(kernels):
            x.add_(1)
    torch.cuda.synchronize(device)
    per = []
    for _ in range(max(1, n // 100)):
        t0 = _now()
        for _ in range(100):
            g.replay()
        per.append((_now() - t0) / 100 / 1e3)
        torch.cuda.synchronize(device)
    per.sort()
    return per[len(per) // 2]
