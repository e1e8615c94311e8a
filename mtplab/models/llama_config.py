"""Target model configuration with Hugging Face `LlamaConfig` field names (pure Python)."""
from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Optional

from ..errors import ModelLoadError

FULL, SLIDING = "full_attention", "sliding_attention"
MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
            "shared_expert_intermediate_size", "norm_topk_prob", "moe_router_bias")
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")
POSITIVE_INTS = REQUIRED + ("num_key_value_heads", "head_dim", "max_position_embeddings")


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
    # RoPE frequency scaling (Hugging Face `rope_scaling`): None, or {"rope_type": "linear",
    # "factor"} or {"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    # "original_max_position_embeddings"} (Llama 3.1); see models/llama.py rope_inv_freq
    rope_scaling: Optional[dict] = None
    bos_token_id: Optional[int] = 1
    eos_token_id: Optional[int] = 2
    pad_token_id: Optional[int] = 0
    # Gemma-4's global (full-attention) layers: their own head_dim and KV-head count, when a
    # config has sliding layers too (None: the same as every layer); see `attn_shape`.
    global_head_dim: Optional[int] = None
    num_global_key_value_heads: Optional[int] = None
    # Mixture-of-experts FFN in every layer (Qwen2-MoE's names and formula, models/moe.py);
    # num_experts 0 = the dense SwiGLU FFN of intermediate_size.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0      # 0: no shared expert
    norm_topk_prob: bool = True                   # renormalise the top-k routing weights
    moe_router_bias: bool = False                 # a per-expert router logit bias (mtplab key:
                                                  # the routing skew of a random preset)
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
        self.rope_scaling = normalized_rope_scaling(self.rope_scaling)
        if self.num_attention_heads % (self.num_global_key_value_heads or 1):
            raise ValueError("num_attention_heads must be a multiple of "
                             "num_global_key_value_heads (GQA).")
        if self.num_experts and not (1 <= self.num_experts_per_tok <= self.num_experts
                                     and self.moe_intermediate_size >= 1):
            raise ValueError(f"a mixture of {self.num_experts} experts needs 1 <= "
                             f"num_experts_per_tok <= {self.num_experts} and a positive "
                             "moe_intermediate_size.")

    def attn_shape(self, layer: int) -> tuple[int, int]:
        """(KV heads, head_dim) of a layer: a global layer's own when the config sets them
        and has sliding layers (Gemma-4: head_dim 512, fewer KV heads), else the config's."""
        if self.layer_types[layer] == FULL and self.has_sliding:
            return (self.num_global_key_value_heads or self.num_key_value_heads,
                    self.global_head_dim or self.head_dim)
        return self.num_key_value_heads, self.head_dim

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def has_sliding(self) -> bool:
        return SLIDING in self.layer_types

    def window_of(self, layer: int) -> int:
        """Sliding window of a layer in tokens, 0 for full attention."""
        return int(self.sliding_window) if self.layer_types[layer] == SLIDING else 0

    def hf_tensor_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of a Hugging Face Llama checkpoint of this config, by its HF name, with
        the shape the config implies (lm_head.weight included; a tied checkpoint may omit it).
        Independent of how the live modules store them (fused QKV etc.)."""
        V, H = self.vocab_size, self.hidden_size
        shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,),
                  "lm_head.weight": (V, H)}
        for i in range(self.num_hidden_layers):
            nkv, d = self.attn_shape(i)
            q, kv = self.num_attention_heads * d, nkv * d
            p = f"model.layers.{i}."
            shapes.update({
                p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q)})
            shapes.update(self._ffn_shapes(p + "mlp."))
        return shapes

    def _ffn_shapes(self, p: str) -> dict[str, tuple[int, ...]]:
        """The FFN's tensors of one layer: dense SwiGLU, or Qwen2-MoE's router, stacked
        experts (gate rows then up rows) and shared expert with its sigmoid gate."""
        H, I = self.hidden_size, self.intermediate_size
        if not self.is_moe:
            return {p + "gate_proj.weight": (I, H), p + "up_proj.weight": (I, H),
                    p + "down_proj.weight": (H, I)}
        E, Ie, Is = self.num_experts, self.moe_intermediate_size, \
            self.shared_expert_intermediate_size
        out = {p + "gate.weight": (E, H), p + "experts.gate_up_proj": (E, 2 * Ie, H),
               p + "experts.down_proj": (E, H, Ie)}
        if self.moe_router_bias:
            out[p + "gate.bias"] = (E,)
        if Is:
            out.update({p + "shared_expert.gate_proj.weight": (Is, H),
                        p + "shared_expert.up_proj.weight": (Is, H),
                        p + "shared_expert.down_proj.weight": (H, Is),
                        p + "shared_expert_gate.weight": (1, H)})
        return out

    def to_hf_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "extra"}
        d.update(self.extra)
        d.update(hidden_act="silu", attention_bias=False, mlp_bias=False,
                 initializer_range=0.02)
        if not self.is_moe:
            for k in MOE_KEYS:
                d.pop(k)
        for k in ("global_head_dim", "num_global_key_value_heads"):
            if d[k] is None:
                d.pop(k)
        else:
            d.update(decoder_sparse_step=1, mlp_only_layers=[], qkv_bias=False,
                     use_sliding_window=self.has_sliding)
        if self.is_moe and not self.has_sliding and not self.moe_router_bias:
            d.pop("layer_types"), d.pop("sliding_window"), d.pop("moe_router_bias")
            d.update(architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe")
        elif self.is_moe:
            # Qwen2-MoE has no router bias, and its sliding layers are not mtplab's: such a
            # checkpoint is mtplab-only (docs/design.md "Models", the MoE layout).
            d.update(architectures=["MtplabMoeForCausalLM"], model_type="mtplab_moe")
        elif self.has_sliding:
            # transformers' Llama ignores layer_types/sliding_window and would silently compute
            # full attention, so a sliding-window checkpoint is marked as mtplab-only.
            d.update(architectures=["MtplabLlamaForCausalLM"], model_type="mtplab_llama")
        else:
            d.pop("layer_types"), d.pop("sliding_window")
            d.update(architectures=["LlamaForCausalLM"], model_type="llama")
        return d

    @staticmethod
    def check_hf_dict(d) -> None:
        """The keys a Llama config.json must have, with usable values (ValueError: one
        sentence; `load` prefixes the file)."""
        if not isinstance(d, dict):
            raise ValueError(f"holds a JSON {type(d).__name__}, not an object; a Llama "
                             "config.json is an object of settings")
        missing = [k for k in REQUIRED if k not in d]
        if missing:
            raise ValueError(f"missing required keys {missing}; a Llama config.json needs "
                             f"{', '.join(REQUIRED)}")
        for k in POSITIVE_INTS:
            v = d.get(k)
            if k in d and v is not None and (isinstance(v, bool) or
                                              not isinstance(v, numbers.Integral) or v < 1):
                raise ValueError(f"{k}={v!r} is not a positive integer; fix it in config.json")
        for k in ("rms_norm_eps", "rope_theta"):
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)
                                  or not v > 0):
                raise ValueError(f"{k}={v!r} is not a positive number; fix it in config.json")

    @classmethod
    def from_hf_dict(cls, d: dict) -> "LlamaConfig":
        cls.check_hf_dict(d)
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        rp = d.get("rope_parameters")     # transformers >= 5 writes theta and scaling here
        if isinstance(rp, dict):
            if "rope_theta" in rp:
                known["rope_theta"] = rp["rope_theta"]
            known["rope_scaling"] = {k: v for k, v in rp.items() if k != "rope_theta"}
        known.setdefault("head_dim", d["hidden_size"] // d["num_attention_heads"])
        known.setdefault("num_key_value_heads", d["num_attention_heads"])
        if isinstance(known.get("eos_token_id"), list):
            known["eos_token_id"] = known["eos_token_id"][0]
        if not d.get("sliding_window") or d.get("use_sliding_window") is False:
            known.pop("layer_types", None)
            known.pop("sliding_window", None)
        if d.get("num_experts"):
            check_moe_layout(d)
        skip = names | {"architectures", "model_type", "hidden_act", "attention_bias",
                        "mlp_bias", "initializer_range", "rope_parameters", "torch_dtype", "dtype",
                        "transformers_version", "use_cache", "pretraining_tp",
                        "attention_dropout", "decoder_sparse_step", "mlp_only_layers",
                        "qkv_bias", "use_sliding_window", "max_window_layers",
                        "output_router_logits", "router_aux_loss_coef"}
        return cls(**known, extra={k: v for k, v in d.items() if k not in skip})

    @classmethod
    def load(cls, directory: str | Path) -> "LlamaConfig":
        """config.json of a model directory; ModelLoadError "<file>: <problem>; <fix>"."""
        path = Path(directory) / "config.json"
        try:
            text = path.read_text()
        except FileNotFoundError:
            raise ModelLoadError(f"{path}: not found; a model directory needs config.json and "
                                 "model.safetensors (Hugging Face Llama layout).") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{path}: cannot be read ({e}); check the file.") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column "
                                 f"{e.colno}); fix the file or save the model again.") from None
        try:
            return cls.from_hf_dict(d)
        except (ValueError, TypeError) as e:
            raise ModelLoadError(f"{path}: {str(e).rstrip('.')}.") from None


ROPE_KEYS = {"linear": ("factor",),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                        "original_max_position_embeddings")}


def normalized_rope_scaling(rs) -> Optional[dict]:
    """A config's rope_scaling as {"rope_type": ..., its parameters} (the old key "type"
    accepted), None for no scaling; ValueError naming the problem for a kind mtplab does not
    implement or a missing / non-positive parameter."""
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ValueError(f"rope_scaling={rs!r} is not an object; use null or "
                         '{"rope_type": "llama3", ...}')
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return None
    if kind not in ROPE_KEYS:
        raise ValueError(f"rope_scaling type {kind!r} is not implemented; mtplab implements "
                         f"{sorted(ROPE_KEYS)} (or remove rope_scaling)")
    out = {"rope_type": kind}
    for k in ROPE_KEYS[kind]:
        v = rs.get(k)
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v > 0:
            raise ValueError(f"rope_scaling {kind} needs a positive {k}, got {v!r}")
        out[k] = v
    if kind == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise ValueError("rope_scaling llama3 needs high_freq_factor > low_freq_factor")
    return out


def check_moe_layout(d: dict) -> None:
    """A Qwen2-MoE-style config.json that mtplab's MoE (experts in every layer, no attention
    biases) can run; ValueError naming the key otherwise."""
    if d.get("qkv_bias"):
        raise ValueError("qkv_bias=true: mtplab's attention has no q/k/v biases; use a "
                         "checkpoint without them")
    if d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers"):
        raise ValueError("decoder_sparse_step / mlp_only_layers put dense FFNs between the "
                         "MoE layers; mtplab's MoE has experts in every layer")


def routing_skew(text: str) -> float:
    """`moe_routing`: "uniform" -> 0, "zipf:<s>" -> s > 0; ValueError naming the forms."""
    if text == "uniform":
        return 0.0
    kind, _, arg = str(text).partition(":")
    try:
        s = float(arg) if kind == "zipf" else -1.0
    except ValueError:
        s = -1.0
    if not s > 0 or s != s or s == float("inf"):
        raise ValueError(f"moe_routing={text!r} is not 'uniform' or 'zipf:<s>' with s > 0 "
                         "(e.g. zipf:1.2)")
    return s
