"""Per-request KV ownership on top of the allocator and the req_to_token pool.

Per request (ReqKV):  0 <= kv_committed_len <= kv_allocated_len <= W
    kv_allocated_len = len(pages) * P   (allocation is page-granular, entries in row order)
    kv_committed_len = entries holding valid KV (advanced only by result processing)
Rejected draft/verify slots are never freed per step: they stay inside the allocation and are
overwritten. Everything is freed at release.
The manager keeps per-row arrays (row = req_to_token row): `committed[row]` is the request's
kv_committed_len (ReqKV reads and writes it there), `allocated[row]` mirrors len(pages) * P;
a decode batch's reserve (`reserve_rows`) is then a few array operations, with Python only
for the lanes that take a page.
"""
from __future__ import annotations

import numpy as np

from ..core import ReqKV
from .allocator import PagedAllocator
from .req_pool import ReqToTokenPool
from .sizing import cdiv


class RowOverflowError(RuntimeError):
    """A request would need more req_to_token entries than a row holds."""




class KVManager:
    def __init__(self, allocator: PagedAllocator, pool: ReqToTokenPool):
        self.allocator = allocator
        self.pool = pool
        self.P = allocator.page_size
        self.width = pool.width
        self.committed = np.zeros(pool.num_rows + 1, dtype=np.int64)
        self.allocated = np.zeros(pool.num_rows + 1, dtype=np.int64)

    def check_row(self, need_len: int, rid=None) -> None:
        """The always-on CPU check max(next_alloc) <= W."""
        if need_len > self.width:
            raise RowOverflowError(
                f"request {rid} needs {need_len} req_to_token entries but rows are {self.width} "
                "wide; the row width formula (mem/sizing.row_width) or context_len is wrong.")

    def admit(self, need_len: int, rid=None) -> ReqKV | None:
        """A row plus pages covering `need_len` entries, or None when they are not free."""
        self.check_row(need_len, rid)
        n = cdiv(need_len, self.P)
        if n > self.allocator.free_pages or self.pool.free_rows == 0:
            return None
        kv = ReqKV(self.pool.alloc(), self.P, lens=self.committed)
        kv.pages = self.allocator.alloc_pages(n)
        kv.kv_committed_len = 0
        self.allocated[kv.row] = n * self.P
        self.pool.write([kv.row], [0], [self.allocator.page_slots(kv.pages)])
        return kv

    def reserve_rows(self, kvs: list[ReqKV], rows: np.ndarray, need: np.ndarray,
                     rids=None) -> bool:
        """Grow the kvs so lane i (kvs[i] on `rows[i]`) covers `need[i]` entries, page
        aligned. The pages each lane lacks are computed at once; only lanes that take a page
        run Python. All-or-nothing: returns False and allocates nothing when the pages are
        not free; one table write."""
        alloc = self.allocated[rows]
        if (need <= alloc).all():              # the common step: every lane has room
            return True
        if int(need.max()) > self.width:
            i = int(need.argmax())
            self.check_row(int(need[i]), rids[i] if rids is not None else None)
        n = np.maximum(0, -(-need // self.P) - alloc // self.P)
        total = int(n.sum())
        if total == 0:
            return True
        if total > self.allocator.free_pages:
            return False
        starts, slots, grow = [], [], np.flatnonzero(n)
        for i in grow.tolist():
            kv, k = kvs[i], int(n[i])
            new = self.allocator.alloc_pages(k)
            starts.append(kv.kv_allocated_len)
            slots.append(self.allocator.page_slots(new))
            kv.pages.extend(new)
        self.allocated[rows[grow]] += n[grow] * self.P
        self.pool.write(rows[grow].tolist(), starts, slots)
        return True

    def release(self, kvs: list[ReqKV]) -> None:
        """Free every page and row of the given requests (one grouped free)."""
        pages = [p for kv in kvs for p in kv.pages]
        if pages:
            self.allocator.free_pages_list(pages)
        for kv in kvs:
            self.pool.free(kv.row)
            self.allocated[kv.row] = 0
            kv.pages = []
