"""The `d2h` stage: a launched step's results on their way to the host.

    async (zb_async_d2h)   copy stream waits for the forward stream, copies the results into
                           a pinned readback slot, records `copy_done`; the host syncs on that
                           event only. On CUDA the copies are one kernel that also carries
                           the bubble meter's d2h stamps (kernels/stamp.py stamped_copy),
                           launched through its compiled launcher: one launch, no JIT binding.
    blocking               the results are cloned on the forward stream (a graphed decode's
                           outputs are graph buffers the next step overwrites); at process
                           time the host waits for everything queued on the forward stream
                           (under overlap: the step launched since too), then `.tolist()`s
                           them. The wait is explicit: the overlap loop's forward stream is
                           not the current one, and a read on the current stream would not
                           wait for the work that writes the results.
A Pending is a launched step whose results the host has not processed yet; under overlap at
most one is in flight. Its results read back as numpy arrays (`read`): views of the pinned
slot, valid until the slot comes round again (SLOTS launches later; the scheduler reads each
result before the next launch but one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np
import torch

from ..core import Req
from ..device import Device
from ..instrument.spans import Spans
from ..kernels.stamp import StampedCopy, stamped_copy_triton
from ..lazy_triton import available as triton_available
from .rows import Batch

SLOTS = 3        # pinned readback slots in rotation: one being written, one being read, spare


def _kernel_copy(dev: Device, results: list) -> bool:
    """The results go D2H as one stamped-copy kernel: CUDA, Triton, one or two tensors of
    one dtype."""
    return (dev.is_cuda and triton_available() and 1 <= len(results) <= 2
            and len({t.dtype for t in results}) == 1)


@dataclass
class Pending:
    kind: Literal["prefill", "decode"]
    reqs: list[Req]
    results: list[torch.Tensor]    # device tensors: [tokens] or [tokens, accept_lens]
    host: Optional[list[np.ndarray]]   # numpy views of the pinned copies (async) or None
    copy_done: Optional[object]    # event recorded after the copies (Device.new_event; None:
                                   #   blocking)
    batch: Optional[Batch] = None  # the decode Batch it was launched with (sched/rows.py)
    final: Optional[list[bool]] = None   # prefill: per request, did this step feed its
                                         #   final chunk
    stream: Optional[object] = None      # blocking: the forward stream the results are
                                         #   written on (Device.new_stream)
    step: int = -1                 # the scheduler iteration that launched it
    draft_tokens: int = 0          # decode: draft tokens each request proposed (DecodeOut)

    def read(self) -> list[np.ndarray]:
        """The results as numpy arrays: the host's one sync per step (`sync` stage)."""
        if self.host is not None:
            self.copy_done.synchronize()
            return self.host
        self.stream.synchronize()
        return [np.asarray(t.tolist(), dtype=np.int64) for t in self.results]


class Readback:
    """The d2h stage of one scheduler: SLOTS pinned int64 buffers of `cap` elements in
    rotation (no pinned allocation per step; views cached per slot and shape), the copy
    launcher, and one `copy_done` event per slot."""

    def __init__(self, dev: Device, spans: Spans, copy_stream, forward_stream, cap: int):
        self.dev, self.spans = dev, spans
        self.copy_stream, self.forward_stream = copy_stream, forward_stream
        self.slots = [torch.empty(cap, dtype=torch.long, pin_memory=dev.is_cuda)
                      for _ in range(SLOTS)]
        self.events = [dev.new_event() for _ in range(SLOTS)]
        self.i = 0
        self._views: dict = {}
        m = spans.meter
        self.copy = (StampedCopy(dev.torch_device, m.capacity if m is not None else None)
                     if dev.is_cuda and triton_available() else None)

    def _host(self, results: list) -> tuple:
        """(pinned views, their numpy views) in the current slot for results' shapes."""
        key = (self.i, results[0].shape, results[-1].shape, len(results))
        v = self._views.get(key)
        if v is None:
            slot, out, off = self.slots[self.i], [], 0
            for t in results:
                n = t.numel()
                if off + n > slot.numel():
                    raise ValueError(f"results of {off + n} elements exceed the readback "
                                     f"slot of {slot.numel()}.")
                out.append(slot[off:off + n].view(t.shape))
                off += -(-n // 2) * 2                  # 16-byte aligned views
            v = self._views[key] = (out, [h.numpy() for h in out])
        return v

    def __call__(self, kind: str, reqs: list[Req], results: list, async_copy: bool,
                 batch=None, final: Optional[list] = None) -> Pending:
        if not async_copy:
            if kind == "decode":
                with self.dev.stream(self.forward_stream):
                    results = [t.clone() for t in results]
            return Pending(kind, reqs, results, None, None, batch, final,
                           self.forward_stream)
        done = self.events[self.i]
        # The wait and `done` stay outside the span: d2h's event pair starts once the
        # forward work it copies has finished and times the copies.
        self.dev.order(self.copy_stream, self.forward_stream)
        host, host_np = self._host(results)
        m = self.spans.meter
        ks = m.kernel_stamp("d2h", "copy") if m is not None else None
        st = ks.args if ks is not None else None
        srcs = [t.contiguous() for t in results]
        if self.copy is not None and self.copy.direct(host, srcs, st) and \
                not self.spans.enabled:
            # the compiled launcher takes the stream: no stream switch on the host
            with self.spans.stage("d2h", "copy", graphed=True):
                self.copy(host, srcs, st, self.copy_stream)
            if ks is not None:
                m.log(ks.codes)
        else:
            with self.dev.stream(self.copy_stream):
                self._copy_here(host, srcs, ks)
        done.record(self.copy_stream)
        self.i = (self.i + 1) % SLOTS
        return Pending(kind, reqs, results, host_np, done, batch, final)

    def _copy_here(self, host: list, srcs: list, ks) -> None:
        """The copies on the current stream, in the d2h span (one stamped kernel on CUDA)."""
        one_kernel = _kernel_copy(self.dev, srcs)
        with self.spans.stage("d2h", "copy", graphed=one_kernel):
            if one_kernel:
                st = ks.args if ks is not None else None
                if self.copy is not None:
                    self.copy(host, srcs, st)
                else:
                    stamped_copy_triton(host, srcs, st)
                if ks is not None:
                    self.spans.meter.log(ks.codes)
            else:
                for h, t in zip(host, srcs):
                    h.copy_(t, non_blocking=True)
