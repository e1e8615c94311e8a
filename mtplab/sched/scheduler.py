"""The scheduler loop: continuous batching, synchronous ("overlap off") or overlapped.

    overlap off, iteration k:   schedule k -> launch k -> d2h k -> sync -> process k
    overlap on,  iteration k:   schedule k (on lagging host lengths) -> launch k
                                -> process k-1 (copy_done of k-1) ; k stays in flight
    streams (CUDA; on CPU all no-ops, same order):
        schedule  KV allocation, req_to_token writes, input H2D       (waits forward: WAR)
        forward   all model work; lengths/inputs resolved from the future map on the device
        copy      D2H of tokens + accept lengths into pinned buffers, `copy_done` event
The host never waits for iteration k before launching k+1: lengths and next inputs travel
on the device through the future map. Host `kv_committed_len` therefore lags one step, and
the per-decode KV reserve is 2 x alloc_len_per_decode. kv_committed_len advances in exactly
one place (`_process_decode`), never for a request already finished (an overshoot step of a
finished request commits nothing; its KV writes land before any new owner's, in
forward-stream order). A request the host can tell will finish in flight (length) is left
out of the next batch. KV pressure: a decode that cannot get its reserve first drains the
in-flight result, then retracts the most recently admitted request (KV freed, request back
at the head of the queue, re-prefilled later with prompt + output); nothing is ever lost.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ..device import Device
from ..mem.invariants import InvariantError
from ..mem.kv_manager import KVManager
from ..instrument.spans import NO_SPANS, Spans
from ..stages import step_name
from ..instrument.syncs import SyncRecorder
from ..core import DecodeInputs, PrefillInputs, Req, SamplingTensors


@dataclass(frozen=True)
class LoopOptions:
    overlap: bool = False
    async_d2h: bool = True         # results -> pinned buffers on the copy stream (else .tolist())
    device_seq_lens: bool = True   # False: the host reads resolved seq_lens each decode (a sync)
    draft_preexec: bool = False    # the worker drafts round k+1 right after commit k
    debug_syncs: bool = False      # list host syncs per decode step (CUDA sync debug mode)


@dataclass
class StepStats:
    prefill_steps: int = 0
    decode_steps: int = 0
    retractions: int = 0
    decode_tokens: int = 0
    decode_time_s: float = 0.0
    step_times_s: list = field(default_factory=list)
    decode_step_times_s: list = field(default_factory=list)
    accept_lens: list = field(default_factory=list)   # per request per decode step
    overshoot_rows: int = 0                           # results dropped: request already done
    predrafted_steps: int = 0                         # decodes whose draft ran a round early
    host_syncs: dict = field(default_factory=dict)    # "file:line" -> count (debug_syncs)


@dataclass
class Pending:
    """A launched forward whose results the host has not processed yet."""
    kind: str                      # "prefill" | "decode"
    reqs: list
    results: list                  # device tensors
    host: Optional[list]           # pinned copies (async_d2h) or None
    copy_done: object


class Scheduler:
    def __init__(self, worker, kv: KVManager, device: Device, *, max_running: int,
                 reserve_per_decode: int, alloc_len_per_decode: int = 1,
                 tokens_per_decode: int = 1, max_prefill_tokens: int = 8192,
                 loop: LoopOptions = LoopOptions(),
                 on_iteration: Optional[Callable[[], None]] = None, spans: Spans = NO_SPANS,
                 on_step: Optional[Callable[[], None]] = None):
        self.spans = spans
        self.on_step = on_step          # e.g. the profiler's step()
        self.on_iteration = on_iteration
        self.worker = worker
        self.kv = kv
        self.max_running = max_running
        self.reserve = reserve_per_decode
        self.lag = alloc_len_per_decode if loop.overlap else 0   # in-flight advance bound
        self.tokens_per_decode = tokens_per_decode      # KV entries one decode may write
        self.max_prefill_tokens = max_prefill_tokens
        self.opt = loop
        self.dev = device
        self.device = device.torch_device
        cur = device.current_stream()
        self.schedule_stream = device.new_stream() if loop.overlap else cur
        self.forward_stream = device.new_stream() if loop.overlap else cur
        self.copy_stream = device.new_stream() if loop.overlap else cur
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.finished: list[Req] = []
        self.pending: Optional[Pending] = None
        self.keep_alive: deque = deque(maxlen=2)        # inputs still read on the device
        # The decode batch's device inputs (rows, sampling), reused while the batch is the
        # same requests on the same rows: a steady decode step does no H2D for them.
        self._batch_key: Optional[tuple] = None
        self._batch_tensors: Optional[tuple] = None
        self.stats = StepStats()
        self.syncs = SyncRecorder(enabled=loop.debug_syncs and device.is_cuda)

    # -- queue ---------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, rid: int) -> bool:
        """End a request now. Its KV is released at once; a step still in flight for it
        becomes an overshoot step (its results are dropped). Returns False if unknown."""
        for r in list(self.waiting):
            if r.rid == rid:
                self.waiting.remove(r)
                r.finished_reason = "abort"
                self.finished.append(r)
                return True
        for r in self.running:
            if r.rid == rid:
                r.finished_reason = "abort"
                self._finish_done()
                return True
        return False

    def check_identity(self) -> None:
        """Live-request identity: len(prompt) + len(output) == kv_committed_len + 1, for
        every running request whose results are all processed."""
        inflight = set(map(id, self.pending.reqs)) if self.pending else set()
        bad = [(r.rid, len(r.prompt_ids) + len(r.output_ids), r.kv.kv_committed_len + 1)
               for r in self.running if id(r) not in inflight
               if len(r.prompt_ids) + len(r.output_ids) != r.kv.kv_committed_len + 1]
        if bad:
            raise InvariantError("live-request identity len(prompt)+len(output) == "
                                 f"kv_committed_len+1 violated for (rid, lhs, rhs) {bad[:4]}.")

    def live_kv(self) -> dict:
        return {r.rid: r.kv for r in self.running if r.kv is not None}

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and self.pending is None

    # -- loop ----------------------------------------------------------------------------
    def run(self) -> None:
        while not self.idle:
            self.step()

    def step(self) -> None:
        """One iteration (see the module docstring)."""
        t0 = time.perf_counter()
        sp = self.spans
        if sp.timeline is not None:
            sp.begin_step(sp.timeline.next_step())
        with sp.stage("schedule", "host"), self.dev.stream(self.schedule_stream):
            # WAR: rows/pages freed by processed results may still be read by the step in
            # flight; this stream's writes must follow the forward stream's reads.
            self.schedule_stream.wait_stream(self.forward_stream)
            new = self._admit()
            batch = self._schedule_decode() if not new and self.running else []
        if not new and not batch:              # only in-flight work left: finish it
            if self.pending is not None:
                self._process(self._take_pending())
            return
        kind, reqs = ("prefill", new) if new else ("decode", batch)
        with sp.stage(step_name(kind, len(reqs)), "host"), self.syncs.record(kind):
            pend = self._launch(kind, reqs)
            if self.opt.overlap:
                prev, self.pending = self.pending, pend
                if prev is not None:
                    self._process(prev)
            else:
                self._process(pend)
        dt = time.perf_counter() - t0
        if kind == "prefill":
            self.stats.prefill_steps += 1
        else:
            self.stats.decode_steps += 1
            self.stats.decode_time_s += dt
            self.stats.decode_step_times_s.append(dt)
        self.stats.step_times_s.append(dt)
        self.stats.host_syncs = self.syncs.counts
        if self.on_iteration:
            self.on_iteration()
        if self.on_step:
            self.on_step()

    def drain(self) -> None:
        """Process the in-flight result now (host waits for it)."""
        if self.pending is not None:
            self._process(self._take_pending())

    def _take_pending(self) -> Pending:
        p, self.pending = self.pending, None
        return p

    # -- schedule ------------------------------------------------------------------------
    def _host_seq(self, r: Req) -> int:
        """The host's lower bound of a request's KV length (its prefill may be unprocessed)."""
        return max(r.kv.kv_committed_len, r.prefill_len)

    def _admit(self) -> list[Req]:
        new, tokens = [], 0
        while self.waiting and len(self.running) + len(new) < self.max_running:
            req = self.waiting[0]
            n = len(req.fill_ids())
            if new and tokens + n > self.max_prefill_tokens:
                break
            kv = self.kv.admit(n + self.reserve, rid=req.rid)
            if kv is None:
                break
            req.kv, req.prefill_len, req.predrafted = kv, n, False
            new.append(self.waiting.popleft())
            tokens += n
        return new

    def _finishing_in_flight(self) -> set:
        """ids of requests the host can tell (from lengths) the in-flight step finishes."""
        p = self.pending
        if p is None:
            return set()
        return {id(r) for r in p.reqs if len(r.output_ids) + 1 >= r.max_new_tokens}

    def _schedule_decode(self) -> list[Req]:
        """Every running request gets room for its next decode, retracting if needed."""
        while True:
            done = self._finishing_in_flight()
            batch = [r for r in self.running if id(r) not in done]
            if not batch:
                return []
            items = [(r.kv, self._host_seq(r) + self.reserve) for r in batch]
            if self.kv.extend_many(items, rids=[r.rid for r in batch]):
                return batch
            if self.pending is not None:        # results first: they may free KV
                self.drain()
                continue
            victim = self.running.pop()            # most recently admitted
            self._release([victim])
            victim.num_retractions += 1
            victim.prefill_len, victim.predrafted = 0, False
            self.stats.retractions += 1
            self.waiting.appendleft(victim)

    # -- launch --------------------------------------------------------------------------
    def _sampling(self, reqs: list[Req], counters: Optional[list[int]]) -> SamplingTensors:
        h2d = self.dev.h2d
        return SamplingTensors(
            temperature=h2d([r.sampling.temperature for r in reqs], torch.float32),
            top_p=h2d([r.sampling.top_p for r in reqs], torch.float32),
            seeds=h2d([r.sampling.seed for r in reqs], torch.long),
            counters=None if counters is None else h2d(counters, torch.long))

    def _launch(self, kind: str, reqs: list[Req]) -> Pending:
        sp = self.spans
        with sp.stage("prepare", "host"), self.dev.stream(self.schedule_stream):
            x = self._prefill_inputs(reqs) if kind == "prefill" else self._decode_inputs(reqs)
        self.keep_alive.append(x)
        self.forward_stream.wait_stream(self.schedule_stream)
        with self.dev.stream(self.forward_stream):
            if kind == "prefill":
                results = [self.worker.prefill(x)]
                self.running.extend(reqs)
            else:
                self.stats.predrafted_steps += x.predrafted
                out = self.worker.decode(x)
                results = [out.tokens, out.accept_lens]
                for r in reqs:
                    r.predrafted = self.opt.draft_preexec
        return self._start_copy(kind, reqs, results)

    def _prefill_inputs(self, reqs: list[Req]) -> PrefillInputs:
        h2d = self.dev.h2d
        fills = [r.fill_ids() for r in reqs]
        lens = [len(f) for f in fills]
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        return PrefillInputs(h2d([t for f in fills for t in f], torch.long),
                             h2d([r.kv.row for r in reqs], torch.long), h2d(lens, torch.long),
                             h2d(cu, torch.long), h2d([i for n in lens for i in range(n)],
                                                      torch.long),
                             max(lens), self._sampling(reqs, lens))

    def _decode_inputs(self, reqs: list[Req]) -> DecodeInputs:
        key = tuple((r.rid, r.kv.row) for r in reqs)
        if key != self._batch_key:        # never written in place: safe to reuse while read
            self._batch_key = key
            self._batch_tensors = (self.dev.h2d([r.kv.row for r in reqs], torch.long),
                                   self._sampling(reqs, None))
        rows, sampling = self._batch_tensors
        if self.opt.overlap and not self.opt.device_seq_lens:
            # The host mirror of the device lengths (SGLang's needs_cpu_seq_lens): waits for
            # the previous verify's publish -- the publish-point host sync.
            with self.spans.stage("sync", "host"):
                seq = max(self.worker.relay.seq_lens[rows].tolist())
        else:
            seq = max(self._host_seq(r) for r in reqs) + self.lag
        return DecodeInputs(
            rows=rows, sampling=sampling,
            max_kv=min(self.kv.width, seq + self.tokens_per_decode),
            all_greedy=all(r.sampling.temperature == 0 for r in reqs),
            predrafted=all(r.predrafted for r in reqs))

    # -- results -------------------------------------------------------------------------
    def _start_copy(self, kind: str, reqs: list, results: list) -> Pending:
        """d2h of the results: async into pinned memory on the copy stream (copy_done)."""
        done = self.dev.new_event()
        host = None
        if self.opt.async_d2h:
            with self.dev.stream(self.copy_stream):
                # The wait, the host buffers and `done` stay outside the span: d2h's event
                # pair starts once the forward work it copies has finished and times the copies.
                self.copy_stream.wait_stream(self.forward_stream)
                host = [self.dev.empty_pinned(t.shape, t.dtype) for t in results]
                with self.spans.stage("d2h", "copy"):
                    for h, t in zip(host, results):
                        h.copy_(t, non_blocking=True)
                done.record(self.copy_stream)
        return Pending(kind, reqs, results, host, done)

    def _process(self, p: Pending) -> None:
        with self.spans.stage("sync", "host"):
            if p.host is not None:
                p.copy_done.synchronize()
                vals = [h.tolist() for h in p.host]
            else:       # a blocking copy: waits for everything queued on the device
                vals = [t.tolist() for t in p.results]
        with self.spans.stage("process_result", "host"):
            if p.kind == "prefill":
                self._commit_prefill(p.reqs, vals[0])
            else:
                self._commit_decode(p.reqs, vals[0], vals[1])
            self._finish_done()

    def _commit_prefill(self, reqs: list[Req], toks: list) -> None:
        for r, t in zip(reqs, toks):
            if r.finished or r.kv is None:
                continue
            r.kv.kv_committed_len = r.prefill_len
            r.append_tokens([t])

    def _commit_decode(self, reqs: list[Req], toks: list, lens: list) -> None:
        for r, t, n in zip(reqs, toks, lens):
            if r.finished or r.kv is None:       # overshoot row: commits nothing
                self.stats.overshoot_rows += 1
                continue
            self.stats.accept_lens.append(n)
            kept = r.append_tokens(t[:n])
            self.stats.decode_tokens += kept
            if not r.finished:             # the one place kv_committed_len advances
                r.kv.kv_committed_len += n

    def _finish_done(self) -> None:
        done = [r for r in self.running if r.finished]
        if done:
            self.running = [r for r in self.running if not r.finished]
            self._release(done)
            self.finished.extend(done)

    def _release(self, reqs: list[Req]) -> None:
        kvs = [r.kv for r in reqs if r.kv is not None]
        self.kv.release(kvs)
        for r in reqs:
            r.kv = None
