"""KV admission and retraction: the memory side of the `schedule` stage.

    admit    waiting head -> a row + pages for (prompt + output) + the decode reserve,
             FIFO, up to max_running and max_prefill_tokens per prefill batch
    chunks   the next prefill forward: every admitted request whose prefill is under way
             gets its next chunk, up to chunk_size tokens in all (chunked prefill; KV pages
             were all allocated at admission, so a chunk allocates nothing)

                 fill ids  [0 ........ prefilled)[prefilled ... prefilled + n)[ ... prefill_len)
                            KV written (earlier)   this chunk                  later chunks
    reserve  every decode lane gets room for its next decode on its host length:
             max(kv_committed_len, prefill_len) + reserve_per_decode (all-or-nothing,
             one table write; array operations over the batch, rows.py)
    retract  the most recently admitted request: KV freed, back at the head of the queue,
             re-prefilled later with prompt + output (nothing is lost)
The host length of a request is a lower bound: under overlap its last step is in flight.
Admission and release keep the per-row host arrays (sched/rows.py) in step with the rows.
"""
from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

from ..core import Req
from ..mem.kv_manager import KVManager
from .rows import Batch, HostRows


class KVAdmission:
    def __init__(self, kv: KVManager, *, max_running: int, reserve_per_decode: int,
                 max_prefill_tokens: int = 8192, chunk_size: Optional[int] = None):
        self.kv = kv
        self.host = HostRows(kv.pool.num_rows)
        self.max_running = max_running
        self.reserve = reserve_per_decode
        self.max_prefill_tokens = max_prefill_tokens
        self.chunk_size = chunk_size        # None: a prompt is prefilled in one forward

    def admit(self, waiting: deque, n_running: int) -> list[Req]:
        new, tokens = [], 0
        while waiting and n_running + len(new) < self.max_running:
            req = waiting[0]
            n = len(req.fill_ids())
            if new and tokens + n > self.max_prefill_tokens:
                break
            kv = self.kv.admit(n + self.reserve, rid=req.rid)
            if kv is None:
                break
            req.kv, req.prefill_len, req.prefilled = kv, n, 0
            new.append(waiting.popleft())
            tokens += n
        self.host.take(new)
        return new

    @staticmethod
    def prefilling(running: list[Req]) -> list[Req]:
        """Running requests whose (chunked) prefill is not fully launched yet."""
        return [r for r in running if not r.finished and r.prefilled < r.prefill_len]

    def chunks(self, reqs: list[Req]) -> list[tuple[Req, int, int]]:
        """The next prefill forward: (request, start, n) per request of `reqs` in order, at
        most chunk_size tokens in all (at least one token); advances `prefilled`."""
        budget = self.chunk_size or float("inf")
        plan = []
        for r in reqs:
            n = int(min(r.prefill_len - r.prefilled, budget))
            if n <= 0:
                break
            plan.append((r, r.prefilled, n))
            r.prefilled += n
            budget -= n
        return plan

    def host_seq_rows(self, rows: np.ndarray) -> np.ndarray:
        """The host's lower bound of the KV length of the requests on these rows (their
        prefill may be unprocessed): max(kv_committed_len, prefill_len), as one array."""
        return np.maximum(self.kv.committed[rows], self.host.prefill_len[rows])

    def reserve_decode(self, batch: Batch) -> bool:
        return self.kv.reserve_rows(batch.kvs, batch.rows,
                                    self.host_seq_rows(batch.rows) + self.reserve, batch.rids)

    def retract(self, running: list[Req], waiting: deque) -> Req:
        victim = running.pop()                 # most recently admitted
        self.release([victim])
        victim.num_retractions += 1
        victim.prefill_len, victim.prefilled = 0, 0
        waiting.appendleft(victim)
        return victim

    def release(self, reqs: list[Req]) -> None:
        self.host.free(reqs)
        self.kv.release([r.kv for r in reqs if r.kv is not None])
        for r in reqs:
            r.kv = None

    def need_for(self, req: Req) -> int:
        return len(req.fill_ids()) + self.reserve
