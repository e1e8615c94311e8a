"""Config-only model directories for SGLang runs with `--load-format dummy` (random weights):

- a Llama target in the shape of an mtplab model preset and an SGLang EAGLE draft for it
  (`LlamaForCausalLMEagle`: the target's width, one layer), written from mtplab's own
  LlamaConfig (no transformers needed). With real weights, `Engine.save_target` writes an
  HF-style target directory instead.
- a Gemma-4 target and its Frozen-KV MTP assistant (SGLang promotes an EAGLE/NEXTN draft whose
  architecture is `Gemma4AssistantForCausalLM` to FROZEN_KV_MTP), in the sizes of an mtplab
  preset and its assistant or in sizes given. The configs come from transformers' own Gemma-4
  classes (transformers is needed here, imported on call), so every key SGLang reads has the
  library's default.
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
                             assistant_hidden_size: int = 128, assistant_layers: int = 2,
                             dtype: str = "bfloat16") -> tuple[Path, Path]:
    """(target_dir, assistant_dir) under `root`, each holding only config.json: a Gemma-4 text
    target and its Frozen-KV assistant, built by transformers' own config classes (whose
    version is the one SGLang reads them with).

    With `model` (an mtplab preset of full-attention layers), what SGLang's Frozen-KV worker
    runs nearest to that preset and mtplab's assistant for it (models/zoo.assistant_config):
        target     the preset's hidden size, depth, q/KV heads, head_dim, FFN width,
                   vocabulary, tying and rope theta; every layer full attention with that
                   head_dim and KV head count (Gemma-4's `global_*` sizes), full rotary, no
                   per-layer inputs
        assistant  `assistant_layers` full-attention layers as wide as the target (FFN twice
                   that), reading the target's last layer; its LM head as wide as mtplab's
    Gemma-4 still adds q/k/v norms, two more norms per layer and a layer scalar to Llama's work.
    Without `model`: a target of the given sizes (Gemma's sliding/full pattern, the last layer
    full) and an assistant `assistant_hidden_size` wide."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    if model is not None:
        target, a_text, backbone = _gemma4_like(model, assistant_layers, Gemma4TextConfig)
    else:
        # the last layer attends fully (transformers forces it, with a warning, when the
        # default sliding/full pattern ends on a sliding layer)
        text = dict(hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=heads,
                    num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=vocab_size,
                    intermediate_size=4 * hidden_size,
                    layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"])
        target = Gemma4TextConfig(**text).to_dict()
        a_text = Gemma4TextConfig(**{
            **text, "hidden_size": assistant_hidden_size, "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0, "num_hidden_layers": assistant_layers,
            "layer_types": ["sliding_attention"] * (assistant_layers - 1) + ["full_attention"],
            "intermediate_size": 4 * assistant_hidden_size}).to_dict()
        backbone = hidden_size
    target.update(architectures=["Gemma4ForCausalLM"], dtype=dtype, torch_dtype=dtype)
    assistant = Gemma4AssistantConfig(text_config=a_text, backbone_hidden_size=backbone).to_dict()
    assistant.update(architectures=["Gemma4AssistantForCausalLM"], dtype=dtype, torch_dtype=dtype)
    return _config_dirs(root, {"target": target, "assistant": assistant}, default=str)


def _gemma4_like(model: str, assistant_layers: int, text_config) -> tuple[dict, dict, int]:
    """(target config, assistant text config, backbone width) mirroring mtplab preset `model`
    (write_gemma4_frozen_dirs)."""
    from ..models.zoo import model_config

    c = model_config(model)
    if c.has_sliding:
        raise ValueError(f"model {model!r} has sliding-window layers; the Gemma-4 directories "
                         "mirror presets of full-attention layers only (e.g. random-medium, "
                         "llama3-8b-like).")
    rope = {"full_attention": {"rope_type": "default", "rope_theta": float(c.rope_theta)}}

    def text(layers: int, ffn: int, tied: bool) -> dict:
        return text_config(
            hidden_size=c.hidden_size, num_hidden_layers=layers, intermediate_size=ffn,
            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
            head_dim=c.head_dim, global_head_dim=c.head_dim,
            num_global_key_value_heads=c.num_key_value_heads, vocab_size=c.vocab_size,
            layer_types=["full_attention"] * layers, rope_parameters=rope,
            sliding_window=c.max_position_embeddings, hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0, max_position_embeddings=c.max_position_embeddings,
            rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=tied).to_dict()

    return (text(c.num_hidden_layers, c.intermediate_size, c.tie_word_embeddings),
            text(assistant_layers, 2 * c.hidden_size, True), c.hidden_size)


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


def write_token_map(path: PathLike, ids) -> Path:
    """A hot vocabulary as SGLang's --speculative-token-map reads it (a torch.save'd list of
    token ids, spec_utils.load_token_map); written atomically. torch is imported on call."""
    import torch

    from ..atomic import atomic_path
    out = Path(path)
    with atomic_path(out) as tmp:
        torch.save([int(i) for i in ids], tmp)
    return out
