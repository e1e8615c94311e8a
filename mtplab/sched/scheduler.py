"""The scheduler: continuous batching, a normal loop and an overlap loop, side by side.

    normal  (overlap off), iteration k:
        schedule k -> prepare k -> forward k -> d2h k -> sync -> process_result k
    overlap (overlap on),  iteration k:
        schedule k (on lagging host lengths) -> prepare k -> forward k -> d2h k
        -> process_result k-1 (sync on k-1's copy_done only) ; k stays in flight

    streams (CUDA; on CPU all no-ops, same order):
        schedule  req_to_token writes, input H2D      (waits forward first: WAR, only when
                                                       the step writes the table)
        forward   all model work; lengths/inputs resolved from the future map on the device
                  (waits schedule only when the step issued H2D work there)
        copy      D2H of tokens + accept lengths into pinned buffers, `copy_done` event
    The stream waits reuse one event per stream pair (Device.order). A graphed decode's
    results are graph buffers the next decode overwrites: before launching decode k+1 the
    forward stream waits for decode k's `copy_done` unless the host sees it done (a query).
The host state of the running requests is arrays by req_to_token row (rows.py): a decode
batch (Batch) is built once per running set; finishing-in-flight, the KV reserve, the length
bound and result processing are array operations over its lanes.

The file of each stage: docs/design.md "Stage → file map".

The host never waits for iteration k before launching k+1: lengths and next inputs travel on
the device through the future map. Host `kv_committed_len` therefore lags one step, and the
per-decode KV reserve is 2 x alloc_len_per_decode. kv_committed_len advances in exactly one
place (process_result.py), never for a request already finished (an overshoot step of a
finished request commits nothing; its KV writes land before any new owner's, in forward-stream
order). A request the host can tell will finish in flight (length) is left out of the next
batch. KV pressure: a decode that cannot get its reserve first drains the in-flight result,
then retracts the most recently admitted request (admission.py); nothing is ever lost.
A step that can make no progress while requests wait raises SchedulerStallError; an error or
Ctrl-C inside a step leaves the state to `abort_all`, which frees every row and page.
"""
from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from ..core import Req, Worker
from ..device import Device
from ..instrument.spans import NO_SPANS, Spans
from ..instrument.syncs import SyncRecorder
from ..loop_options import LoopOptions, reads_lengths
from ..mem.invariants import InvariantError
from ..mem.kv_manager import KVManager
from ..stages import step_name
from .admission import KVAdmission
from .d2h import Pending, Readback
from .future_map import FutureMap
from .prepare import DecodePrepare, prepare_prefill
from .process_result import append_decode, append_prefill
from .rows import Batch

DEFAULT_LOOP = LoopOptions()          # a frozen dataclass: one shared default
STALL_STEPS = 3     # consecutive iterations with nothing launched or processed while requests wait


class SchedulerStallError(RuntimeError):
    """Requests wait but nothing can run (e.g. a prompt larger than the whole KV budget)."""


@dataclass
class StepStats:
    prefill_steps: int = 0
    decode_steps: int = 0
    retractions: int = 0
    decode_tokens: int = 0
    decode_time_s: float = 0.0      # iterations that waited for a decode's results
    step_times_s: list = field(default_factory=list)
    decode_step_times_s: list = field(default_factory=list)
    accept_lens: list = field(default_factory=list)   # per request per decode step
    accept_ctx: list = field(default_factory=list)    # ... its context position (committed
                                                      #   KV before that verify)
    draft_tokens: list = field(default_factory=list)  # ... the draft tokens it proposed
    verify_steps: list = field(default_factory=list)  # per decode step: (iteration that
                                                      #   launched it, live lanes, draft
                                                      #   tokens accepted, proposed)
    overshoot_rows: int = 0                           # results dropped: request already done
    predrafted_steps: int = 0                         # decodes whose draft ran a round early
                                                      #   (the worker says: DecodeOut)
    host_syncs: dict = field(default_factory=dict)    # "file:line" -> count (debug_syncs)


class Scheduler:
    def __init__(self, worker: Worker, kv: KVManager, future_map: FutureMap, device: Device, *,
                 max_running: int,
                 reserve_per_decode: int, alloc_len_per_decode: int = 1,
                 tokens_per_decode: int = 1, max_prefill_tokens: int = 8192,
                 chunked_prefill_size: Optional[int] = None,
                 loop: LoopOptions = DEFAULT_LOOP,
                 on_iteration: Optional[Callable[["Scheduler"], None]] = None,
                 spans: Spans = NO_SPANS, on_step: Optional[Callable[[], None]] = None):
        # The hooks must not refer back to the scheduler's owner (an engine is freed by
        # reference counting): on_step is the engine's StepHooks (sched/hooks.py),
        # on_iteration gets this scheduler as its argument (the invariant checker).
        self.worker, self.kv, self.future_map, self.device = worker, kv, future_map, device
        # The future map's `publish_ready` is waited on only by the host's read of the lengths
        # (loop_options.py reads_lengths).
        self.reads_lengths = reads_lengths(loop, speculative=alloc_len_per_decode > 1)
        future_map.host_reads = self.reads_lengths
        self.spans, self.loop = spans, loop
        self.on_step = on_step              # after every iteration that launched work
        self.on_iteration = on_iteration    # after every iteration (debug_invariants)
        self.admission = KVAdmission(kv, max_running=max_running,
                                     reserve_per_decode=reserve_per_decode,
                                     max_prefill_tokens=max_prefill_tokens,
                                     chunk_size=chunked_prefill_size)
        self.prepare_decode = DecodePrepare(device, kv.width, tokens_per_decode)
        self.lag = alloc_len_per_decode if loop.overlap else 0   # in-flight advance bound
        cur = device.current_stream()
        self.schedule_stream = device.new_stream() if loop.overlap else cur
        self.forward_stream = device.new_stream() if loop.overlap else cur
        self.copy_stream = device.new_stream() if loop.overlap else cur
        self.d2h = Readback(device, spans, self.copy_stream, self.forward_stream,
                            max_running * (tokens_per_decode + 2) + 16)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        # the last decode Batch: `running` is only ever replaced, never changed in place, so
        # the list object names the running set
        self._batch_cache: Optional[tuple] = None
        self._chunking = False          # a chunked prefill may be under way (`schedule`)
        self.finished: list[Req] = []       # finished by the current step only (returned)
        self.in_flight: Optional[Pending] = None
        self.keep_alive: deque = deque(maxlen=2)        # inputs still read on the device
        self.stats = StepStats()
        self.syncs = SyncRecorder(enabled=loop.debug_syncs and device.is_cuda)
        self._stalled = 0
        self._waited: Optional[str] = None   # the kind of the result this iteration waited for
        self.iteration = -1                 # scheduler iterations so far (the event
                                            #   timeline's step numbers)

    # -- the two loops -------------------------------------------------------------------
    def step(self) -> list[Req]:
        """One iteration of the normal or the overlap loop; returns the requests it finished
        (the scheduler keeps no finished request beyond the step that finished it)."""
        self.finished, t0 = [], time.perf_counter()
        self.iteration += 1
        if self.spans.timeline is not None:
            self.spans.begin_step(self.spans.timeline.next_step())
        self._waited = None
        kind = self._overlap_step() if self.loop.overlap else self._normal_step()
        self._account(kind, time.perf_counter() - t0)
        return self.finished

    def _normal_step(self) -> Optional[str]:
        kind, batch = self.schedule()
        if not batch:
            return self._stall()
        with self._step_span(kind, batch):
            self.process_result(self._launch(kind, batch))
        return kind

    def _overlap_step(self) -> Optional[str]:
        kind, batch = self.schedule()
        if not batch:                       # only in-flight work left: finish it
            if self.in_flight is None:
                return self._stall()
            self._waited = self.in_flight.kind
            self.drain()
            return None
        with self._step_span(kind, batch):
            prev, self.in_flight = self.in_flight, self._launch(kind, batch)
            if prev is not None:
                self._waited = prev.kind
                self.process_result(prev)
        return kind

    # -- stages --------------------------------------------------------------------------
    def schedule(self) -> tuple[str, object]:
        """The next chunks of a prefill under way, else admit waiting requests (a prefill
        batch: (request, start, n) chunks), else every running request's decode (a Batch).
        Table writes are queued here (the pool issues them in `launch_prefill` /
        `launch_decode`)."""
        with self.spans.stage("schedule", "host"):
            pending = self.admission.prefilling(self.running) if self._chunking else []
            if not pending:
                pending = self.admission.admit(self.waiting, len(self.running))
                if pending:
                    self.running = self.running + pending
            if pending:
                plan = self.admission.chunks(pending)
                self._chunking = any(r.prefilled < r.prefill_len for r in pending)
                return "prefill", plan
            self._chunking = False
            return "decode", self._decode_batch() if self.running else None

    def launch_prefill(self, chunks: list) -> Pending:
        """prepare -> the worker's prefill forward (prefill, publish, stash) -> d2h. `chunks`:
        (request, start, n) per request; its final chunks give a token."""
        dev = self.device
        with self.spans.stage("prepare", "host"):
            with dev.stream(self.schedule_stream):
                self._flush_table()
                x = prepare_prefill(dev, chunks)
        self.keep_alive.append(x)
        dev.order(self.forward_stream, self.schedule_stream)
        self.spans.mark_launch()
        with dev.stream(self.forward_stream):
            tokens = self.worker.prefill(x)
        return self.d2h("prefill", [r for r, _, _ in chunks], [tokens], self.loop.async_d2h,
                        final=[start + n == r.prefill_len for r, start, n in chunks])

    def launch_decode(self, batch: Batch) -> Pending:
        """prepare -> the worker's decode (resolve .. stash) -> d2h. The schedule stream gets
        work (and the forward stream waits for it) only where there is some: table writes,
        or a batch whose inputs are new."""
        dev, pool = self.device, self.kv.pool
        with self.spans.stage("prepare", "host"):
            if not pool.pending and self.prepare_decode.has(batch) and not self.reads_lengths:
                x, wrote = self._prepare_decode(batch), False     # no device work to issue
            else:
                with dev.stream(self.schedule_stream):
                    wrote = self._flush_table()
                    x = self._prepare_decode(batch)
                    wrote = wrote or self.prepare_decode.fresh
        self.keep_alive.append(x)
        if wrote:
            dev.order(self.forward_stream, self.schedule_stream)
        self.spans.mark_launch()
        with dev.stream(self.forward_stream):
            self._copied_out()
            out = self.worker.decode(x)
        self.stats.predrafted_steps += out.predrafted
        p = self.d2h("decode", batch.reqs, [out.tokens, out.accept_lens],
                     self.loop.async_d2h, batch=batch)
        p.draft_tokens = out.draft_tokens
        return p

    def _launch(self, kind: str, batch) -> Pending:
        p = self.launch_prefill(batch) if kind == "prefill" else self.launch_decode(batch)
        p.step = self.iteration
        return p

    def _flush_table(self) -> bool:
        """Issue the queued req_to_token writes on the schedule stream -> whether there were
        any. WAR: rows/pages freed by processed results may still be read by the step in
        flight; the table writes must follow its reads."""
        pool = self.kv.pool
        if not pool.pending:
            return False
        self.device.order(self.schedule_stream, self.forward_stream)
        pool.flush()
        return True

    def _copied_out(self) -> None:
        """A graphed decode's results are graph buffers: the decode in flight must have copied
        its own out before this one overwrites them (the forward stream waits for its
        `copy_done` unless the host sees it done already)."""
        p = self.in_flight
        if p is not None and p.kind == "decode" and p.copy_done is not None \
                and not p.copy_done.query():
            self.forward_stream.wait_event(p.copy_done)

    def process_result(self, p: Pending) -> None:
        self._stalled = 0
        with self.spans.stage("sync", "host"):
            vals = p.read()
        with self.spans.stage("process_result", "host"):
            host = self.admission.host
            if p.kind == "prefill":
                done = append_prefill(p.reqs, vals[0], host, p.final)
            else:
                done = append_decode(p.batch, vals[0].reshape(len(p.reqs), -1), vals[1], host,
                                     self.kv.committed, self.stats, p.step, p.draft_tokens)
            if done:
                self.finished.extend(self._finish_done())

    def drain(self) -> None:
        """Process the in-flight result now (the host waits for it)."""
        p, self.in_flight = self.in_flight, None
        self.process_result(p)

    # -- schedule helpers ----------------------------------------------------------------
    def _decode_batch(self) -> Optional[Batch]:
        """Every running request gets room for its next decode, retracting if needed."""
        while True:
            batch = self._batch()
            if batch is None or self.admission.reserve_decode(batch):
                return batch
            if self.in_flight is not None:        # results first: they may free KV
                self.drain()
                continue
            self.running = list(self.running)
            self.admission.retract(self.running, self.waiting)
            self.stats.retractions += 1

    def _batch(self) -> Optional[Batch]:
        """The running requests minus those the host can tell (from lengths) the in-flight
        step finishes, as a Batch cached per running list and lanes left out."""
        run, out = self.running, self._finishing_in_flight()
        c = self._batch_cache            # (running list, rows left out, Batch or None)
        if c is None or c[0] is not run or c[1] != out:
            keep = [r for r in run if r.kv.row not in out] if out else run
            c = self._batch_cache = (run, out, Batch.of(keep) if keep else None)
        return c[2]

    def _finishing_in_flight(self) -> tuple:
        """Rows of requests the host can tell (from lengths) the in-flight step finishes."""
        p = self.in_flight
        if p is None:
            return ()
        h = self.admission.host
        rows = p.batch.rows if p.batch is not None else \
            np.array([r.kv.row for r in p.reqs if r.kv is not None], dtype=np.int64)
        fin = rows[h.out_len[rows] + 1 >= h.max_new[rows]]
        return tuple(fin.tolist())

    def _prepare_decode(self, batch: Batch):
        if self.reads_lengths:
            # The host mirror of the device lengths (SGLang's needs_cpu_seq_lens): waits for
            # the previous verify's publish -- the publish-point host sync.
            with self.spans.stage("sync", "host"):
                bound = max(self.future_map.host_seq_lens(
                    self.prepare_decode.tensors(batch)[0], self.schedule_stream))
        else:
            bound = int(self.admission.host_seq_rows(batch.rows).max()) + self.lag
        return self.prepare_decode(batch, bound)

    def _step_span(self, kind: str, batch):
        """The step span (and, with debug_syncs, the sync listing) of one iteration."""
        span = self.spans.step(step_name(kind, len(batch)))
        if not self.syncs.enabled:
            return span
        stack = contextlib.ExitStack()
        stack.enter_context(span)
        stack.enter_context(self.syncs.record(kind))
        return stack

    def _stall(self) -> None:
        if self.idle:
            return None
        self._stalled += 1
        if self._stalled >= STALL_STEPS:
            r = self.waiting[0] if self.waiting else self.running[0]
            raise SchedulerStallError(
                f"no progress for {STALL_STEPS} iterations with {len(self.waiting)} request(s) "
                f"waiting: request {r.rid} needs {self.admission.need_for(r)} KV entries and "
                f"{self.kv.allocator.free_pages} page(s) are free; raise max_total_tokens, "
                "shorten the prompt, or look for leaked KV with check_invariants().")
        return None

    def _account(self, kind: Optional[str], dt: float) -> None:
        """Count the step launched (`kind`); its time goes to the step whose results the
        iteration waited for: under overlap the previous one (the iteration that launches
        the first decode waits for the prefill's forward, the drain for the last decode's),
        else the one it launched."""
        s = self.stats
        timed = self._waited if self.loop.overlap else kind
        if kind == "prefill":
            s.prefill_steps += 1
        elif kind == "decode":
            s.decode_steps += 1
        if timed == "decode":
            s.decode_time_s += dt
            s.decode_step_times_s.append(dt)
        if kind is not None or timed is not None:
            s.step_times_s.append(dt)
            s.host_syncs = self.syncs.counts
        if self.on_iteration is not None:
            self.on_iteration(self)
        if self.on_step is not None:
            self.on_step()

    # -- requests ------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, req) -> bool:
        """End a request now: `req` is the Req itself or its rid. Its KV is released at once;
        a step still in flight for it becomes an overshoot step (its results are dropped).
        Returns False if it is not waiting or running."""
        match = (lambda r: r is req) if isinstance(req, Req) else (lambda r: r.rid == req)
        for r in list(self.waiting):
            if match(r):
                self.waiting.remove(r)
                r.finished_reason = "abort"
                return True
        for r in self.running:
            if match(r):
                r.finished_reason = "abort"
                self._finish_done()
                return True
        return False

    def abort_all(self) -> list[Req]:
        """After an error or Ctrl-C inside a step: every request held ends as 'abort', every
        row and page is freed, nothing stays in flight. The device is synchronized first so no
        queued kernel still writes KV that a new owner gets."""
        with contextlib.suppress(RuntimeError):      # a CUDA error re-raises here: free anyway
            self.device.synchronize()
        held = list(self.waiting) + self.running
        for r in held:
            if not r.finished:
                r.finished_reason = "abort"
        self.admission.release(held)
        self.waiting.clear()
        self.running = []
        self.kv.pool.flush()          # after the synchronize: nothing reads the table now
        self.in_flight = None
        self.keep_alive.clear()
        self.prepare_decode.reset()
        self._batch_cache = None
        self._chunking = False
        self._stalled = 0
        return held

    def _finish_done(self) -> list[Req]:
        """Release the running requests that finished; returns them."""
        done = [r for r in self.running if r.finished]
        if done:
            self.running = [r for r in self.running if not r.finished]
            self.admission.release(done)
        return done

    # -- checks --------------------------------------------------------------------------
    def check_identity(self) -> None:
        """Live-request identity: len(prompt) + len(output) == kv_committed_len + 1, for
        every running request whose results are all processed (a chunked prefill under way
        has no output yet: it is checked once its last chunk is processed)."""
        inflight = set(map(id, self.in_flight.reqs)) if self.in_flight else set()
        bad = [(r.rid, len(r.prompt_ids) + len(r.output_ids), r.kv.kv_committed_len + 1)
               for r in self.running if id(r) not in inflight and r.prefilled >= r.prefill_len
               if len(r.prompt_ids) + len(r.output_ids) != r.kv.kv_committed_len + 1]
        if bad:
            raise InvariantError("live-request identity len(prompt)+len(output) == "
                                 f"kv_committed_len+1 violated for (rid, lhs, rhs) {bad[:4]}.")
        h = self.admission.host
        stale = [r.rid for r in self.running if r.kv is not None and
                 (h.rid[r.kv.row] != r.rid or h.out_len[r.kv.row] != len(r.output_ids))]
        if stale:
            raise InvariantError(f"the host row arrays (sched/rows.py) disagree with requests "
                                 f"{stale[:4]}: rid or len(output_ids) out of step.")

    def live_kv(self) -> dict:
        return {r.rid: r.kv for r in self.running if r.kv is not None}

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and self.in_flight is None
