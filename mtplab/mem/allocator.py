"""Paged KV slot allocator (host side bookkeeping, no device work).

    slots:  [ page 0 | page 1 | page 2 | ... | page num_pages-1 ]   each page = P slots
             ^ reserved padding page: graph-padded lanes and row 0 write here, never allocated
    slot id = page * P + offset

Invariant: every page other than 0 is either free (in `_free`) or owned by exactly one
request; `free + owned == total`. With `debug=True` a per-page state array also catches
double frees and frees of never-allocated pages (use after free checks via `assert_owned`).
"""
from __future__ import annotations

import numpy as np


class AllocatorError(RuntimeError):
    pass


class PagedAllocator:
    def __init__(self, num_slots: int, page_size: int, debug: bool = True):
        if num_slots < 2 * page_size:
            raise ValueError(f"the KV pool needs at least two pages ({2 * page_size} slots).")
        self.page_size = page_size
        self.num_pages = num_slots // page_size
        self.debug = debug
        # Stack of free pages; pop from the end so low page ids are handed out first.
        self._free: list[int] = list(range(self.num_pages - 1, 0, -1))
        self._owned = np.zeros(self.num_pages, dtype=bool)

    @property
    def total_pages(self) -> int:
        """Allocatable pages (page 0 excluded)."""
        return self.num_pages - 1

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def free_slots(self) -> int:
        return len(self._free) * self.page_size

    def alloc_pages(self, n: int) -> list[int] | None:
        """n pages, or None (and nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        if self.debug:
            if self._owned[pages].any():
                raise AllocatorError(f"pages {pages} handed out while already owned.")
            self._owned[pages] = True
        return pages

    def free_pages_list(self, pages: list[int]) -> None:
        """Free a group of pages at once (the release of one or more requests)."""
        if self.debug:
            arr = np.asarray(pages, dtype=np.int64)
            if (arr <= 0).any() or (arr >= self.num_pages).any():
                raise AllocatorError(f"free of invalid page ids {sorted(set(pages))[:8]}.")
            if len(set(pages)) != len(pages) or not self._owned[arr].all():
                bad = [p for p in pages if not self._owned[p]]
                raise AllocatorError(f"double free of pages {bad[:8]} (not owned).")
            self._owned[arr] = False
        self._free.extend(reversed(pages))

    def assert_owned(self, pages: list[int]) -> None:
        """Use-after-free check: every page must be currently allocated."""
        if self.debug and not self._owned[np.asarray(pages, dtype=np.int64)].all():
            raise AllocatorError("use after free: a page in use is not allocated.")

    def page_slots(self, pages: list[int]) -> np.ndarray:
        """Slot ids of `pages`, in order: [p0*P .. p0*P+P-1, p1*P, ...]."""
        p = np.asarray(pages, dtype=np.int64)[:, None] * self.page_size
        return (p + np.arange(self.page_size)[None, :]).reshape(-1)
