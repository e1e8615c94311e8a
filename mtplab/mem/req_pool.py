"""req_to_token pool: one row of slot ids per live request.

    req_to_token[rows+1, W] int32 on the device
      row 0      : padding row (all zeros -> slot 0 of the padding page) for graph-padded lanes
      row r >= 1 : entries [0, kv_allocated_len) hold the request's slots; the rest are stale
"""
from __future__ import annotations

import numpy as np
import torch

from ..device import Device


class ReqPoolError(RuntimeError):
    pass


class ReqToTokenPool:
    def __init__(self, num_rows: int, width: int, device: torch.device, h2d=None):
        """`h2d(list, dtype) -> device tensor`: the engine's pinned staging copy (Device.h2d);
        default: a Device of its own for `device`."""
        self.num_rows = num_rows
        self.width = width
        self.table = torch.zeros(num_rows + 1, width, dtype=torch.int32, device=device)
        self.h2d = h2d or Device(self.table.device).h2d
        self._free: list[int] = list(range(num_rows, 0, -1))
        self._pending: list[tuple] = []       # (row, start, slots) queued by `write`

    @property
    def free_rows(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        return self._free.pop() if self._free else None

    def free(self, row: int) -> None:
        if row <= 0 or row > self.num_rows or row in self._free:
            raise ReqPoolError(f"double free or invalid free of req_to_token row {row}.")
        self._free.append(row)

    def write(self, rows: list[int], starts: list[int], slots: list) -> None:
        """table[rows[i], starts[i] : starts[i]+len(slots[i])] = slots[i], queued: `flush`
        issues every queued write in one H2D copy (the scheduler orders it after the
        in-flight forward's reads of the table first, sched/scheduler.py)."""
        for row, start, s in zip(rows, starts, slots):
            n = len(s)
            if start + n > self.width:
                raise ReqPoolError(f"row {row} would need {start + n} entries but rows are "
                                   f"{self.width} wide.")
            self._pending.append((row, start, s))

    @property
    def pending(self) -> bool:
        """Writes are queued (`flush` has device work to issue)."""
        return bool(self._pending)

    def flush(self) -> None:
        """The queued writes as one pinned staging buffer and one non-blocking H2D copy on
        the current stream (no host sync)."""
        if not self._pending:
            return
        n = [len(s) for _, _, s in self._pending]
        rcv = np.empty((3, sum(n)), dtype=np.int32)
        rcv[0] = np.repeat([row for row, _, _ in self._pending], n)
        rcv[1] = np.concatenate([np.arange(st, st + k) for (_, st, _), k in zip(self._pending, n)])
        rcv[2] = np.concatenate([np.asarray(s) for _, _, s in self._pending])
        self._pending.clear()
        dev = self.h2d(rcv, torch.int32)                  # int32 indices and values
        self.table.index_put_((dev[0], dev[1]), dev[2])
