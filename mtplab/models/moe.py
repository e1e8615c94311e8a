"""Mixture-of-experts FFN: Qwen2-MoE's sparse block, with its Hugging Face names, so a
checkpoint without sliding layers or a router bias loads in transformers'
`Qwen2MoeForCausalLM` (models/llama_config.py `to_hf_dict`).

    h [T, H] -> router logits = gate(h) [T, E] (+ a per-expert bias, mtplab's routing skew)
                weights, ids = top-k of softmax(logits) in fp32, renormalised (norm_topk_prob)
                routed[t] = sum_j weights[t, j] * down_e(silu(gate_e(h_t)) * up_e(h_t)),
                            e = ids[t, j]; experts stacked: gate_up_proj [E, 2I, H] (gate rows
                            first), down_proj [E, H, I]
                shared[t] = sigmoid(shared_expert_gate(h_t)) * shared_expert(h_t)   (SwiGLU)
             -> routed + shared

The unfused path computes it with the torch reference (kernels/fused_moe.py `fused_moe_ref`);
the fused path with the Triton kernels (tokens sorted by expert, grouped gate/up GEMM with SiLU
* up fused, grouped down GEMM, weighted combine with the shared output) on CUDA, the reference
elsewhere; deterministic mode runs the kernels on both paths. Both have shapes fixed by T and
read nothing on the host: a verify or decode step with MoE layers captures into a CUDA graph.

`record_experts(model)` makes every forward count the distinct experts its tokens touched,
per layer, into a device tensor (`touched`, summed over forwards): the `moe` figures read it
from an eager engine.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..kernels.fused_moe import experts_touched, fused_moe, route
from .mlp import MLP
from .llama_config import LlamaConfig


class Experts(nn.Module):
    """The routed experts' weights, stacked (Qwen2-MoE's `mlp.experts.*` tensors)."""

    def __init__(self, E: int, H: int, I: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


class MoEFFN(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        H, E = cfg.hidden_size, cfg.num_experts
        self.num_experts, self.top_k = E, cfg.num_experts_per_tok
        self.norm_topk = cfg.norm_topk_prob
        self.gate = nn.Linear(H, E, bias=cfg.moe_router_bias)
        self.experts = Experts(E, H, cfg.moe_intermediate_size)
        Is = cfg.shared_expert_intermediate_size
        self.shared_expert = MLP(H, Is) if Is else None
        self.shared_expert_gate = nn.Linear(H, 1, bias=False) if Is else None
        self.touched: Optional[torch.Tensor] = None      # record_experts: [] device count

    def _route(self, h: torch.Tensor):
        w, ids = route(self.gate(h), self.top_k, h.dtype, self.norm_topk)
        if self.touched is not None:
            self.touched += experts_touched(ids, self.num_experts)
        return w, ids

    def _shared(self, h: torch.Tensor, out: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        if out is None:
            return None
        return torch.sigmoid(self.shared_expert_gate(h)) * out

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        w, ids = self._route(h)
        shared = self._shared(h, None if self.shared_expert is None else self.shared_expert(h))
        return fused_moe(h, self.experts.gate_up_proj, self.experts.down_proj, w, ids, shared,
                         reference=True)

    def fuse(self) -> None:
        if self.shared_expert is not None:
            self.shared_expert.fuse()

    def forward_fused(self, h: torch.Tensor) -> torch.Tensor:
        w, ids = self._route(h)
        shared = self._shared(h, None if self.shared_expert is None
                              else self.shared_expert.forward_fused(h))
        return fused_moe(h, self.experts.gate_up_proj, self.experts.down_proj, w, ids, shared)


def moe_layers(model: nn.Module) -> list[MoEFFN]:
    return [m for m in model.modules() if isinstance(m, MoEFFN)]


def record_experts(model: nn.Module, on: bool = True) -> None:
    """Start (zeroed) or stop counting the experts each MoE layer's forwards touch."""
    for m in moe_layers(model):
        m.touched = torch.zeros((), dtype=torch.long, device=m.gate.weight.device) if on \
            else None


def touched_per_layer(model: nn.Module) -> list[int]:
    """The counts since `record_experts(model)`, one per MoE layer (one host read)."""
    ts = [m.touched for m in moe_layers(model)]
    return torch.stack(ts).tolist() if ts and ts[0] is not None else []
