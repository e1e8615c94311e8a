"""Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA, optional sliding-window layers) over paged KV.

Parameter names follow Hugging Face `LlamaForCausalLM` (model.embed_tokens, model.layers.i.
self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm,
model.norm, lm_head), so state dicts load both ways.

One forward over T packed tokens:
    x = embed(ids) ; per layer: x += o(attn(rope(q), rope(k)->cache[out_loc], v->cache[out_loc]))
                                x += down(silu(gate(h)) * up(h))
    hidden = x (pre final norm: what drafts consume), logits = lm_head(norm(hidden[logits_idx]))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.attn_meta import AttnMeta
from .llama_config import LlamaConfig

AttnFn = Callable[..., torch.Tensor]   # (q, k_cache, v_cache, meta, sm_scale, window) -> out


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Rope(nn.Module):
    """Rotary embedding with a precomputed cos/sin table indexed by position (graph friendly)."""

    def __init__(self, head_dim: int, theta: float, max_pos: int):
        super().__init__()
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        cos = self.cos[positions][:, None, :]
        sin = self.sin[positions][:, None, :]
        xf = x.float()
        half = xf.shape[-1] // 2
        rot = torch.cat([-xf[..., half:], xf[..., :half]], -1)
        return (xf * cos + rot * sin).to(x.dtype)


@dataclass
class KVView:
    """Where a layer reads and writes KV: caches [N, Hkv, d] and the slots to write (None =
    read-only, e.g. a Frozen-KV draft step)."""
    k: torch.Tensor
    v: torch.Tensor
    out_loc: Optional[torch.Tensor]


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        H, d = cfg.hidden_size, cfg.head_dim
        self.nq, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(H, self.nq * d, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * d, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * d, bias=False)
        self.o_proj = nn.Linear(self.nq * d, H, bias=False)
        self.scale = d ** -0.5

    def forward(self, x, positions, rope: Rope, kv: KVView, meta: AttnMeta, window: int,
                attn_fn: AttnFn) -> torch.Tensor:
        T = x.shape[0]
        q = rope(self.q_proj(x).view(T, self.nq, self.d), positions)
        if kv.out_loc is not None:
            k = rope(self.k_proj(x).view(T, self.nkv, self.d), positions)
            v = self.v_proj(x).view(T, self.nkv, self.d)
            kv.k[kv.out_loc] = k.to(kv.k.dtype)
            kv.v[kv.out_loc] = v.to(kv.v.dtype)
        o = attn_fn(q, kv.k, kv.v, meta, self.scale, window)
        return self.o_proj(o.reshape(T, self.nq * self.d))


class MLP(nn.Module):
    def __init__(self, H: int, I: int):
        super().__init__()
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, positions, rope, kv, meta, window, attn_fn):
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv, meta, window, attn_fn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = Rope(cfg.head_dim, cfg.rope_theta, cfg.max_position_embeddings)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_k: torch.Tensor,
                kv_v: torch.Tensor, out_loc: torch.Tensor, meta: AttnMeta, attn_fn: AttnFn,
                logits_idx: Optional[torch.Tensor] = None):
        """input_ids/positions/out_loc [T]; kv_k/kv_v [L, N, Hkv, d]. Returns (hidden [T,H]
        before the final norm, logits [len(logits_idx) or T, V] in float32)."""
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions, self.rope, KVView(kv_k[i], kv_v[i], out_loc), meta,
                      self.config.window_of(i), attn_fn)
        h = x if logits_idx is None else x[logits_idx]
        return x, self.logits(h)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden)).float()
