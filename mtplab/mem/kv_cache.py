"""Per-layer KV tensors, indexed by slot id: k/v [num_layers, num_slots, Hkv, d] when every
layer has the same shape, else one [num_slots, Hkv_l, d_l] tensor per layer (a Gemma-4
global layer's own KV heads and head_dim). Either way `k[layer]` is that layer's cache."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import torch

Layers = Union[torch.Tensor, list]


@dataclass
class KVCache:
    k: Layers
    v: Layers

    @classmethod
    def allocate(cls, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> "KVCache":
        shape = (num_layers, num_slots, num_kv_heads, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device))

    @classmethod
    def allocate_layers(cls, shapes: Sequence[tuple[int, int]], num_slots: int,
                        dtype: torch.dtype, device: torch.device) -> "KVCache":
        """One cache per layer of (KV heads, head_dim) `shapes`: stacked when all are equal."""
        if len(set(shapes)) == 1:
            return cls.allocate(len(shapes), num_slots, *shapes[0], dtype, device)
        make = lambda: [torch.zeros(num_slots, h, d, dtype=dtype, device=device)  # noqa: E731
                        for h, d in shapes]
        return cls(make(), make())

    def layer_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head_dim) of a layer's cache."""
        return tuple(self.k[layer].shape[-2:])

    @property
    def num_slots(self) -> int:
        return self.k[0].shape[0]
