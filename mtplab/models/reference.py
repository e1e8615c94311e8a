"""Dense, no-cache reference forward of a LlamaForCausalLM (the oracle for tests).

Runs the same parameters over one whole sequence with an explicit causal (+ sliding window)
mask and no KV cache or paging, so it shares no code path with the engine's attention.
"""
from __future__ import annotations

import torch

from .llama import LlamaForCausalLM


@torch.no_grad()
def dense_logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    """Logits [L, V] (float32) for every position of `ids`."""
    cfg = model.config
    dev = model.lm_head.weight.device
    L = len(ids)
    t = torch.tensor(ids, device=dev)
    pos = torch.arange(L, device=dev)
    x = model.model.embed_tokens(t)
    qi, kj = pos[:, None], pos[None, :]
    for li, layer in enumerate(model.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = model.rope(a.q_proj(h).view(L, a.nq, a.d), pos).transpose(0, 1).float()
        k = model.rope(a.k_proj(h).view(L, a.nkv, a.d), pos).transpose(0, 1).float()
        v = a.v_proj(h).view(L, a.nkv, a.d).transpose(0, 1).float()
        g = a.nq // a.nkv
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        allowed = kj <= qi
        w = cfg.window_of(li)
        if w:
            allowed &= (qi - kj) < w
        s = (q @ k.transpose(1, 2)) * a.scale
        s = s.masked_fill(~allowed, float("-inf"))
        o = (torch.softmax(s, -1) @ v).transpose(0, 1).reshape(L, a.nq * a.d).to(x.dtype)
        x = x + a.o_proj(o)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.logits(x)


@torch.no_grad()
def dense_greedy(model: LlamaForCausalLM, prompt: list[int], max_new_tokens: int,
                 stop_ids: tuple[int, ...] = ()) -> list[int]:
    """Greedy continuation by re-running the dense forward each step (slow, obviously right)."""
    ids, out = list(prompt), []
    for _ in range(max_new_tokens):
        tok = int(dense_logits(model, ids)[-1].argmax())
        out.append(tok)
        ids.append(tok)
        if tok in stop_ids:
            break
    return out
