"""Weight I/O: Hugging Face layout (config.json + model.safetensors), written atomically."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path, atomic_write_text
from ..errors import ModelLoadError
from .llama import LlamaForCausalLM
from .llama_config import LlamaConfig


def save_model(model: LlamaForCausalLM, directory: str | Path, dtype: torch.dtype | None = None):
    """Write `config.json` and `model.safetensors` (tied lm_head stored once, as HF does)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype or v.dtype).contiguous()
          for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    cfg = model.config.to_hf_dict()
    cfg["torch_dtype"] = str(next(iter(sd.values())).dtype).removeprefix("torch.")
    with atomic_path(out / "model.safetensors") as tmp:
        save_file(sd, str(tmp), metadata={"format": "pt"})
    atomic_write_text(out / "config.json", json.dumps(cfg, indent=2, sort_keys=True))


def load_model(directory: str | Path) -> LlamaForCausalLM:
    """Load an HF Llama-format directory (config.json + *.safetensors) on CPU in float32.
    A corrupt or mismatched folder raises ModelLoadError "<path>: <problem>; <fix>" (one
    line): config.json (LlamaConfig.load), unreadable/empty/truncated weight files, missing
    or unexpected tensors, shapes the config does not imply, non-float or NaN/Inf weights."""
    d = Path(directory)
    cfg = LlamaConfig.load(d)
    sd, where = read_checkpoint(d)
    check_checkpoint(cfg, sd, where, d)
    model = LlamaForCausalLM(cfg)
    if cfg.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in sd.items() if not k.endswith("rotary_emb.inv_freq")},
        strict=False)
    missing = [m for m in missing if not m.endswith(("rope.cos", "rope.sin"))]
    if missing or unexpected:   # the checkpoint matched its config: the module disagrees
        raise RuntimeError(f"LlamaForCausalLM does not take the HF names hf_tensor_shapes "
                           f"lists (missing {missing[:4]}, unexpected {unexpected[:4]}).")
    return model


def read_checkpoint(d: Path) -> tuple[dict[str, torch.Tensor], dict[str, Path]]:
    """Every tensor of d/*.safetensors -> ({HF name: tensor}, {HF name: its file})."""
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{d}: no *.safetensors weights file; save the weights next to "
                             "config.json (e.g. Engine.save_target or save_model).")
    index = d / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelLoadError(f"{index}: not a safetensors index ({e!r}); fix or remove "
                                 "it.") from None
        absent = sorted(s for s in shards if not (d / s).is_file())
        if absent:
            raise ModelLoadError(f"{index}: shard {absent[0]} is missing (+{len(absent) - 1} "
                                 "more); copy every shard into the directory.")
    sd, where = {}, {}
    for f in files:
        if f.stat().st_size == 0:
            raise ModelLoadError(f"{f}: empty file; the weights were not written (save the "
                                 "model again).")
        try:
            tensors = load_file(str(f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise ModelLoadError(f"{f}: not a readable safetensors file ({e}); the file is "
                                 "truncated or corrupt, save or copy it again.") from None
        for k, v in tensors.items():
            if k in sd:
                raise ModelLoadError(f"{f}: tensor {k} is also in {where[k].name}; keep one "
                                     "copy of each tensor.")
            sd[k], where[k] = v, f
    return sd, where


def check_checkpoint(cfg: LlamaConfig, sd: dict[str, torch.Tensor], where: dict[str, Path],
                     d: Path) -> None:
    """The checkpoint's tensors by HF name against the shapes config.json implies (not the
    live modules' parameters: how those are stored is the model's business)."""
    want = cfg.hf_tensor_shapes()
    optional = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    names = {k for k in sd if not k.endswith("rotary_emb.inv_freq")}   # HF's rope buffers
    missing = sorted(set(want) - names - optional, key=_layer_order)
    if missing:
        raise ModelLoadError(
            f"{d}: weights missing for {missing[0]}{_more(missing)} (config.json has "
            f"num_hidden_layers={cfg.num_hidden_layers}); the weights are incomplete or belong "
            "to another config.json.")
    extra = sorted(names - set(want), key=_layer_order)
    if extra:
        raise ModelLoadError(
            f"{where[extra[0]]}: unexpected tensor {extra[0]}{_more(extra)} for a Llama with "
            f"this config.json (num_hidden_layers={cfg.num_hidden_layers}); the weights belong "
            "to another model.")
    for k in sorted(names, key=_layer_order):
        t = sd[k]
        if tuple(t.shape) != want[k]:
            raise ModelLoadError(
                f"{where[k]}: {k} has shape {list(t.shape)} but config.json implies "
                f"{list(want[k])}; the weights and config.json do not belong together.")
        if not t.is_floating_point():
            raise ModelLoadError(f"{where[k]}: {k} has dtype {t.dtype}; weights must be "
                                 "floating point (save them again).")
        bad = int((~torch.isfinite(t)).sum())
        if bad:
            raise ModelLoadError(f"{where[k]}: {k} holds {bad} NaN/Inf values; the checkpoint "
                                 "is corrupt (re-train or re-export it).")


def _layer_order(name: str):
    """model.layers.10.x after model.layers.2.x (messages name the first in model order)."""
    return [int(p) if p.isdigit() else p for p in name.split(".")]


def _more(items: list) -> str:
    return f" (+{len(items) - 1} more)" if len(items) > 1 else ""
