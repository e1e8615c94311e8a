"""The host's view of the requests that hold a req_to_token row, as arrays indexed by row,
and the decode batch over them: what a decode step reads and advances on the host without
a loop over its requests.

    per row (HostRows)    rid          the request holding the row (-1: free)
                          out_len      len(output_ids)
                          max_new      max_new_tokens
                          prefill_len  tokens its last (re-)prefill fed
    kv_committed_len      the KV manager's `committed[row]` (mem/kv_manager.py)
    Batch                 a decode batch: reqs, kvs, rows [B], rids [B], stop ids [B, S] (-1
                          padded), all_greedy; built once per running set (the scheduler
                          caches it while the set is unchanged)
Each array is written in one place: `take` (a row admitted: rid, lengths, limit), `free`
(rid -1), result processing (out_len += tokens kept). A lane of a launched step is live
while its row still holds the rid it was launched with: an overshoot lane (the request
finished, was aborted or retracted since) is not.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core import Req


class HostRows:
    def __init__(self, num_rows: int):
        R = num_rows + 1
        self.rid = np.full(R, -1, dtype=np.int64)
        self.out_len = np.zeros(R, dtype=np.int64)
        self.max_new = np.zeros(R, dtype=np.int64)
        self.prefill_len = np.zeros(R, dtype=np.int64)

    def take(self, reqs: list[Req]) -> None:
        """Admitted requests (their rows just taken)."""
        for r in reqs:
            row = r.kv.row
            self.rid[row] = r.rid
            self.out_len[row] = len(r.output_ids)
            self.max_new[row] = r.max_new_tokens
            self.prefill_len[row] = r.prefill_len

    def free(self, reqs: list[Req]) -> None:
        """Requests about to give their rows back."""
        for r in reqs:
            if r.kv is not None:
                self.rid[r.kv.row] = -1

    def live(self, rows: np.ndarray, rids: np.ndarray) -> np.ndarray:
        """Lanes whose rows still hold the requests they were launched with."""
        return self.rid[rows] == rids


@dataclass(frozen=True)
class Batch:
    reqs: list
    kvs: list                   # their ReqKV, in lane order
    rows: np.ndarray            # [B] int64 req_to_token rows
    rids: np.ndarray            # [B] int64
    stops: np.ndarray           # [B, S] int64 stop ids, -1 padded (S >= 1)
    all_greedy: bool
    has_stops: bool             # some lane has a stop id

    def __len__(self) -> int:
        return len(self.reqs)

    @classmethod
    def of(cls, reqs: list[Req]) -> "Batch":
        S = max([len(r.stop_ids) for r in reqs] + [1])
        stops = np.full((len(reqs), S), -1, dtype=np.int64)
        for i, r in enumerate(reqs):
            if r.stop_ids:
                stops[i, :len(r.stop_ids)] = sorted(r.stop_ids)
        return cls(reqs, [r.kv for r in reqs], np.array([r.kv.row for r in reqs], dtype=np.int64),
                   np.array([r.rid for r in reqs], dtype=np.int64), stops,
                   all(r.sampling.temperature == 0 for r in reqs), bool((stops >= 0).any()))
