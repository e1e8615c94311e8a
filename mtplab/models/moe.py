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

The unfused path computes it with the torch reference (kernels/fused_moe.py
`fused_moe_ref`). The fused path has two sets of kernels (`set_moe_kernels`, the run's
`moe_kernels`), both CUDA-graph capturable (shapes fixed by T, nothing read on the host):

    grouped  4 launches: the router, softmax, top-k, the shared expert's gate and the
             alignment of the slots in one kernel (kernels/moe_route.py), whose extra
             programs compute the shared expert's silu(gate) * up rows meanwhile; one grouped
             gate/up GEMM over the touched experts' blocks and one grouped down GEMM over
             theirs and the shared expert's; the weighted combine (kernels/fused_moe.py
             `moe_ffn`), which in the target's forward (`forward_fused(h, defer=True)`)
             runs inside the next add_rmsnorm instead: 3 launches there
    split    the router GEMM, softmax / top-k and the alignment in torch ops, the shared
             expert's own GEMMs, then the three routed-expert kernels (`fused_moe`)

On CUDA the kernels run; elsewhere their torch references (deterministic mode runs the
kernels on both model paths). The two sets differ in rounding only: grouped keeps the router
logits and routing weights in fp32 and gates the shared expert's output in the combine.

`ExpertRecorder` (one per MoE target, `attach_recorder`; the engine's with `moe_stats`, or
for a block of code `recording(model)`): the distinct experts each verify forward's real
tokens touch, per layer, written on the device (graph safe: in-place ops on persistent
tensors, indexed by a device counter) and read once per generate:
    verify / decode   begin(valid)  valid [T] bool: the forward's tokens not on a
                                    graph-padded lane (req_to_token row 0)
                      each layer    hit = experts of the valid tokens' top-k ids;
                                    per_verify[n % cap, layer] = |hit|
                      end()         n += 1
    prefill           no begin: nothing recorded
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional, Union

import torch
from torch import nn

from ..kernels.fused_moe import block_m, fused_moe, moe_ffn, route
from ..kernels.fused_ops import PendingCombine
from ..kernels.moe_route import counts_len, route_align
from .mlp import MLP
from .llama_config import LlamaConfig


class Experts(nn.Module):
    """The routed experts' weights, stacked (Qwen2-MoE's `mlp.experts.*` tensors)."""

    def __init__(self, E: int, H: int, I: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(E, 2 * I, H))
        self.down_proj = nn.Parameter(torch.empty(E, H, I))


MOE_KERNELS = ("grouped", "split")     # the fused path's kernel sets (RunConfig.moe_kernels)


class ExpertRecorder:
    """Distinct experts per layer touched by each recorded forward's valid tokens, on the
    device (module doc). `read()` -> the rows recorded since `reset()` (one host read; the
    last `capacity` when more were recorded)."""

    def __init__(self, layers: int, num_experts: int, device, capacity: int = 1 << 14):
        self.E, self.capacity = num_experts, capacity
        self.per_verify = torch.zeros(capacity, layers, dtype=torch.long, device=device)
        self.n = torch.zeros(1, dtype=torch.long, device=device)
        self.valid: Optional[torch.Tensor] = None

    def begin(self, valid: torch.Tensor) -> None:
        self.valid = valid

    def end(self) -> None:
        if self.valid is not None:
            self.n += 1
        self.valid = None

    def add(self, layer: int, ids: torch.Tensor) -> None:
        """One layer's routing `ids` [T, k] of the forward under way (nothing outside one)."""
        if self.valid is None:
            return
        hit = torch.zeros(self.E + 1, dtype=torch.bool, device=ids.device)
        masked = torch.where(self.valid[:, None], ids, self.E)      # padded -> slot E
        touched = hit.index_fill_(0, masked.reshape(-1), True)[:self.E].sum()
        slot = self.n % self.capacity
        self.per_verify[:, layer].index_copy_(0, slot, touched.view(1))

    def reset(self) -> None:
        self.n.zero_()

    def read(self) -> list[list[int]]:
        n = int(self.n[0])
        rows = self.per_verify[:min(n, self.capacity)].tolist()
        k = n % self.capacity
        return rows[k:] + rows[:k] if n > self.capacity else rows


class MoEFFN(nn.Module):
    kernels = "grouped"           # the fused path's kernels (module doc; set_moe_kernels)

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
        self._counts: Optional[torch.Tensor] = None      # the routing kernel's counters
        self.recorder: Optional[ExpertRecorder] = None   # attach_recorder
        self.index = 0                                   # this layer's index among the MoE ones

    def _route(self, h: torch.Tensor):
        w, ids = route(self.gate(h), self.top_k, h.dtype, self.norm_topk)
        if self.recorder is not None:
            self.recorder.add(self.index, ids)
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

    def forward_fused(self, h: torch.Tensor,
                      defer: bool = False) -> Union[torch.Tensor, PendingCombine]:
        """`defer`: the grouped kernels leave their combine to the consumer's add_rmsnorm
        (kernels/fused_moe.py); the split set and the reference return the tensor."""
        if self.kernels == "split":
            w, ids = self._route(h)
            shared = self._shared(h, None if self.shared_expert is None
                                  else self.shared_expert.forward_fused(h))
            return fused_moe(h, self.experts.gate_up_proj, self.experts.down_proj, w, ids,
                             shared)
        sg = self.shared_expert_gate
        se = self.shared_expert
        r = route_align(h, self.gate.weight, self.gate.bias, None if sg is None else sg.weight,
                        self.top_k, self.norm_topk, block_m(h.device.type),
                        self.route_counts(h), None if se is None else se.gate_up_weight)
        if self.recorder is not None:
            self.recorder.add(self.index, r.ids)
        return moe_ffn(h, self.experts.gate_up_proj, self.experts.down_proj, r,
                       None if se is None else se.gate_up_weight,
                       None if se is None else se.down_proj.weight, defer=defer)

    def route_counts(self, h: torch.Tensor) -> torch.Tensor:
        """The routing kernel's counters on h's device, enough for h's T (made on first use
        or when a longer batch comes; the kernel leaves them zero)."""
        need = counts_len(h.shape[0], h.device.type)
        c = self._counts
        if c is None or c.device != h.device or c.numel() < need:
            c = self._counts = torch.zeros(max(need, 257), dtype=torch.int32, device=h.device)
        return c


def moe_layers(model: nn.Module) -> list[MoEFFN]:
    return [m for m in model.modules() if isinstance(m, MoEFFN)]


def attach_recorder(model: nn.Module) -> Optional[ExpertRecorder]:
    """An ExpertRecorder shared by the MoE layers of `model` (a LlamaForCausalLM), also its
    `expert_recorder`; None for a dense model."""
    layers = moe_layers(model)
    if not layers:
        return None
    rec = ExpertRecorder(len(layers), layers[0].num_experts, layers[0].gate.weight.device)
    for i, m in enumerate(layers):
        m.recorder, m.index = rec, i
    model.expert_recorder = rec           # the forwards' begin / end (verify, target decode)
    return rec


@contextmanager
def recording(model: nn.Module) -> Iterator[Optional[ExpertRecorder]]:
    """A fresh ExpertRecorder on `model`'s MoE layers for the block (None for a dense model):
    the verify and decode forwards run inside it are recorded (module doc); the recorder the
    layers held before (the engine's, or none) is theirs again after."""
    layers = moe_layers(model)
    before = [m.recorder for m in layers], model.expert_recorder
    rec = attach_recorder(model)
    try:
        yield rec
    finally:
        for m, r in zip(layers, before[0]):
            m.recorder = r
        model.expert_recorder = before[1]


def set_moe_kernels(model: nn.Module, kernels: str) -> None:
    """The fused path's MoE kernels of every MoE layer: "grouped" or "split" (module doc)."""
    if kernels not in MOE_KERNELS:
        raise ValueError(f"moe_kernels={kernels!r} is unknown; use one of {MOE_KERNELS}.")
    for m in moe_layers(model):
        m.kernels = kernels
