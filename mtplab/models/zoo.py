"""Model presets. No weights are ever fetched from a hub: presets are made here (seeded random
init) or loaded from a local Hugging Face Llama-format directory.

    random-tiny      4-layer, hidden 128, GQA 4:2, vocab 320, full attention (loads in HF)
    random-tiny-swa  same width, layers sliding/sliding/full/sliding with window 16
    random-tiny-moe  random-tiny's attention with an MoE FFN: 16 experts (64 wide), top-4, a
                     shared expert (128 wide); saves as Qwen2-MoE (loads in transformers)
    random-tiny-gemma4  random-tiny-moe with Gemma-4's attention layout: sliding layers 0-2
                     (window 16, head_dim 32), global layer 3 at head_dim 64 (2 KV heads
                     each: mixed KV shapes per layer; an mtplab-only checkpoint)
    random-medium    8-layer, hidden 1024, GQA 16:4, vocab 32000 (timing at a larger width)

Random presets initialise on the CPU (fp32, a CPU generator: the same weights on every machine
and device). Shape presets are GBs: on a CUDA device they are built on the meta device, given
storage on the device in the run's dtype and initialised there with a generator on that device
(seeded, the same parameter order; values differ from a CPU build of the same preset).

Shape presets (seeded random init, for timing with simulated acceptance; depth selectable as
`<preset>@<layers>`, see `with_layers`):
    gemma4-26b-a4b-like  hidden 2816, 16 q / 8 kv heads, head_dim 256, window 1024, 5:1
                         sliding:full, global layers at head_dim 512 with 2 KV heads, MoE
                         FFN: 128 experts of width 704, top-8, and a shared expert of width
                         2112 (models/moe.py), vocab 262144 tied; default 6 of 30 layers
    gemma4-31b-like      hidden 5376, 32 q / 16 kv heads, head_dim 256, window 1024, 5:1
                         sliding:full, FFN 21504, vocab 262144 tied; default 6 of 60 layers
    llama3-8b-like       hidden 4096, 32 q / 8 kv heads, head_dim 128, FFN 14336, full vocab
                         128256, rope theta 5e5, 8192 positions; default 4 of 32 layers
    llama3.1-8b-like     the same shapes at 131072 positions with Llama 3.1's RoPE scaling
                         (llama3: factor 8, low/high frequency factors 1 / 4, original 8192)
    (gemma4-31b-like keeps head_dim 256 in its full-attention layers; Gemma's GeGLU, QK-norm
    and extra norms are left out: these stacks keep the shapes that drive time and memory.)

Trained preset (weights shipped in the package, mtplab/zoo/<name>/):
    tiny-code            byte-level 6-layer hidden-256 Llama trained on the CPython stdlib, with
                         its trained Frozen-KV assistant and EAGLE draft (see its manifest.json)
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file

from ..draft_kinds import DRAFT_KINDS
from ..nogc import import_on_bare_thread
from .drafts import AssistantConfig, last_layer_of_type
from .llama import LlamaForCausalLM
from .llama_config import FULL, SLIDING, LlamaConfig, routing_skew
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


def _gemma_types(n: int) -> list:
    """Gemma's 5:1 pattern (every 6th layer full); the last layer is always full attention."""
    return [FULL if i % 6 == 5 or i == n - 1 else SLIDING for i in range(n)]


LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class ShapePreset:
    """A realistic stack at a chosen depth (random init). `full_layers` is the real depth."""
    name: str
    shape: dict
    default_layers: int
    full_layers: int
    gemma_pattern: bool
    description: str

    def config(self, layers: int | None = None) -> LlamaConfig:
        n = self.default_layers if layers is None else layers
        if not 1 <= n <= self.full_layers:
            raise ValueError(f"{self.name} has 1..{self.full_layers} layers; got {n}.")
        extra = dict(layer_types=_gemma_types(n), sliding_window=1024) \
            if self.gemma_pattern else {}
        return LlamaConfig(num_hidden_layers=n, **self.shape, **extra)


SHAPES: dict[str, ShapePreset] = {s.name: s for s in (
    ShapePreset("gemma4-26b-a4b-like",
                dict(vocab_size=262144, hidden_size=2816, intermediate_size=2112,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                     max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
                     num_experts=128, num_experts_per_tok=8, moe_intermediate_size=704,
                     shared_expert_intermediate_size=2112, global_head_dim=512,
                     num_global_key_value_heads=2),
                6, 30, True, "Gemma-4 26B-A4B shapes: 128 experts of width 704, top-8, and a "
                             "shared expert of width 2112 per layer; global layers at head_dim "
                             "512 with 2 KV heads"),
    ShapePreset("gemma4-31b-like",
                dict(vocab_size=262144, hidden_size=5376, intermediate_size=21504,
                     num_attention_heads=32, num_key_value_heads=16, head_dim=256,
                     max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True),
                6, 60, True, "Gemma-4 31B dense shapes"),
    ShapePreset("llama3-8b-like",
                dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=8192, rope_theta=500000.0),
                4, 32, False, "Llama-3 8B shapes"),
    ShapePreset("llama3.1-8b-like",
                dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling=LLAMA31_ROPE),
                4, 32, False, "Llama-3.1 8B shapes, 128k context"),
)}

# Trained presets: name -> directory with target/, assistant/, eagle/ (train.py's output).
ZOO_DIR = Path(__file__).resolve().parent.parent / "zoo"
TRAINED = {"tiny-code": ZOO_DIR / "tiny-code"}


def with_layers(name: str, layers: int) -> str:
    """The model name of shape preset `name` at depth `layers` ("llama3-8b-like@8"); `name`
    may carry the same depth already (`X@8` with layers 8), never another."""
    base, _, depth = name.partition("@")
    if base not in SHAPES:
        raise ValueError(f"layers can be chosen for the shape presets {sorted(SHAPES)} only; "
                         f"{name!r} has a fixed depth.")
    if depth and depth != str(layers):
        raise ValueError(f"model {name!r} names {depth} layers and layers={layers} names "
                         f"{layers}; give the depth once ({base}@{layers}, or {base} with "
                         f"layers={layers}).")
    SHAPES[base].config(layers)                       # validates the depth
    return f"{base}@{layers}"


def _shape_of(name: str) -> tuple[ShapePreset, int | None] | None:
    base, _, depth = name.partition("@")
    if base not in SHAPES:
        return None
    if depth and not depth.isdigit():
        raise ValueError(f"model {name!r}: the depth after '@' must be a layer count, "
                         f"e.g. {base}@8.")
    return SHAPES[base], int(depth) if depth else None


def _trained_dir(name: str) -> Path | None:
    d = TRAINED.get(name)
    if d is None:
        return None
    if not (d / "target" / "config.json").is_file():
        raise ValueError(f"model {name!r}: its shipped weights are missing from {d} "
                         f"(train them with python -m mtplab.models.train --out {d}).")
    return d


PRESETS: dict[str, Preset] = {
    "random-tiny": Preset("random-tiny", _tiny, "4 layers, hidden 128, full attention"),
    "random-tiny-swa": Preset(
        "random-tiny-swa",
        lambda: _tiny(layer_types=[SLIDING, SLIDING, FULL, SLIDING], sliding_window=16),
        "4 layers, hidden 128, sliding window 16 on layers 0, 1, 3"),
    "random-tiny-moe": Preset(
        "random-tiny-moe",
        lambda: _tiny(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
                      shared_expert_intermediate_size=128),
        "4 layers, hidden 128, 16 experts of width 64, top-4, a shared expert of width 128"),
    "random-tiny-gemma4": Preset(
        "random-tiny-gemma4",
        lambda: _tiny(layer_types=[SLIDING, SLIDING, SLIDING, FULL], sliding_window=16,
                      global_head_dim=64, num_global_key_value_heads=2, num_experts=16,
                      num_experts_per_tok=4, moe_intermediate_size=64,
                      shared_expert_intermediate_size=128),
        "random-tiny-moe's FFN under Gemma-4's attention: layers 0-2 sliding (window 16), "
        "layer 3 global at head_dim 64"),
    "random-medium": Preset(
        "random-medium",
        lambda: _tiny(vocab_size=32000, hidden_size=1024, intermediate_size=2816,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                      head_dim=64, max_position_embeddings=4096, rope_theta=500000.0),
        "8 layers, hidden 1024, GQA 16:4, vocab 32000"),
}


def is_random_preset(name: str) -> bool:
    """A preset built by seeded random init (not trained weights, not a directory)."""
    return name in PRESETS or _shape_of(name) is not None


def is_model_dir(name: str) -> bool:
    return (Path(name) / "config.json").is_file()


def known_models() -> list[str]:
    return sorted([*PRESETS, *SHAPES, *TRAINED])


def model_config(name: str) -> LlamaConfig:
    """Config of a preset or of a local HF directory; one clear error for anything else."""
    if name in PRESETS:
        return PRESETS[name].make_config()
    shape = _shape_of(name)
    if shape is not None:
        return shape[0].config(shape[1])
    trained = _trained_dir(name)
    if trained is not None:
        return LlamaConfig.load(trained / "target")
    if is_model_dir(name):
        return LlamaConfig.load(name)
    raise ValueError(f"unknown model {name!r}: use one of {known_models()} or a directory "
                     "holding a Hugging Face Llama config.json and model.safetensors.")


@torch.no_grad()
def init_random(model: torch.nn.Module, seed: int) -> None:
    """Seeded init in a fixed parameter order, on a generator on the parameters' device: on
    the CPU identical on every machine. Embeddings ~N(0,1), projections (stacked experts
    too) ~N(0, 1/fan_in), lm_head ~N(0, 4/H), norms = 1, biases (an MoE router's) = 0."""
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        if name.endswith(".bias"):           # an MoE router's bias: the routing skew's
            p.zero_()                         # (zoo.skew_routing), zero = uniform
            continue
        std = 1.0 if "embed" in name else 1.0 / math.sqrt(p.shape[-1])
        if name.startswith("lm_head"):
            std = 2.0 / math.sqrt(p.shape[1])
        if dev.type == "cpu":
            p.copy_(torch.randn(p.shape, generator=g) * std)
        else:
            p.normal_(0.0, std, generator=g)


def _empty_on(make, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """make() built on the meta device, then given uninitialised storage on `device` in
    `dtype`: no CPU init and no float32 copy. The caller initialises every parameter."""
    import_on_bare_thread("torch._dynamo")      # a meta init imports it: off our stack
    with torch.device("meta"):
        module = make()
    return module.to(dtype).to_empty(device=device)


def _on_device(device, dtype) -> bool:
    return device is not None and torch.device(device).type != "cpu" and dtype is not None


def build_target(name: str, seed: int = 0, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None,
                 moe_routing: str = "uniform") -> tuple[LlamaForCausalLM, ByteTokenizer]:
    """The target model and its tokenizer: on the CPU in float32, except a shape preset asked
    for on a CUDA `device` with a `dtype`, which is built and initialised there (module doc).
    `init_device` marks the device of an on-device build (None: a CPU build); build_draft
    builds random drafts the same way. `moe_routing` skews a random MoE preset's router
    (`skew_routing`); the caller (RunConfig) has checked that it applies."""
    cfg = model_config(name)
    skew = routing_skew(moe_routing)
    if skew:
        cfg.moe_router_bias = True
    if _shape_of(name) is not None and _on_device(device, dtype):
        dev = torch.device(device)
        model = _empty_on(lambda: LlamaForCausalLM(cfg), dev, dtype)
        if cfg.tie_word_embeddings:     # to_empty gives each module its own new parameter
            model.lm_head.weight = model.model.embed_tokens.weight
        # The RoPE tables are buffers, not parameters: compute them as a CPU build does.
        model.make_ropes(dev)
        init_random(model, seed)
        model.init_device = dev
    elif name in PRESETS or _shape_of(name) is not None:
        model = LlamaForCausalLM(cfg)
        init_random(model, seed)
        model.init_device = None
    else:
        from .weights import load_model
        trained = _trained_dir(name)
        model = load_model(trained / "target" if trained is not None else name)
        # build_drafts finds the shipped drafts through this mark (kept by .to()).
        model.trained_dir = trained
    if skew:
        skew_routing(model, skew, seed)
    return model.eval(), ByteTokenizer(vocab_size=cfg.vocab_size)


@torch.no_grad()
def skew_routing(model: LlamaForCausalLM, s: float, seed: int) -> None:
    """Zipf-skewed routing of a random MoE model: each layer's router gets a logit bias
    -s ln(rank), the ranks 1..E a seeded permutation per layer, so an expert's softmax weight
    is scaled by rank^-s (the top-ranked experts are chosen most often)."""
    g = torch.Generator().manual_seed(seed + 101)
    for layer in model.model.layers:
        bias = layer.mlp.gate.bias
        ranks = torch.randperm(bias.numel(), generator=g).double() + 1.0
        bias.copy_((-s * ranks.log()).to(bias.dtype))


def assistant_config(tcfg: LlamaConfig) -> AssistantConfig:
    """One assistant layer per attention type the target has, each reading the target's last
    layer of that type (full attention last, as in Gemma's assistant)."""
    types = [t for t in (SLIDING, FULL) if t in tcfg.layer_types]
    return AssistantConfig(hidden_size=tcfg.hidden_size, intermediate_size=2 * tcfg.hidden_size,
                           num_layers=len(types),
                           kv_layers=[last_layer_of_type(tcfg, t) for t in types])


def token_counts(target: LlamaForCausalLM) -> torch.Tensor | None:
    """Token counts of a trained preset's training split (<preset>/token_counts.json, written
    by train.py), the corpus a hot draft vocabulary is ranked on; None for a random preset."""
    trained = getattr(target, "trained_dir", None)
    f = None if trained is None else trained / "token_counts.json"
    if f is None or not f.is_file():
        return None
    return torch.tensor(json.loads(f.read_text())["counts"], dtype=torch.long)


def shipped_draft(trained: Path | None, kind: str) -> Path | None:
    """The folder of draft `kind`'s shipped weights in the trained preset folder `trained`
    (<preset>/<DraftSpec.weights>/), None for a random preset (`trained` None). A trained
    preset that ships no such draft is one clear error."""
    if trained is None:
        return None
    d = trained / DRAFT_KINDS[kind].weights
    if not (d / "model.safetensors").is_file():
        shipped = [k for k, s in DRAFT_KINDS.items()
                   if (trained / s.weights / "model.safetensors").is_file()]
        raise ValueError(f"the trained preset in {trained} ships no {kind!r} draft ({d} has no "
                         f"model.safetensors); pick a draft it ships ({shipped}) or train one "
                         "(python -m mtplab.models.train)")
    return d


def check_draft_shipped(name: str, kind: str) -> None:
    """Model `name` can run draft `kind`: a random preset builds any, a trained preset only
    the kinds it ships (RunConfig checks this before an engine is built)."""
    shipped_draft(_trained_dir(name), kind)


def trained_draft_dir(target: LlamaForCausalLM, kind: str) -> Path | None:
    """The shipped weights of draft `kind` when the target was built from a trained preset
    (its `trained_dir` mark), else None (random init): `shipped_draft`."""
    return shipped_draft(getattr(target, "trained_dir", None), kind)


def build_draft(target: LlamaForCausalLM, make: Callable[[], torch.nn.Module], seed: int,
                trained: Path | None = None) -> torch.nn.Module:
    """One draft model for `target` (a draft kind's `build`): with `trained` (a directory from
    `trained_draft_dir`), make() loaded with its weights, CPU float32; else seeded random init,
    built the way the target was (its `init_device` mark: on that device in the target's
    dtype, else on the CPU in float32)."""
    if trained is not None:
        model = make()
        sd = load_file(str(trained / "model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in sd.items()})
        return model.eval()
    dev = getattr(target, "init_device", None)
    model = make() if dev is None else _empty_on(make, dev, target.lm_head.weight.dtype)
    if dev is not None and hasattr(model, "tie_weights"):   # to_empty untied its tied head
        model.tie_weights()
    init_random(model, seed)
    return model.eval()
