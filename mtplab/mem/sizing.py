"""KV sizing math (docs/design.md "KV memory"); pure integer functions, checked on the CPU.

    alloc_len_per_decode
      non-spec (draft none)                     : 1
      P == 1 or K == 1 or the draft owns no KV  : max(S*K, D)
      P > 1 and K > 1 with draft KV (holey)     : max(ceil((P-1+S)/P)*P*K, D)
    reserve per decode  = page_align(2 * alloc_len_per_decode)   (host lengths lag one verify)
    row width W        >= context_len + max(4 + D, 2*alloc_len + P - 1), page aligned
"""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def page_align(n: int, page_size: int) -> int:
    return cdiv(n, page_size) * page_size


def alloc_len_per_decode(*, speculative: bool, num_steps: int, topk: int,
                         num_draft_tokens: int, page_size: int, draft_owns_kv: bool) -> int:
    if not speculative:
        return 1
    S, K, D, P = num_steps, topk, num_draft_tokens, page_size
    if P == 1 or K == 1 or not draft_owns_kv:
        return max(S * K, D)
    return max(cdiv(P - 1 + S, P) * P * K, D)


def reserve_per_decode(alloc_len: int, page_size: int) -> int:
    return page_align(2 * alloc_len, page_size)


def row_width(context_len: int, alloc_len: int, num_draft_tokens: int, page_size: int) -> int:
    need = context_len + max(4 + num_draft_tokens, 2 * alloc_len + page_size - 1)
    return page_align(need, page_size)
