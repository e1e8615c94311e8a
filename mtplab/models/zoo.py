"""Model presets. No weights are ever fetched from a hub: presets are made here (seeded random
init) or loaded from a local Hugging Face Llama-format directory.

    random-tiny      4-layer, hidden 128, GQA 4:2, vocab 320, full attention (loads in HF)
    random-tiny-swa  same width, layers sliding/sliding/full/sliding with window 16
    random-medium    8-layer, hidden 1024, GQA 16:4, vocab 32000 (timing at a larger width)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .drafts import AssistantConfig, EagleDraft, FrozenKVAssistant, last_layer_of_type
from .llama import LlamaForCausalLM
from .llama_config import FULL, SLIDING, LlamaConfig
from .tokenizer import ByteTokenizer


def _tiny(**over) -> LlamaConfig:
    base = dict(vocab_size=320, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                max_position_embeddings=2048, rope_theta=10000.0)
    base.update(over)
    return LlamaConfig(**base)


@dataclass(frozen=True)
class Preset:
    name: str
    make_config: Callable[[], LlamaConfig]
    description: str


PRESETS: dict[str, Preset] = {
    "random-tiny": Preset("random-tiny", _tiny, "4 layers, hidden 128, full attention"),
    "random-tiny-swa": Preset(
        "random-tiny-swa",
        lambda: _tiny(layer_types=[SLIDING, SLIDING, FULL, SLIDING], sliding_window=16),
        "4 layers, hidden 128, sliding window 16 on layers 0, 1, 3"),
    "random-medium": Preset(
        "random-medium",
        lambda: _tiny(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      head_dim=64, max_position_embeddings=4096, rope_theta=500000.0),
        "8 layers, hidden 1024, GQA 16:4, vocab 32000"),
}


def is_model_dir(name: str) -> bool:
    return (Path(name) / "config.json").is_file()


def known_models() -> list[str]:
    return sorted(PRESETS)


def model_config(name: str) -> LlamaConfig:
    """Config of a preset or of a local HF directory; one clear error for anything else."""
    if name in PRESETS:
        return PRESETS[name].make_config()
    if is_model_dir(name):
        return LlamaConfig.load(name)
    raise ValueError(f"unknown model {name!r}: use one of {known_models()} or a directory "
                     "holding a Hugging Face Llama config.json and model.safetensors.")


@torch.no_grad()
def init_random(model: torch.nn.Module, seed: int) -> None:
    """Seeded init on a CPU generator in a fixed parameter order: identical on every machine.
    Embeddings ~N(0,1), projections ~N(0, 1/fan_in), lm_head ~N(0, 4/H), norms = 1."""
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        std = 1.0 if "embed" in name else 1.0 / math.sqrt(p.shape[1])
        if name.startswith("lm_head"):
            std = 2.0 / math.sqrt(p.shape[1])
        p.copy_(torch.randn(p.shape, generator=g) * std)


def build_target(name: str, seed: int = 0) -> tuple[LlamaForCausalLM, ByteTokenizer]:
    """The target model (CPU, float32) and its tokenizer."""
    cfg = model_config(name)
    if name in PRESETS:
        model = LlamaForCausalLM(cfg)
        init_random(model, seed)
    else:
        from .weights import load_model
        model = load_model(name)
    return model.eval(), ByteTokenizer(vocab_size=cfg.vocab_size)


def assistant_config(tcfg: LlamaConfig) -> AssistantConfig:
    """One assistant layer per attention type the target has, each reading the target's last
    layer of that type (full attention last, as in Gemma's assistant)."""
    types = [t for t in (SLIDING, FULL) if t in tcfg.layer_types]
    return AssistantConfig(hidden_size=tcfg.hidden_size, intermediate_size=2 * tcfg.hidden_size,
                           num_layers=len(types),
                           kv_layers=[last_layer_of_type(tcfg, t) for t in types])


def build_drafts(target: LlamaForCausalLM, seed: int = 0):
    """(Frozen-KV assistant, EAGLE draft) for any target, random init from the config seed."""
    assistant = FrozenKVAssistant(assistant_config(target.config), target)
    init_random(assistant, seed + 1)
    eagle = EagleDraft(target)
    init_random(eagle, seed + 2)
    return assistant.eval(), eagle.eval()
