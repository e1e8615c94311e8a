"""Attention metadata shared by every backend (a hot-path bundle: tensors + two static ints).

Layout of one forward over B requests, T = sum(q_lens) query tokens (packed):

    q[T, Hq, d]         tokens of request b are q[cu_q[b] : cu_q[b] + q_lens[b]]
    table[R, W] int32   req_to_token (or a per-lane "virtual" table built by a draft);
                        slot of KV entry j of lane b is table[rows[b], j]
    kv_lens[B]          entries [0, kv_len) are visible candidates; the q tokens' own KV has
                        already been written at entries [kv_len - q_len, kv_len)
    positions[T]        absolute positions (RoPE and sliding-window checks)

Visibility of entry j to query i (0-based within its lane), prefix = kv_len - q_len:
    no tree_mask : j <= prefix + i                      (causal over a linear row)
    tree_mask    : j < prefix  or  tree_mask[b, i, j - prefix]   (all lanes have q_len == Q)
    kv_shared    : j < kv_len   for every query: the lane's q_len queries own no KV entry and
                   share the whole row (a Frozen-KV draft step's K branches of one request)
    window W > 0 : additionally positions[t] - j < W for linear entries (the prefix part only
                   under a tree mask; tree nodes see their ancestors regardless)
`max_q` / `max_kv` are static Python ints (upper bounds) so a CUDA graph can capture the
forward; every lane must satisfy q_len <= max_q and kv_len <= max_kv. `full_lanes` (static)
says every lane holds exactly max_q query tokens (T == B x max_q: decode, verify and draft
steps), so every token of q belongs to a lane and the kernels write it: the output needs no
zeroing first (a token of no lane reads zero otherwise). `split_kv` (static, 0 =
max_kv) is the row bound the split-KV plan is made for: the req_to_token width W, set by every
decode-side caller whether it runs eagerly (max_kv = the host's tighter bound) or captured
(max_kv = W), so an eager step splits its rows as its graph does and both round alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class AttnMeta:
    table: torch.Tensor          # [R, W] int32
    rows: torch.Tensor           # [B] int64
    kv_lens: torch.Tensor        # [B] int32/int64
    q_lens: torch.Tensor         # [B] int32/int64
    cu_q: torch.Tensor           # [B+1] int64, cu_q[0] == 0
    positions: torch.Tensor      # [T] int64
    max_q: int
    max_kv: int
    tree_mask: Optional[torch.Tensor] = None   # [B, Q, Q] bool
    kv_shared: bool = False                    # queries share [0, kv_len), own no entry
    split_kv: int = 0                          # split plan's row bound (0: max_kv)
    full_lanes: bool = False                   # every q_len == max_q, T == B x max_q

    @property
    def batch_size(self) -> int:
        return int(self.rows.shape[0])


class AttnBoundError(AssertionError):
    """A lane's q_len or kv_len exceeds the static bound its forward was built with."""


def check_bounds(meta: AttnMeta) -> None:
    """Every lane's q_len <= max_q and kv_len <= max_kv (RunConfig.debug_invariants). The
    kernels read a lane's entries [0, max_kv) only, so a lane past its bound would silently
    lose its newest KV. Reads the lengths on the host (a sync); skipped while a CUDA graph is
    captured (a captured forward's bound is the row width)."""
    if meta.kv_lens.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    kv, q = int(meta.kv_lens.max()), int(meta.q_lens.max())
    if meta.full_lanes and (int(meta.q_lens.min()) != meta.max_q
                            or meta.positions.shape[0] != meta.batch_size * meta.max_q):
        raise AttnBoundError(f"attention built with full_lanes over {meta.batch_size} lanes "
                             f"of q_len {int(meta.q_lens.min())}..{q} and "
                             f"{meta.positions.shape[0]} tokens: every lane must hold "
                             f"max_q={meta.max_q} tokens (or build it without full_lanes).")
    if kv > meta.max_kv or q > meta.max_q:
        raise AttnBoundError(f"attention over lanes with kv_len up to {kv} and q_len up to {q} "
                             f"was built for max_kv={meta.max_kv}, max_q={meta.max_q}: the "
                             "host's bound on the KV length is too small (under overlap it "
                             "must allow for the step in flight).")

