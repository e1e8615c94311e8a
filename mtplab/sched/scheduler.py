"""The synchronous ("overlap off") scheduler loop with continuous batching.

    step():  schedule  -> admit waiting requests whose KV fits (prefill has priority)
             launch    -> prefill batch, or one decode over every running request
             process   -> .tolist() the tokens, commit KV lengths, append outputs,
                          finish (stop / length), release KV
Launch and result processing are separate methods so the overlap loop can run
process(k-1) after launch(k). kv_committed_len advances only in `_process_*`.
KV pressure: a decode that cannot get its reserve retracts the most recently admitted
request (KV freed, request back at the head of the queue, re-prefilled later with
prompt + output); nothing is ever lost.
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
from ..profiling.spans import NO_SPANS, Spans
from ..profiling.stages import step_name
from ..spec.target_worker import DecodeInputs, DecodeOut, PrefillInputs, SamplingTensors
from .request import Req


@dataclass
class StepStats:
    prefill_steps: int = 0
    decode_steps: int = 0
    retractions: int = 0
    decode_tokens: int = 0
    decode_time_s: float = 0.0
    step_times_s: list = field(default_factory=list)
    accept_lens: list = field(default_factory=list)   # per request per decode step


class Scheduler:
    def __init__(self, worker, kv: KVManager, device: Device, *, max_running: int,
                 reserve_per_decode: int, tokens_per_decode: int = 1,
                 max_prefill_tokens: int = 8192,
                 on_iteration: Optional[Callable[[], None]] = None, spans: Spans = NO_SPANS,
                 on_step: Optional[Callable[[], None]] = None):
        self.spans = spans
        self.on_step = on_step          # e.g. the profiler's step()
        self.worker = worker
        self.kv = kv
        self.max_running = max_running
        self.reserve = reserve_per_decode
        self.tokens_per_decode = tokens_per_decode      # KV entries one decode writes (1 or D)
        self.max_prefill_tokens = max_prefill_tokens
        self.on_iteration = on_iteration
        self.dev = device
        self.device = device.torch_device
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.finished: list[Req] = []
        self.stats = StepStats()

    # -- queue ---------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, rid: int) -> None:
        for q in (self.waiting, self.running):
            for r in list(q):
                if r.rid == rid:
                    r.finished_reason = "abort"
                    q.remove(r)
                    self._release([r])
                    self.finished.append(r)

    def check_identity(self) -> None:
        """Live-request identity: len(prompt) + len(output) == kv_committed_len + 1."""
        bad = [(r.rid, len(r.prompt_ids) + len(r.output_ids), r.kv.kv_committed_len + 1)
               for r in self.running
               if len(r.prompt_ids) + len(r.output_ids) != r.kv.kv_committed_len + 1]
        if bad:
            raise InvariantError("live-request identity len(prompt)+len(output) == "
                                 f"kv_committed_len+1 violated for (rid, lhs, rhs) {bad[:4]}.")

    def live_kv(self) -> dict:
        return {r.rid: r.kv for r in self.running if r.kv is not None}

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # -- loop ----------------------------------------------------------------------------
    def run(self) -> None:
        while not self.idle:
            self.step()

    def step(self) -> None:
        """One iteration: schedule, then a prefill or a decode step, results processed."""
        t0 = time.perf_counter()
        sp = self.spans
        if sp.timeline is not None:
            sp.timeline.next_step()
        with sp.stage("schedule", "host"):
            new = self._admit()
            batch = self._schedule_decode() if not new and self.running else []
        if new:
            with sp.stage(step_name("prefill", len(new)), "host"):
                self._process_prefill(new, self._launch_prefill(new))
            self.stats.prefill_steps += 1
        elif batch:
            with sp.stage(step_name("decode", len(batch)), "host"):
                self._process_decode(batch, self._launch_decode(batch))
            self.stats.decode_steps += 1
            self.stats.decode_tokens += sum(self.stats.accept_lens[-len(batch):])
            self.stats.decode_time_s += time.perf_counter() - t0
        self.stats.step_times_s.append(time.perf_counter() - t0)
        if self.on_iteration:
            self.on_iteration()
        if self.on_step:
            self.on_step()

    # -- schedule ------------------------------------------------------------------------
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
            req.kv = kv
            new.append(self.waiting.popleft())
            tokens += n
        return new

    def _schedule_decode(self) -> list[Req]:
        """Every running request gets room for its next decode, retracting if needed."""
        while True:
            items = [(r.kv, r.kv.kv_committed_len + self.reserve) for r in self.running]
            if self.kv.extend_many(items, rids=[r.rid for r in self.running]):
                return list(self.running)
            victim = self.running.pop()            # most recently admitted
            self._release([victim])
            victim.num_retractions += 1
            self.stats.retractions += 1
            self.waiting.appendleft(victim)

    # -- launch --------------------------------------------------------------------------
    def _sampling(self, reqs: list[Req], counters: list[int]) -> SamplingTensors:
        dev = self.device
        return SamplingTensors(
            temperature=torch.tensor([r.sampling.temperature for r in reqs], dtype=torch.float32,
                                     device=dev),
            top_p=torch.tensor([r.sampling.top_p for r in reqs], dtype=torch.float32, device=dev),
            seeds=torch.tensor([r.sampling.seed for r in reqs], dtype=torch.long, device=dev),
            counters=torch.tensor(counters, dtype=torch.long, device=dev))

    def _launch_prefill(self, reqs: list[Req]) -> torch.Tensor:
        with self.spans.stage("prepare", "host"):
            x = self._prefill_inputs(reqs)
        return self.worker.prefill(x)

    def _prefill_inputs(self, reqs: list[Req]) -> PrefillInputs:
        dev = self.device
        fills = [r.fill_ids() for r in reqs]
        lens = [len(f) for f in fills]
        ids = torch.tensor([t for f in fills for t in f], dtype=torch.long, device=dev)
        q_lens = torch.tensor(lens, dtype=torch.long, device=dev)
        cu = torch.zeros(len(reqs) + 1, dtype=torch.long, device=dev)
        cu[1:] = torch.cumsum(q_lens, 0)
        pos = torch.cat([torch.arange(n, device=dev) for n in lens])
        return PrefillInputs(ids, torch.tensor([r.kv.row for r in reqs], device=dev), q_lens, cu,
                             pos, max(lens), self._sampling(reqs, lens))

    def _launch_decode(self, reqs: list[Req]) -> DecodeOut:
        with self.spans.stage("prepare", "host"):
            x = self._decode_inputs(reqs)
        return self.worker.decode(x)

    def _decode_inputs(self, reqs: list[Req]) -> DecodeInputs:
        dev = self.device
        seq_lens = [r.kv.kv_committed_len for r in reqs]
        return DecodeInputs(
            rows=torch.tensor([r.kv.row for r in reqs], dtype=torch.long, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.long, device=dev),
            input_ids=torch.tensor([r.output_ids[-1] for r in reqs], dtype=torch.long, device=dev),
            sampling=self._sampling(reqs, [n + 1 for n in seq_lens]),
            max_kv=max(seq_lens) + self.tokens_per_decode,
            all_greedy=all(r.sampling.temperature == 0 for r in reqs))

    # -- process results -----------------------------------------------------------------
    def _to_host(self, *tensors: torch.Tensor) -> list:
        """d2h of the results (async into pinned memory on CUDA), then one host sync."""
        with self.spans.stage("d2h"):
            host = [t.to("cpu", non_blocking=True) for t in tensors]
            done = self.dev.new_event()
            done.record()
        with self.spans.stage("sync", "host"):
            done.synchronize()
        return [h.tolist() for h in host]

    def _process_prefill(self, reqs: list[Req], next_tokens: torch.Tensor) -> None:
        (toks,) = self._to_host(next_tokens)
        with self.spans.stage("process_result", "host"):
            for r, t in zip(reqs, toks):
                r.kv.kv_committed_len = len(r.fill_ids())
                r.append_tokens([t])
            self.running.extend(reqs)
            self._finish_done()

    def _process_decode(self, reqs: list[Req], out: DecodeOut) -> None:
        toks, lens = self._to_host(out.tokens, out.accept_lens)
        with self.spans.stage("process_result", "host"):
            self.stats.accept_lens.extend(lens)
            for r, t, n in zip(reqs, toks, lens):
                r.append_tokens(t[:n])
                if not r.finished:             # the one place kv_committed_len advances
                    r.kv.kv_committed_len += n
            self._finish_done()

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
