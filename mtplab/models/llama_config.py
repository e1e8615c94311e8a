"""Target model configuration with Hugging Face `LlamaConfig` field names (pure Python)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    # Per-layer attention type (Gemma-style sliding/full split); None = all full attention.
    layer_types: Optional[list] = None
    sliding_window: Optional[int] = None
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[int] = 2
    pad_token_id: Optional[int] = 0
    extra: dict = field(default_factory=dict)   # other config.json keys, carried through

    def __post_init__(self):
        if self.layer_types is None:
            self.layer_types = [FULL] * self.num_hidden_layers
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries but "
                             f"num_hidden_layers is {self.num_hidden_layers}; give one per layer.")
        bad = set(self.layer_types) - {FULL, SLIDING}
        if bad:
            raise ValueError(f"unknown layer_types {sorted(bad)}; use {FULL!r} or {SLIDING!r}.")
        if SLIDING in self.layer_types and not self.sliding_window:
            raise ValueError("sliding_attention layers need a positive sliding_window.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads (GQA).")

    @property
    def has_sliding(self) -> bool:
        return SLIDING in self.layer_types

    def window_of(self, layer: int) -> int:
        """Sliding window of a layer in tokens, 0 for full attention."""
        return int(self.sliding_window) if self.layer_types[layer] == SLIDING else 0

    def to_hf_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d.update(self.extra)
        d.update(hidden_act="silu", attention_bias=False, mlp_bias=False,
                 initializer_range=0.02, rope_scaling=None)
        if self.has_sliding:
            # transformers' Llama ignores layer_types/sliding_window and would silently compute
            # full attention, so a sliding-window checkpoint is marked as mtplab-only.
            d.update(architectures=["MtplabLlamaForCausalLM"], model_type="mtplab_llama")
        else:
            d.pop("layer_types"), d.pop("sliding_window")
            d.update(architectures=["LlamaForCausalLM"], model_type="llama")
        return d

    @classmethod
    def from_hf_dict(cls, d: dict) -> "LlamaConfig":
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        known.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        known.setdefault("num_key_value_heads", d["num_attention_heads"])
        if isinstance(known.get("eos_token_id"), list):
            known["eos_token_id"] = known["eos_token_id"][0]
        if not d.get("sliding_window"):
            known.pop("layer_types", None)
        skip = names | {"architectures", "model_type", "hidden_act", "attention_bias",
                        "mlp_bias", "initializer_range", "rope_scaling", "torch_dtype", "dtype",
                        "transformers_version", "use_cache", "pretraining_tp",
                        "attention_dropout"}
        return cls(**known, extra={k: v for k, v in d.items() if k not in skip})

    @classmethod
    def load(cls, directory: str | Path) -> "LlamaConfig":
        return cls.from_hf_dict(json.loads((Path(directory) / "config.json").read_text()))
