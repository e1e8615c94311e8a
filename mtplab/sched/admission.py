"""KV admission and retraction: the memory side of the `schedule` stage.

    admit    waiting head -> a row + pages for (prompt + output) + the decode reserve,
             FIFO, up to max_running and max_prefill_tokens per prefill batch
    reserve  every decode lane gets room for its next decode on its host length:
             host_seq + reserve_per_decode (all-or-nothing, one table write)
    retract  the most recently admitted request: KV freed, back at the head of the queue,
             re-prefilled later with prompt + output (nothing is lost)
The host length of a request is a lower bound: under overlap its last step is in flight.
"""
from __future__ import annotations

from collections import deque

from ..core import Req
from ..mem.kv_manager import KVManager


class KVAdmission:
    def __init__(self, kv: KVManager, *, max_running: int, reserve_per_decode: int,
                 max_prefill_tokens: int = 8192):
        self.kv = kv
        self.max_running = max_running
        self.reserve = reserve_per_decode
        self.max_prefill_tokens = max_prefill_tokens

    @staticmethod
    def host_seq(r: Req) -> int:
        """The host's lower bound of a request's KV length (its prefill may be unprocessed)."""
        return max(r.kv.kv_committed_len, r.prefill_len)

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
            req.kv, req.prefill_len, req.predrafted = kv, n, False
            new.append(waiting.popleft())
            tokens += n
        return new

    def reserve_decode(self, batch: list[Req]) -> bool:
        items = [(r.kv, self.host_seq(r) + self.reserve) for r in batch]
        return self.kv.extend_many(items, rids=[r.rid for r in batch])

    def retract(self, running: list[Req], waiting: deque) -> Req:
        victim = running.pop()                 # most recently admitted
        self.release([victim])
        victim.num_retractions += 1
        victim.prefill_len, victim.predrafted = 0, False
        waiting.appendleft(victim)
        return victim

    def release(self, reqs: list[Req]) -> None:
        self.kv.release([r.kv for r in reqs if r.kv is not None])
        for r in reqs:
            r.kv = None

    def need_for(self, req: Req) -> int:
        return len(req.fill_ids()) + self.reserve
