"""Config-only model directories for SGLang runs with `--load-format dummy` (random weights):

- a Llama target in the shape of an mtplab model preset and an SGLang EAGLE draft for it
  (`LlamaForCausalLMEagle`: the target's width, one layer), written from mtplab's own
  LlamaConfig (no transformers needed). With real weights, `Engine.save_target` writes an
  HF-style target directory instead.
- a Gemma-4 target and its Frozen-KV MTP assistant (SGLang promotes an EAGLE/NEXTN draft whose
  architecture is `Gemma4AssistantForCausalLM` to FROZEN_KV_MTP). The configs come from
  transformers' own Gemma-4 classes (transformers is needed here, imported on call), so every
  key SGLang reads has the library's default.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from ..atomic import atomic_write_text

PathLike = Union[str, Path]


def write_llama_eagle_dirs(root: PathLike, model: str = "random-medium", *,
                           draft_layers: int = 1, dtype: str = "bfloat16") -> tuple[Path, Path]:
    """(target_dir, draft_dir) under `root`, each holding only config.json: the HF Llama config
    of mtplab preset `model` and an EAGLE draft of `draft_layers` layers at the same width."""
    from ..models.zoo import model_config

    target = model_config(model).to_hf_dict()
    target["torch_dtype"] = dtype
    draft = {**target, "num_hidden_layers": draft_layers,
             "architectures": ["LlamaForCausalLMEagle"]}
    return _config_dirs(root, {"target": target, "draft": draft}, sort_keys=True)


def write_gemma4_frozen_dirs(root: PathLike, *, model: str | None = None,
                             hidden_size: int = 256, layers: int = 4, heads: int = 4,
                             kv_heads: int = 1, head_dim: int = 64, vocab_size: int = 1024,
                             assistant_hidden_size: int = 128,
                             assistant_layers: int = 2) -> tuple[Path, Path]:
    """(target_dir, assistant_dir) under `root`, each holding only config.json. With `model`
    (an mtplab preset) the target takes that preset's shape and the assistant half its width."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    if model is not None:
        from ..models.zoo import model_config
        c = model_config(model)
        hidden_size, layers, heads = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
        kv_heads, head_dim, vocab_size = c.num_key_value_heads, c.head_dim, c.vocab_size
        assistant_hidden_size = hidden_size // 2

    # the last layer attends fully (transformers forces it, with a warning, when the default
    # sliding/full pattern ends on a sliding layer)
    text = dict(hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab_size,
                intermediate_size=4 * hidden_size,
                layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])
    target = Gemma4TextConfig(**text).to_dict()
    target["architectures"] = ["Gemma4ForCausalLM"]
    a_text = Gemma4TextConfig(**{**text, "hidden_size": assistant_hidden_size,
                                 "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                                 "num_hidden_layers": assistant_layers,
                                 "layer_types": ["sliding_attention"] * (assistant_layers - 1)
                                 + ["full_attention"],
                                 "intermediate_size": 4 * assistant_hidden_size}).to_dict()
    assistant = Gemma4AssistantConfig(text_config=a_text,
                                      backbone_hidden_size=hidden_size).to_dict()
    assistant["architectures"] = ["Gemma4AssistantForCausalLM"]
    return _config_dirs(root, {"target": target, "assistant": assistant}, default=str)


def _config_dirs(root: PathLike, configs: dict, **json_options) -> tuple[Path, Path]:
    """root/<name>/config.json for the two configs (name -> config), written atomically;
    `json_options` go to json.dumps."""
    out = []
    for name, cfg in configs.items():
        d = Path(root) / name
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / "config.json", json.dumps(cfg, indent=2, **json_options))
        out.append(d)
    return out[0], out[1]
