"""Weight I/O: Hugging Face layout (config.json + model.safetensors), written atomically."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..atomic import atomic_path, atomic_write_text
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
    """Load an HF Llama-format directory (config.json + *.safetensors) on CPU in float32."""
    d = Path(directory)
    if not (d / "config.json").is_file():
        raise FileNotFoundError(f"{d} has no config.json; a model directory needs config.json "
                                "and model.safetensors (Hugging Face Llama layout).")
    cfg = LlamaConfig.load(d)
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{d} has no *.safetensors weights file.")
    sd = {}
    for f in files:
        sd.update(load_file(str(f)))
    model = LlamaForCausalLM(cfg)
    if cfg.tie_word_embeddings:
        sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()},
                                                strict=False)
    missing = [m for m in missing if not m.endswith(("rope.cos", "rope.sin"))]
    if missing or unexpected:
        raise ValueError(f"{d}: weights do not match the config (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}).")
    return model
