"""One small device abstraction: streams, events and pinned memory that degrade to
synchronous no-ops on CPU, so the same engine code path runs in CI and on a GPU.

    Device("cuda") -> real streams/events, pinned host buffers, CUDA graphs allowed
    Device("cpu")  -> NullStream/NullEvent: every wait/record/synchronize is a no-op
                      (CPU ops are already executed in program order)

`graph_us(fn)`: a call's device time as a CUDA graph replays it (no host launch cost).
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from .nogc import gc_paused


class NullEvent:
    """CPU stand-in for torch.cuda.Event: work is already done when it is recorded."""

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class NullStream:
    """CPU stand-in for torch.cuda.Stream."""

    def wait_stream(self, other) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def synchronize(self) -> None:
        pass


_STREAMS: dict = {}
_NUMPY = {torch.long: np.int64, torch.int32: np.int32, torch.float32: np.float32,
          torch.float64: np.float64, torch.bool: np.bool_}


def current_cuda_stream() -> torch.cuda.Stream:
    """The current stream of the current CUDA device, as a cached Stream object. Hot-path
    replacement for `torch.cuda.current_stream()`, which builds a new Python Stream per call
    (so does `Event.record()` without a stream); costs per call in docs/results/host_path/."""
    key = torch._C._cuda_getCurrentStream(torch._C._cuda_getDevice())
    s = _STREAMS.get(key)
    if s is None:
        s = _STREAMS[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1],
                                              device_type=key[2])
    return s


class _UseStream:
    """`with _UseStream(s):` makes `s` current and restores the previous stream: what
    `torch.cuda.stream(s)` does for a stream of the current device, through the C-level
    setter (no context-manager machinery; costs in docs/results/host_path/)."""

    __slots__ = ("s", "prev")

    def __init__(self, s: torch.cuda.Stream):
        self.s = s

    def __enter__(self):
        s = self.s
        self.prev = torch._C._cuda_getCurrentStream(s.device_index)
        torch._C._cuda_setStream(stream_id=s.stream_id, device_index=s.device_index,
                                 device_type=s.device_type)
        return s

    def __exit__(self, *exc):
        sid, dev, typ = self.prev
        torch._C._cuda_setStream(stream_id=sid, device_index=dev, device_type=typ)
        return False


class PinnedRing:
    """Pinned host memory handed out by a bump pointer over a ring of slabs, so the hot path
    never calls `pin_memory()` / `cudaHostAlloc` (tens of µs each) per copy.

        slab 0 [used|used|free ...]  slab 1 [...]  ...  slab N-1 [...]
                 ^ take(n) bumps `off`; a full slab retires: one event recorded on every
                   stream that copied from/to it since it was entered
    Invariant: a slab is written by the host again only after the events recorded at its
    retirement have completed (checked on entry; a wait there is rare and counted in
    `waits`), so an in-flight async copy never sees its bytes change. Requests larger than a
    slab fall back to a fresh pinned tensor (the caching host allocator).
    The host must finish reading a read-back buffer before N-1 more slabs fill; the scheduler
    reads each step's results one step later and a step takes far less than a slab.
    """

    ALIGN = 64

    def __init__(self, slab_bytes: int = 1 << 18, slabs: int = 8):
        self.slab_bytes = slab_bytes
        self.slabs = [torch.empty(slab_bytes, dtype=torch.uint8, pin_memory=True)
                      for _ in range(slabs)]
        self.events: list[list] = [[] for _ in range(slabs)]
        self.streams: list[dict] = [{} for _ in range(slabs)]
        self.cur, self.off, self.waits = 0, 0, 0

    def take(self, shape, dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised pinned tensor, valid until its slab comes round again."""
        n = math.prod(shape) * dtype.itemsize
        if n > self.slab_bytes:
            return torch.empty(shape, dtype=dtype, pin_memory=True)
        if self.off + n > self.slab_bytes:
            self._rotate()
        view = self.slabs[self.cur][self.off:self.off + n]
        self.off += -(-n // self.ALIGN) * self.ALIGN
        s = current_cuda_stream()
        self.streams[self.cur][s.cuda_stream] = s
        return view.view(dtype).view(shape)

    def _rotate(self) -> None:
        old = self.cur
        self.events[old] = []
        for s in self.streams[old].values():
            ev = torch.cuda.Event()
            ev.record(s)
            self.events[old].append(ev)
        self.streams[old] = {}
        self.cur, self.off = (old + 1) % len(self.slabs), 0
        for ev in self.events[self.cur]:
            if not ev.query():
                self.waits += 1
                ev.synchronize()


@dataclass(frozen=True)
class Device:
    torch_device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    @property
    def name(self) -> str:
        if self.is_cuda:
            return torch.cuda.get_device_name(self.torch_device)
        import platform
        return f"cpu ({platform.processor() or platform.machine()})"

    def new_stream(self):
        return torch.cuda.Stream(self.torch_device) if self.is_cuda else NullStream()

    def current_stream(self):
        return torch.cuda.current_stream(self.torch_device) if self.is_cuda else NullStream()

    def stream(self, s):
        """Context manager making `s` current (no-op on CPU). A stream of another device than
        the current one goes through torch.cuda.stream, which switches the device too."""
        if not self.is_cuda:
            return contextlib.nullcontext()
        if s.device_index != torch._C._cuda_getDevice():
            return torch.cuda.stream(s)
        return _UseStream(s)

    def new_event(self, timing: bool = False):
        return torch.cuda.Event(enable_timing=timing) if self.is_cuda else NullEvent()

    def order(self, waiter, producer) -> None:
        """`waiter`'s later work runs after the work queued on `producer` so far: one event
        per (waiter, producer) pair, recorded again each time (a wait holds the record it
        was issued after). `Stream.wait_stream` would make, record and destroy a new event
        per call. No-op on CPU and for one stream."""
        if waiter is producer or not self.is_cuda:
            return
        key = (waiter.cuda_stream, producer.cuda_stream)
        ev = self._links.get(key)
        if ev is None:
            ev = self._links[key] = torch.cuda.Event()
        ev.record(producer)
        waiter.wait_event(ev)

    @functools.cached_property
    def _links(self) -> dict:
        return {}

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.torch_device)

    @functools.cached_property
    def _staging(self) -> PinnedRing:
        return PinnedRing()

    @functools.cached_property
    def _readback(self) -> PinnedRing:
        return PinnedRing()

    def h2d(self, data, dtype) -> torch.Tensor:
        """A host list or numpy array as a device tensor without a host sync: staged in
        pinned memory (a ring, no allocation) and copied non-blocking on the current stream
        (`torch.tensor(x, device="cuda")` would be a synchronous copy that waits for the
        stream's queued work)."""
        if not self.is_cuda:
            return (torch.from_numpy(data).to(dtype) if isinstance(data, np.ndarray)
                    else torch.tensor(data, dtype=dtype))
        a = np.asarray(data, dtype=_NUMPY[dtype])
        pinned = self._staging.take(a.shape, dtype)
        pinned.numpy()[...] = a                      # the host write, no torch op
        return pinned.to(self.torch_device, non_blocking=True)

    def empty_pinned(self, shape, dtype) -> torch.Tensor:
        """Host buffer for async D2H copies (pinned, from a ring, on CUDA; plain on CPU).
        Read it before N-1 more slabs of the ring fill (PinnedRing)."""
        if not self.is_cuda:
            return torch.empty(shape, dtype=dtype)
        return self._readback.take(shape, dtype)


def resolve_device(name: str) -> Device:
    """'auto' picks cuda when present. Raises one clear sentence for an unusable device."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={name!r} was requested but no CUDA GPU is visible to torch "
            f"(torch {torch.__version__}); use device='cpu' or 'auto'.")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device={name!r} is not supported; use 'cpu', 'cuda' or 'auto'.")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return Device(dev)


def graph_us(fn, reps: int = 20, replays: int = 50) -> float:
    """Median device µs of one fn() call: fn captured `reps` times in one CUDA graph, the graph
    replayed `replays` times, each replay between two CUDA events."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):                 # compile / autotune / allocator warm-up
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b) / reps)
    del g
    return float(np.median(times))
