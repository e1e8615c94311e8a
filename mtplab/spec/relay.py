"""Relay buffers: the next iteration's draft inputs, one row per req_to_token row.

    bonus      [R+1]      int64   the token the next verify roots its tree at
    hidden     [R+1, H]           frozen: target hidden at the last accepted node (the seed)
                                  eagle : the draft's hidden at the last accepted position
    topk_logp  [R+1, K]   float32 eagle: step-0 candidates from draft extend
    topk_index [R+1, K]   int64
Written at the end of a forward (`stash`), read at the start of the next (`gather`); keyed by
row so batches can be filtered/merged by moving indices only. Row 0 is the padding row.
The overlap scheduler's future map wraps these with publish/resolve events.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class DraftInputs:
    bonus: torch.Tensor                     # [B]
    hidden: torch.Tensor                    # [B, H]
    topk_logp: Optional[torch.Tensor] = None   # [B, K]
    topk_index: Optional[torch.Tensor] = None  # [B, K]


class RelayBuffers:
    def __init__(self, num_rows: int, hidden_size: int, topk: int, dtype: torch.dtype,
                 device: torch.device, with_topk: bool):
        R = num_rows + 1
        self.bonus = torch.zeros(R, dtype=torch.long, device=device)
        self.hidden = torch.zeros(R, hidden_size, dtype=dtype, device=device)
        self.topk_logp = torch.zeros(R, topk, device=device) if with_topk else None
        self.topk_index = (torch.zeros(R, topk, dtype=torch.long, device=device)
                           if with_topk else None)

    def stash(self, rows: torch.Tensor, x: DraftInputs) -> None:
        self.bonus[rows] = x.bonus.long()
        self.hidden[rows] = x.hidden.to(self.hidden.dtype)
        if self.topk_logp is not None:
            self.topk_logp[rows] = x.topk_logp.float()
            self.topk_index[rows] = x.topk_index.long()

    def gather(self, rows: torch.Tensor) -> DraftInputs:
        if self.topk_logp is None:
            return DraftInputs(self.bonus[rows], self.hidden[rows])
        return DraftInputs(self.bonus[rows], self.hidden[rows], self.topk_logp[rows],
                           self.topk_index[rows])
