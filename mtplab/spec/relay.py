"""The draft inputs one iteration hands to the next (a hot-path bundle). They travel through
the scheduler's future map (sched/future_map.py), keyed by req_to_token row.

    bonus      [B]      the token the next verify roots its tree at
    hidden     [B, H]   frozen: target hidden at the last accepted node (the seed);
                        eagle : the draft's hidden at the last accepted position
    topk_logp  [B, K]   eagle: step-0 candidates from draft extend
    topk_index [B, K]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class DraftInputs:
    bonus: torch.Tensor
    hidden: Optional[torch.Tensor] = None
    topk_logp: Optional[torch.Tensor] = None
    topk_index: Optional[torch.Tensor] = None
