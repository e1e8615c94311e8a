"""Shared test helpers (not a test module)."""
from __future__ import annotations

import random

from mtplab.models.reference import dense_greedy


def random_prompts(n: int, lens: list[int], vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(lens[i % len(lens)])] for i in range(n)]


def reference_outputs(model, prompts, max_new_tokens) -> list[list[int]]:
    """Target-only greedy by the dense no-cache oracle (ignore_eos semantics)."""
    return [dense_greedy(model, p, m) for p, m in zip(prompts, max_new_tokens)]


def assert_live_identity(engine) -> None:
    """len(prompt) + len(output_ids) == kv_committed_len + 1 for every live request."""
    for r in engine.scheduler.running:
        assert len(r.prompt_ids) + len(r.output_ids) == r.kv.kv_committed_len + 1, r.rid


def make_agreeable(engine, eps: float = 0.05) -> None:
    """Turn the engine's target into a near-bigram model (attention and MLP outputs scaled by
    `eps`) and its draft into the exact bigram lm_head(norm(embed(token))), so drafts agree
    with the target most of the time but not always. Same seed + same call = same weights."""
    import torch
    t = engine.model
    H = t.config.hidden_size
    with torch.no_grad():
        for layer in t.model.layers:
            layer.self_attn.o_proj.weight.mul_(eps)
            layer.mlp.down_proj.weight.mul_(eps)
        d = engine.draft_model
        if d is None:
            return
        eye = torch.eye(H, dtype=t.lm_head.weight.dtype, device=t.lm_head.weight.device)
        if hasattr(d, "pre_projection"):           # Frozen-KV assistant
            d.pre_projection.weight.zero_()
            d.pre_projection.weight[:, :H] = eye / d.embed_scale
            d.post_projection.weight.copy_(eye)
            layers = d.layers
        else:                                      # EAGLE draft
            d.fc.weight.zero_()
            d.fc.weight[:, :H] = eye
            layers = [d.layer]
        for layer in layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        d.norm.weight.copy_(t.model.norm.weight)
