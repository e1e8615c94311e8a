"""Per-request KV ownership on top of the allocator and the req_to_token pool.

Per request (ReqKV):  0 <= kv_committed_len <= kv_allocated_len <= W
    kv_allocated_len = len(pages) * P   (allocation is page-granular, entries in row order)
    kv_committed_len = entries holding valid KV (advanced only by result processing)
Rejected draft/verify slots are never freed per step: they stay inside the allocation and are
overwritten. Everything is freed at release.
"""
from __future__ import annotations

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

    def pages_needed(self, kv: ReqKV | None, need_len: int) -> int:
        have = kv.kv_allocated_len if kv else 0
        return max(0, cdiv(need_len, self.P) - have // self.P)

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
        kv = ReqKV(row=self.pool.alloc(), page_size=self.P)
        kv.pages = self.allocator.alloc_pages(n)
        self.pool.write([kv.row], [0], [self.allocator.page_slots(kv.pages)])
        return kv

    def extend_many(self, items: list[tuple[ReqKV, int]], rids=None) -> bool:
        """Grow each kv to cover its need_len (page aligned), with one table write.
        All-or-nothing: returns False and allocates nothing when the pages are not free."""
        plan = [(kv, self.pages_needed(kv, need)) for kv, need in items]
        for i, (kv, need) in enumerate(items):
            self.check_row(need, rids[i] if rids else None)
        if sum(n for _, n in plan) > self.allocator.free_pages:
            return False
        rows, starts, slots = [], [], []
        for kv, n in plan:
            if n == 0:
                continue
            new = self.allocator.alloc_pages(n)
            rows.append(kv.row)
            starts.append(kv.kv_allocated_len)
            slots.append(self.allocator.page_slots(new))
            kv.pages.extend(new)
        self.pool.write(rows, starts, slots)
        return True

    def release(self, kvs: list[ReqKV]) -> None:
        """Free every page and row of the given requests (one grouped free)."""
        pages = [p for kv in kvs for p in kv.pages]
        if pages:
            self.allocator.free_pages_list(pages)
        for kv in kvs:
            self.pool.free(kv.row)
            kv.pages = []
