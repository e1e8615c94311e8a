"""Accept compaction (topk > 1): bring the accepted path to the front of the verify window.

Verify writes node i of request b at row entry seq_len + i (the window [seq_len, seq_len+D)).
After accept, path node accept_index[b, k] must sit at entry seq_len + k for k < accept_lens,
so that KV, hidden states and predictions read as a chain from then on:

    window  entry:  seq_len+0  +1  +2  +3  ...  +D-1      accept_index[b] = [0, 2, 3, -1]
            node :      0       1   2   3  ...   D-1       -> moves  2 -> 1, 3 -> 2
    lane k (of S+1):  src = window[accept_index[k]], dst = window[k], valid = k < accept_lens

Lanes are static [B, S+1]. Invalid lanes copy the root slot onto itself (window[0], which no
valid lane writes or reads except lane 0's identity copy), so the move is one index op per
KV tensor with no masking. accept_index is increasing, so a valid lane may read an entry that a
lower lane writes: apply as gather-then-scatter (`kv[:, dst] = kv[:, src]`), never in place.

The window's slots are taken once, at verify time (`window_slots`), and reused here: under
overlap a finished request's row may be reassigned before its in-flight compaction runs.
On CUDA window_slots and accept_moves are one Triton kernel each (kernels/fused_spec.py); the
torch bodies are their reference and fallback. In a captured graph window_slots carries the
commit stage's begin stamp (handed over inside `dispatch`: speculative/worker.py).
"""
from __future__ import annotations

from dataclasses import dataclass
import torch

from ..kernels.fused_ops import dispatch
from ..kernels.fused_spec import accept_moves_triton, window_slots_triton
from .accept import AcceptResult


@dataclass
class AcceptMoves:
    src_slots: torch.Tensor  # [B, S+1] int64 KV slot to read
    dst_slots: torch.Tensor  # [B, S+1] int64 KV slot to write
    valid: torch.Tensor      # [B, S+1] bool, k < accept_lens (lane 0 always, an identity)
    row_index: torch.Tensor  # [B, S+1] int64 into [B*D]-flattened per-node outputs (hidden,
                             #   logits, predict): out[b, k] = x[row_index[b, k]]; root if invalid


def window_slots(req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
                 num_draft_tokens: int) -> torch.Tensor:
    """[B, D] int64: slots of the verify window, req_to_token[rows, seq_lens + 0..D-1]."""
    return dispatch("window_slots", window_slots_triton, _window_slots_torch, req_to_token,
                    rows, seq_lens, num_draft_tokens)


def _window_slots_torch(req_to_token, rows, seq_lens, num_draft_tokens):
    entries = seq_lens.long()[:, None] + torch.arange(num_draft_tokens, device=rows.device)
    return req_to_token[rows.long()[:, None], entries].long()


def accept_moves(window: torch.Tensor, accept: AcceptResult) -> AcceptMoves:
    """window [B, D] (window_slots) + accept result -> the compaction moves [B, S+1]."""
    return AcceptMoves(*dispatch("accept_moves", accept_moves_triton, _accept_moves_torch,
                                 window, accept.accept_index))


def _accept_moves_torch(window, accept_index):
    B, D = window.shape
    L = accept_index.shape[1]
    valid = accept_index >= 0
    node = torch.where(valid, accept_index, 0)
    root = window[:, :1].expand(B, L)
    front = window[:, :min(L, D)]
    if L > D:   # D < S+1 (topk > 1): a path has at most D nodes, lanes >= D are never valid
        front = torch.cat([front, root[:, : L - D]], dim=1)
    src = torch.where(valid, window.gather(1, node), root)
    dst = torch.where(valid, front, root)
    row_index = torch.arange(B, device=window.device)[:, None] * D + node
    return src, dst, valid, row_index


def apply_kv_moves(k_cache, v_cache, moves: AcceptMoves) -> None:
    """k/v [num_layers, num_slots, ...] in place, every layer at once (gather, then scatter);
    a cache of per-layer tensors (layers of different shapes, mem/kv_cache.py) layer by
    layer."""
    src = moves.src_slots.reshape(-1)
    dst = moves.dst_slots.reshape(-1)
    for cache in (k_cache, v_cache):
        if isinstance(cache, torch.Tensor):
            cache[:, dst] = cache[:, src]
        else:
            for layer in cache:
                layer[dst] = layer[src]


def commit(kv, req_to_token: torch.Tensor, rows: torch.Tensor, seq_lens: torch.Tensor,
           accept_index: torch.Tensor, accept_lens: torch.Tensor, hidden: torch.Tensor,
           num_draft_tokens: int, move_kv: bool):
    """The commit stage: with move_kv (topk > 1) the accepted path's KV moves to the front of
    the window; the path's hidden rows are gathered; lengths advance on the device.
    -> (new_seq_lens [B], hidden_path [B, S+1, H], hidden_last [B, H] at accept_len-1)."""
    B = rows.shape[0]
    window = window_slots(req_to_token, rows, seq_lens, num_draft_tokens)
    moves = accept_moves(window, AcceptResult(accept_index, accept_lens, None, None))
    if move_kv:
        apply_kv_moves(kv.k, kv.v, moves)
    hidden_path = hidden.reshape(B * num_draft_tokens, -1)[moves.row_index]     # [B, S+1, H]
    last = (accept_lens - 1)[:, None, None].expand(B, 1, hidden.shape[-1])
    return seq_lens + accept_lens, hidden_path, hidden_path.gather(1, last)[:, 0]
