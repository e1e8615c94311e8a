"""Dense, no-cache reference forward of a LlamaForCausalLM (the oracle for tests).

Runs the same parameters over one whole sequence with an explicit causal (+ sliding window)
mask and no KV cache or paging, so it shares no code path with the engine's attention.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .llama import LlamaForCausalLM


@torch.no_grad()
def dense_logits(model: LlamaForCausalLM, ids: list[int],
                 probe: Optional[Callable[[str, torch.Tensor], None]] = None) -> torch.Tensor:
    """Logits [L, V] (float32) for every position of `ids`. `probe(name, x)` sees the output
    of each part in forward order: model.embed_tokens, model.layers.<i>.self_attn and
    model.layers.<i>.mlp (the residual stream after each), lm_head (the logits)."""
    seen = probe or (lambda name, x: None)
    cfg = model.config
    dev = model.lm_head.weight.device
    L = len(ids)
    t = torch.tensor(ids, device=dev)
    pos = torch.arange(L, device=dev)
    x = model.model.embed_tokens(t)
    seen("model.embed_tokens", x)
    qi, kj = pos[:, None], pos[None, :]
    for li, layer in enumerate(model.model.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        rope = model.rope_of(li)
        q = rope(a.q_proj(h).view(L, a.nq, a.d), pos).transpose(0, 1).float()
        k = rope(a.k_proj(h).view(L, a.nkv, a.d), pos).transpose(0, 1).float()
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
        seen(f"model.layers.{li}.self_attn", x)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        seen(f"model.layers.{li}.mlp", x)
    logits = model.logits(x)
    seen("lm_head", logits)
    return logits


class _Found(Exception):
    pass


def first_nonfinite(model: LlamaForCausalLM, ids: list[int]) -> Optional[str]:
    """The first part (dense_logits' probe names) whose output over `ids` holds a NaN or an
    inf, or whose rows' mean square does (a residual stream the next RMSNorm would zero);
    None when the whole dense forward is finite."""
    def probe(name: str, x: torch.Tensor) -> None:
        x = x.float()
        if not (bool(torch.isfinite(x).all()) and bool(torch.isfinite(x.square().sum(-1)).all())):
            raise _Found(name)
    try:
        dense_logits(model, ids, probe)
    except _Found as found:
        return found.args[0]
    return None


@torch.no_grad()
def largest_weight(model: torch.nn.Module) -> tuple[str, float]:
    """(name, max |value|) of the parameter holding the largest magnitude; one holding a NaN
    comes first (its value: nan)."""
    def size(p: torch.Tensor) -> float:
        a = p.detach().float().abs()
        return math.nan if bool(torch.isnan(a).any()) else float(a.max())
    return max(((n, size(p)) for n, p in model.named_parameters()),
               key=lambda kv: (math.isnan(kv[1]), kv[1]))


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
