"""Config-only model directories for SGLang runs with `--load-format dummy` (random weights):

- a Llama target in the shape of an mtplab model preset and an SGLang EAGLE draft for it
  (`LlamaForCausalLMEagle`: the target's width, one layer), written from mtplab's own
  LlamaConfig (no transformers needed). With real weights, `Engine.save_target` writes an
  HF-style target directory instead.
- a Gemma-4 target and its Frozen-KV MTP assistant (SGLang promotes an EAGLE/NEXTN draft whose
  architecture is `Gemma4AssistantForCausalLM` to FROZEN_KV_MTP), mirroring an mtplab preset
  with Gemma's sliding/full pattern and mtplab's assistant for it, or in sizes given. The
  configs come from transformers' own Gemma-4 classes (transformers is needed here, imported
  on call), so every key SGLang reads has the library's default.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from ..atomic import atomic_write_text
from ..draft_kinds import DRAFT_KINDS, kinds_where
from .args import FROZEN

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
                             draft: str = "frozen_kv_mtp", hidden_size: int = 256,
                             layers: int = 4, heads: int = 4,
                             kv_heads: int = 1, head_dim: int = 64, vocab_size: int = 1024,
                             assistant_hidden_size: int = 128, assistant_layers: int = 2,
                             dtype: str = "bfloat16") -> tuple[Path, Path]:
    """(target_dir, assistant_dir) under `root`, each holding only config.json: a Gemma-4 text
    target and its Frozen-KV assistant, built by transformers' own config classes (whose
    version is the one SGLang reads them with).

    With `model` (an mtplab preset with Gemma's sliding/full pattern), what SGLang's Frozen-KV
    worker runs nearest to that preset and mtplab's assistant of Frozen-KV kind `draft` for it
    (the kind's assistant_config); SGLang's parser and KV pool read what mtplab's engine
    builds:
        target     the preset's hidden size, depth, layer types, sliding window, q/KV heads,
                   head_dim, FFN width, vocabulary, tying and rope theta; the full-attention
                   layers with the sliding layers' head_dim and KV heads (Gemma-4's `global_*`
                   sizes set equal: mtplab's stack has one of each), plain RoPE on both
                   types, no per-layer inputs
        assistant  the kind's layers, width and FFN, each layer of the attention type of the
                   target layer it reads, a head of its own tied to its embedding at its width
                   (frozen_kv_mtp: one layer per type, sliding then full, as wide as the
                   target, FFN twice that, an LM head as wide as the target's it reads;
                   gemma4_assistant: three sliding layers and a full one at half the width,
                   FFN four times that, its own head)
    Gemma-4 still adds q/k/v norms, two more norms per layer and a layer scalar to Llama's work.
    A preset SGLang 0.5.17 cannot run this way is one ValueError (sglang_gemma4_problem).
    Without `model`: a target of the given sizes (Gemma's sliding/full pattern, the last layer
    full) and an assistant `assistant_hidden_size` wide."""
    from transformers import Gemma4AssistantConfig, Gemma4TextConfig

    if model is not None:
        target, a_text, backbone = _gemma4_like(model, draft, Gemma4TextConfig)
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
    # SGLang's names for the sliding layers' sizes (base = full attention, swa_* = sliding),
    # which its config loader derives for a `gemma4` checkpoint but not for this `gemma4_text`
    # one; its Gemma-4 KV pool reads swa_num_key_value_heads (without it, the scheduler dies
    # building the pool: "'Gemma4TextConfig' object has no attribute 'swa_num_key_value_heads'")
    target.update(architectures=["Gemma4ForCausalLM"], dtype=dtype, torch_dtype=dtype,
                  swa_num_key_value_heads=target["num_key_value_heads"],
                  swa_head_dim=target["head_dim"], swa_v_head_dim=target["head_dim"])
    assistant = Gemma4AssistantConfig(text_config=a_text, backbone_hidden_size=backbone).to_dict()
    assistant.update(architectures=["Gemma4AssistantForCausalLM"], dtype=dtype, torch_dtype=dtype)
    return _config_dirs(root, {"target": target, "assistant": assistant}, default=str)


def sglang_gemma4_problem(cfg, kv_layers: list | None = None) -> str | None:
    """Why SGLang 0.5.17 cannot run mtplab target `cfg` (a LlamaConfig) as a Gemma-4 target,
    with a Frozen-KV assistant whose layers read target layers `kv_layers` (None: no
    assistant), or None:
        no sliding layer   SGLang sizes every Gemma-4 target's KV as hybrid sliding-window
                           and asserts at least one sliding layer (pool_configurator.py)
        last layer sliding Gemma-4's last layer attends fully (transformers forces it)
        assistant's layers SGLang maps each assistant layer to the target's layer of the same
                           type among the last two (gemma4_mtp.py); mtplab's read
                           `kv_layers`: the two agree when the last two layers are one
                           sliding, one full, and the assistant reads only those
        MoE, RoPE scaling  not mirrored: mtplab's MoE FFN is not Gemma-4's MoE block, and
                           SGLang's Gemma-4 takes plain RoPE here"""
    from ..models.llama_config import FULL

    L = cfg.num_hidden_layers
    if not cfg.has_sliding:
        return ("it has no sliding-window layer, and SGLang 0.5.17 sizes a Gemma-4 target's KV "
                "as hybrid sliding-window ('Hybrid SWA model must have at least one SWA "
                "layer'); use a preset with Gemma's sliding/full pattern, e.g. gemma4-31b-like@6")
    if cfg.layer_types[-1] != FULL:
        return ("its last layer is a sliding-window layer; Gemma-4's last layer attends fully "
                "(use a preset with Gemma's pattern, e.g. gemma4-31b-like@6)")
    last_two = {cfg.layer_types[i]: i for i in range(max(0, L - 2), L)}
    if kv_layers is not None and any(last_two.get(cfg.layer_types[k]) != k for k in kv_layers):
        return (f"its last two layers are {cfg.layer_types[L - 2:]}: SGLang's Frozen-KV "
                "assistant reads the target's last two layers, one of each type, where mtplab's "
                f"reads layers {list(kv_layers)}; pick a depth whose last two layers are one "
                "sliding and one full (gemma4-31b-like@6, @12, ...)")
    if getattr(cfg, "num_experts", 0):
        return "its FFN is a mixture of experts; the Gemma-4 directories mirror dense presets"
    if cfg.rope_scaling is not None:
        return "it scales RoPE; the Gemma-4 directories mirror presets of plain RoPE"
    return None


def frozen_assistant(cfg, draft: str):
    """mtplab's AssistantConfig of Frozen-KV kind `draft` for target config `cfg` (ValueError
    naming the kinds for any other draft)."""
    if DRAFT_KINDS.get(draft) is None or DRAFT_KINDS[draft].sglang_algorithm != FROZEN:
        raise ValueError(f"{draft!r} is not a Frozen-KV draft: use one of "
                         f"{kinds_where(sglang_algorithm=FROZEN)}.")
    return DRAFT_KINDS[draft].assistant_config(cfg)


def _gemma4_like(model: str, draft: str, text_config) -> tuple[dict, dict, int]:
    """(target config, assistant text config, backbone width) mirroring mtplab preset `model`
    and its assistant of kind `draft` (write_gemma4_frozen_dirs)."""
    from ..models.zoo import model_config

    c = model_config(model)
    ac = frozen_assistant(c, draft)
    problem = sglang_gemma4_problem(c, ac.kv_layers)
    if problem:
        raise ValueError(f"model {model!r}: {problem}.")
    rope = {t: {"rope_type": "default", "rope_theta": float(c.rope_theta)}
            for t in sorted(set(c.layer_types))}

    def text(hidden: int, types: list, ffn: int, tied: bool) -> dict:
        return text_config(
            hidden_size=hidden, num_hidden_layers=len(types), intermediate_size=ffn,
            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
            head_dim=c.head_dim, global_head_dim=c.head_dim,
            num_global_key_value_heads=c.num_key_value_heads, vocab_size=c.vocab_size,
            layer_types=list(types), rope_parameters=rope, sliding_window=c.sliding_window,
            hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
            max_position_embeddings=c.max_position_embeddings, rms_norm_eps=c.rms_norm_eps,
            tie_word_embeddings=tied).to_dict()

    return (text(c.hidden_size, c.layer_types, c.intermediate_size, c.tie_word_embeddings),
            text(ac.hidden_size, [c.layer_types[i] for i in ac.kv_layers],
                 ac.intermediate_size, True), c.hidden_size)


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
