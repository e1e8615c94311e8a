"""req_to_token pool: one row of slot ids per live request.

    req_to_token[rows+1, W] int32 on the device
      row 0      : padding row (all zeros -> slot 0 of the padding page) for graph-padded lanes
      row r >= 1 : entries [0, kv_allocated_len) hold the request's slots; the rest are stale
"""
from __future__ import annotations

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
        """table[rows[i], starts[i] : starts[i]+len(slots[i])] = slots[i], in one H2D copy."""
        if not rows:
            return
        r, c, v = [], [], []
        for row, start, s in zip(rows, starts, slots):
            n = len(s)
            if start + n > self.width:
                raise ReqPoolError(f"row {row} would need {start + n} entries but rows are "
                                   f"{self.width} wide.")
            r.extend([row] * n)
            c.extend(range(start, start + n))
            v.extend(int(x) for x in s)
        # one pinned staging buffer, one non-blocking H2D copy (no host sync)
        dev = self.h2d([r, c, v], torch.int32)            # int32 indices and values
        self.table.index_put_((dev[0], dev[1]), dev[2])
