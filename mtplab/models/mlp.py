"""The SwiGLU MLP (Hugging Face names gate_proj / up_proj / down_proj) and the weight
fusion it shares with attention: `fuse_linears` stacks linears' weights into one tensor whose
row-slices they become (models/llama.py's module doc: the fused path). The target's layers
(llama.py), the MoE FFN's shared expert (moe.py) and the drafts' layers build on it.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.fused_ops import silu_mul
from .linear import GemmSites, Linear, linear


def fuse_linears(fused: Optional[torch.Tensor], *linears: nn.Linear) -> torch.Tensor:
    """One [sum(out), in] tensor holding the linears' weights stacked by rows; each linear's
    weight becomes a row-slice view of it (same values, same parameter object and name).
    `fused` is returned as is when the weights already are its views: re-fusing never moves
    weights that a captured CUDA graph reads."""
    if fused is not None and all(
            lin.weight.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
            for lin in linears):
        return fused
    fused = torch.cat([lin.weight.detach() for lin in linears], 0)
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = fused[start:start + n]
        start += n
    return fused


class MLP(GemmSites, nn.Module):
    def __init__(self, H: int, I: int):
        super().__init__()
        self.gate_proj = Linear(H, I, bias=False)
        self.up_proj = Linear(H, I, bias=False)
        self.down_proj = Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def fuse(self) -> None:
        self.gate_up_weight = fuse_linears(getattr(self, "gate_up_weight", None),
                                           self.gate_proj, self.up_proj)

    def gemm_sites(self) -> dict[str, torch.Tensor]:
        w = getattr(self, "gate_up_weight", None)
        return {} if w is None else {"gate_up": w}

    def forward_fused(self, h, defer: bool = False):
        """The fused path's SwiGLU (a dense FFN has no combine to `defer`: MoEFFN's flag)."""
        return self.down_proj(silu_mul(linear(h, self.gate_up_weight, self.gemv.get("gate_up"))))
