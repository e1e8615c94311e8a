"""GEMM sites: the weights a module's forward multiplies by, each through `gemv.linear`, so
that the engine's GEMM plan (models/gemm_plan.py) can send a site's few-row (decode) GEMMs
to the skinny Triton GEMM (kernels/gemv.py) where that measured faster than cuBLAS.

    module.gemm_sites()   {site: weight}        what its forward multiplies by, now
    module.gemv           {site: GemvConfig}    the plan's launches; a site absent: cuBLAS
    forward               linear(x, weight, module.gemv.get(site))

`Linear` is nn.Linear with one site, "weight" (same parameters, same state-dict names). The
fused paths name their concatenated weights as sites: "qkv" (llama.Attention), "gate_up"
(mlp.MLP), "head" (drafts.DraftHead), "hot" (draft_vocab.VocabHead). A site whose output is
RoPE'd and written to the KV cache ("qkv") names its heads (`site_rope`): the plan then times
the GEMM with that epilogue, and the forward runs `qkv_rope`.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.gemv import GemvConfig, linear
from ..kernels.qkv_rope import RopeShape

NO_PLAN: Mapping[str, GemvConfig] = MappingProxyType({})


class GemmSites:
    """Mixin of a module with GEMM sites (module doc); until a plan is set, every site runs
    cuBLAS."""
    gemv: Mapping[str, GemvConfig] = NO_PLAN

    def gemm_sites(self) -> dict[str, torch.Tensor]:
        return {}

    def site_rope(self, site: str) -> Optional[RopeShape]:
        """The heads of a site whose output its forward rotates and writes to the KV cache
        (kernels/qkv_rope.py: the GEMM and that epilogue in one kernel), or None."""
        return None


class Linear(GemmSites, nn.Linear):
    def gemm_sites(self) -> dict[str, torch.Tensor]:
        """"weight", unless a bias goes with it, or the weight is a slice of a fused tensor
        (mlp.fuse_linears): the fused path reads it through that tensor's site."""
        w = self.weight
        if self.bias is not None or w.untyped_storage().nbytes() > w.numel() * w.element_size():
            return {}
        return {"weight": w}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            return F.linear(x, self.weight, self.bias)
        return linear(x, self.weight, self.gemv.get("weight"))
