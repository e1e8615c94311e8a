"""Allocator, req_to_token pool and invariant checker, including deliberate leaks."""
import numpy as np
import pytest
import torch

from mtplab import Engine, RunConfig
from mtplab.mem.allocator import AllocatorError, PagedAllocator
from mtplab.mem.invariants import InvariantError, check_kv_invariants
from mtplab.mem.kv_manager import KVManager, RowOverflowError
from mtplab.mem.req_pool import ReqPoolError, ReqToTokenPool
from mtplab.mem.sizing import alloc_len_per_decode, reserve_per_decode, row_width


def make(P=4, slots=64, rows=4, width=32):
    a = PagedAllocator(slots, P)
    pool = ReqToTokenPool(rows, width, torch.device("cpu"))
    return a, pool, KVManager(a, pool)


def test_allocator_pages_and_padding_page():
    a = PagedAllocator(32, 4)
    assert a.total_pages == 7 and a.free_slots == 28
    pages = a.alloc_pages(3)
    assert 0 not in pages and len(set(pages)) == 3
    assert list(a.page_slots(pages[:1])) == [pages[0] * 4 + i for i in range(4)]
    assert a.alloc_pages(5) is None and a.free_pages == 4      # all-or-nothing
    a.free_pages_list(pages)
    assert a.free_pages == 7


def test_double_free_and_use_after_free_are_caught():
    a = PagedAllocator(32, 4)
    p = a.alloc_pages(2)
    a.free_pages_list(p)
    with pytest.raises(AllocatorError, match="double free"):
        a.free_pages_list(p[:1])
    with pytest.raises(AllocatorError, match="use after free"):
        a.assert_owned(p)
    with pytest.raises(AllocatorError, match="invalid page"):
        a.free_pages_list([0])


def test_kv_manager_admit_extend_release_and_table():
    a, pool, m = make()
    kv = m.admit(5)
    assert kv.kv_allocated_len == 8 and kv.row >= 1
    assert m.reserve_rows([kv], np.array([kv.row]), np.array([13]))
    assert kv.kv_allocated_len == 16
    assert pool.pending and not pool.table[kv.row].any()     # queued, issued by flush
    pool.flush()
    assert not pool.pending
    assert torch.equal(pool.table[kv.row, :16],
                       torch.tensor(a.page_slots(kv.pages), dtype=torch.int32))
    check_kv_invariants(a, pool, {0: kv}, check_table=True, allocated=m.allocated)
    m.allocated[kv.row] += 4           # the row array out of step with the pages
    with pytest.raises(InvariantError, match="row array says 20"):
        check_kv_invariants(a, pool, {0: kv}, allocated=m.allocated)
    m.allocated[kv.row] -= 4
    big = m.admit(4)
    # 12 pages, 11 free
    assert not m.reserve_rows([kv, big], np.array([kv.row, big.row]), np.array([32, 32]))
    assert kv.kv_allocated_len == 16 and big.kv_allocated_len == 4   # all-or-nothing
    m.release([big])
    with pytest.raises(RowOverflowError, match="rows are 32 wide"):
        m.reserve_rows([kv], np.array([kv.row]), np.array([33]), rids=[7])
    m.release([kv])
    check_kv_invariants(a, pool, {})
    with pytest.raises(ReqPoolError):
        pool.free(kv.row)


def test_checker_names_a_leaked_slot_and_the_requests():
    a, pool, m = make()
    kv1, kv2 = m.admit(4), m.admit(4)
    check_kv_invariants(a, pool, {1: kv1, 2: kv2})
    leaked = kv2.pages.pop()           # a page the request no longer records: leaked
    with pytest.raises(InvariantError, match=r"4 slots \(1 pages\) leaked.*live requests \[1, 2\]"):
        check_kv_invariants(a, pool, {1: kv1, 2: kv2})
    kv2.pages.append(leaked)
    kv1.kv_committed_len = 9           # committed beyond allocated
    with pytest.raises(InvariantError, match="request 1: kv_committed_len=9"):
        check_kv_invariants(a, pool, {1: kv1, 2: kv2})
    kv1.kv_committed_len = 0
    with pytest.raises(InvariantError, match="rows leaked"):
        check_kv_invariants(a, pool, {1: kv1})   # kv2 still holds its row but is not live


@pytest.mark.breaks_engine
def test_engine_check_invariants_catches_an_engine_leak():
    eng = Engine(RunConfig(model="random-tiny", page_size=4))
    eng.generate([[5, 6, 7]], max_new_tokens=4)
    eng.check_invariants()
    eng.allocator.alloc_pages(1)       # deliberately leak one page
    with pytest.raises(InvariantError, match="4 slots"):
        eng.check_invariants()


def test_sizing_formulas():
    assert alloc_len_per_decode(speculative=False, num_steps=3, topk=4, num_draft_tokens=8,
                                page_size=16, draft_owns_kv=True) == 1
    assert alloc_len_per_decode(speculative=True, num_steps=3, topk=4, num_draft_tokens=8,
                                page_size=16, draft_owns_kv=False) == 12
    # holey: ceil((16-1+3)/16)*16*4 = 128
    assert alloc_len_per_decode(speculative=True, num_steps=3, topk=4, num_draft_tokens=8,
                                page_size=16, draft_owns_kv=True) == 128
    assert reserve_per_decode(12, 16) == 32
    assert row_width(100, 12, 8, 16) == 144      # 100 + max(4+8, 2*12+16-1=39) = 139 -> 144
