"""The `d2h` stage: a launched step's results on their way to the host.

    async (zb_async_d2h)   copy stream waits for the forward stream, copies the results into
                           pinned buffers, records `copy_done`; the host syncs on that event only.
                           On CUDA the copies are one kernel that also carries the bubble
                           meter's d2h stamps (kernels/stamp.py stamped_copy): one launch.
    blocking               `.tolist()` at process time (waits for everything queued)
A Pending is a launched step whose results the host has not processed yet; under overlap at
most one is in flight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..core import Req
from ..device import Device
from ..instrument.spans import Spans
from ..kernels.stamp import stamped_copy_triton
from ..lazy_triton import available as triton_available


def _kernel_copy(dev: Device, results: list) -> bool:
    """The results go D2H as one stamped-copy kernel: CUDA, Triton, one or two tensors of
    one dtype."""
    return (dev.is_cuda and triton_available() and 1 <= len(results) <= 2
            and len({t.dtype for t in results}) == 1)


@dataclass
class Pending:
    kind: str                      # "prefill" | "decode"
    reqs: list[Req]
    results: list                  # device tensors: [tokens] or [tokens, accept_lens]
    host: Optional[list]           # pinned copies (async) or None (blocking)
    copy_done: object              # event recorded after the copies
    final: Optional[list] = None   # prefill: per request, did this step feed its final chunk

    def read(self) -> list[list]:
        """The results as Python lists: the host's one sync per step (`sync` stage)."""
        if self.host is not None:
            self.copy_done.synchronize()
            return [h.tolist() for h in self.host]
        return [t.tolist() for t in self.results]


def d2h(dev: Device, spans: Spans, copy_stream, forward_stream, kind: str, reqs: list[Req],
        results: list, async_copy: bool, final: Optional[list] = None) -> Pending:
    done = dev.new_event()
    host = None
    if async_copy:
        with dev.stream(copy_stream):
            # The wait, the host buffers and `done` stay outside the span: d2h's event pair
            # starts once the forward work it copies has finished and times the copies.
            copy_stream.wait_stream(forward_stream)
            host = [dev.empty_pinned(t.shape, t.dtype) for t in results]
            one_kernel = _kernel_copy(dev, results)
            with spans.stage("d2h", "copy", graphed=one_kernel):
                if one_kernel:
                    m = spans.meter
                    ks = m.kernel_stamp("d2h", "copy") if m is not None else None
                    stamped_copy_triton(host, [t.contiguous() for t in results],
                                        ks.args if ks is not None else None)
                    if ks is not None:
                        m.log(ks.codes)
                else:
                    for h, t in zip(host, results):
                        h.copy_(t, non_blocking=True)
            done.record(copy_stream)
    return Pending(kind, reqs, results, host, done, final)
