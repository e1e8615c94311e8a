"""KV invariant checker (docs/design.md "KV memory").

    idle: free_pages + 0          == total_pages   and   free_rows == total_rows
    busy: free_pages + sum(owned) == total_pages   and   free_rows + live == total_rows
          (owned = every live request's page-aligned allocation, counted once)
    each live request: 0 <= kv_committed_len <= kv_allocated_len <= W, pages distinct, and
          the KV manager's per-row `allocated` array (given) equals kv_allocated_len
Raises InvariantError naming the leak (how many slots, which requests); silent when clean.
"""
from __future__ import annotations

from collections import Counter

from .allocator import PagedAllocator
from .req_pool import ReqToTokenPool


class InvariantError(AssertionError):
    pass


def check_kv_invariants(allocator: PagedAllocator, pool: ReqToTokenPool,
                        live: dict, check_table: bool = False, allocated=None) -> None:
    """`live` maps request id -> ReqKV for every request that holds KV right now;
    `allocated`: the KV manager's per-row allocated lengths (mem/kv_manager.py)."""
    P = allocator.page_size
    problems = []
    owned = Counter(p for kv in live.values() for p in kv.pages)
    shared = sorted(p for p, c in owned.items() if c > 1)
    if shared:
        holders = [rid for rid, kv in live.items() if set(kv.pages) & set(shared)]
        problems.append(f"pages {shared[:8]} are owned by several requests {holders}")
    free_set = set(allocator._free)
    both = sorted(free_set & set(owned))
    if both:
        holders = [rid for rid, kv in live.items() if set(kv.pages) & set(both)]
        problems.append(f"pages {both[:8]} are both free and owned by requests {holders}")
    diff = allocator.total_pages - allocator.free_pages - sum(owned.values())
    if diff > 0:
        problems.append(f"{diff * P} slots ({diff} pages) leaked: free {allocator.free_slots} + "
                        f"owned {sum(owned.values()) * P} != total {allocator.total_pages * P}"
                        f" with live requests {sorted(live)}")
    elif diff < 0:
        problems.append(f"{-diff * P} slots counted twice (free + owned exceeds the pool)")
    rows = Counter(kv.row for kv in live.values())
    if any(c > 1 for c in rows.values()):
        problems.append(f"req_to_token rows shared: {[r for r, c in rows.items() if c > 1]}")
    row_diff = pool.num_rows - pool.free_rows - len(live)
    if row_diff:
        problems.append(f"{row_diff} req_to_token rows leaked (free {pool.free_rows} + live "
                        f"{len(live)} != {pool.num_rows})")
    for rid, kv in live.items():
        if not 0 <= kv.kv_committed_len <= kv.kv_allocated_len <= pool.width:
            problems.append(f"request {rid}: kv_committed_len={kv.kv_committed_len}, "
                            f"kv_allocated_len={kv.kv_allocated_len}, width={pool.width} "
                            "violates 0 <= committed <= allocated <= W")
        if allocated is not None and int(allocated[kv.row]) != kv.kv_allocated_len:
            problems.append(f"request {rid}: the row array says {int(allocated[kv.row])} "
                            f"entries allocated, its pages {kv.kv_allocated_len}")
        if check_table and kv.pages:
            want = allocator.page_slots(kv.pages)
            got = pool.table[kv.row, : kv.kv_allocated_len].cpu().numpy()
            if (want != got).any():
                problems.append(f"request {rid}: req_to_token row {kv.row} disagrees with "
                                "its pages")
    if problems:
        raise InvariantError("KV invariant violated: " + "; ".join(problems) + ".")

