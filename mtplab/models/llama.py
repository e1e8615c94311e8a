"""Llama-style decoder (RMSNorm, RoPE, SwiGLU, GQA, optional sliding-window layers) over paged KV;
with experts in the config each layer's FFN is a mixture of experts (models/moe.py).

Parameter names follow Hugging Face `LlamaForCausalLM` (model.embed_tokens, model.layers.i.
self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm,
model.norm, lm_head), so state dicts load both ways.

One forward over T packed tokens:
    x = embed(ids) ; per layer: x += o(attn(rope(q), rope(k)->cache[out_loc], v->cache[out_loc]))
                                x += down(silu(gate(h)) * up(h))
    hidden = x (pre final norm: what drafts consume), logits = lm_head(norm(hidden[logits_idx]))

Two paths compute that same function (`set_fused`):
    unfused  the formula above op by op (the reference path; training uses it)
    fused    q/k/v and gate/up as one GEMM each over concatenated weights; the residual add
             folded into the next RMSNorm; RoPE + KV write in one op; SiLU * up in one op
             (kernels/fused_ops.py: Triton on CUDA, the torch references elsewhere):

        (res, delta) -> h, res = add_rmsnorm(res, delta)        delta = None before layer 0
                        q = rope_qkv_cache(h @ Wqkv^T)  -> k, v into the cache at out_loc
                            (one kernel at decode rows where the GEMM plan chose it:
                             kernels/qkv_rope.py)
                        h, res = add_rmsnorm(res, o_proj(attn(q)))
                        delta = down(silu_mul(h @ Wgu^T))
                            (an MoE FFN's grouped kernels: delta = its expert rows, summed
                             inside the next add_rmsnorm: models/moe.py)
        hidden, h = add_rmsnorm(res, delta, final norm)  ; logits = lm_head(h[logits_idx])

Concatenated weights keep the Hugging Face names: each of q/k/v_proj.weight (gate/up_proj)
is a row-slice view of the one fused tensor (`fuse_linears`, models/mlp.py), so
named_parameters, state_dict, load_state_dict (in-place copies) and save_target are unchanged,
and no weight is stored twice.
Moving or casting the model (`.to`) re-makes the views (`_apply`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..kernels.attn_meta import AttnMeta
from ..kernels.fused_ops import add_rmsnorm, apply_rope
from ..kernels.qkv_rope import RopeShape, qkv_rope
from .linear import GemmSites, Linear
from .llama_config import LlamaConfig
from .mlp import MLP, fuse_linears
from .moe import MoEFFN

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


def rope_inv_freq(head_dim: int, theta: float, scaling: Optional[dict] = None) -> torch.Tensor:
    """Rotary frequencies [head_dim / 2]: theta^(-2i/d), rescaled by `scaling` (a config's
    rope_scaling, normalised by LlamaConfig):

        linear  every frequency / factor
        llama3  (Llama 3.1) by wavelength w = 2 pi / f, with L = original_max_position_embeddings:
                w < L / high_freq_factor            f             (high frequencies kept)
                w > L / low_freq_factor             f / factor    (low frequencies stretched)
                between                             (1 - a) f / factor + a f,
                                                    a = (L / w - low) / (high - low)
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = (scaling or {}).get("rope_type", "default")
    if kind == "linear":
        inv = inv / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = (scaling[k] for k in ("factor", "low_freq_factor",
                                                  "high_freq_factor"))
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        a = ((old / wavelen - low) / (high - low)).clamp(0.0, 1.0)
        inv = torch.where(wavelen < old / high, inv,
                          torch.where(wavelen > old / low, inv / factor,
                                      (1 - a) * inv / factor + a * inv))
    return inv


class Rope(nn.Module):
    """Rotary embedding with a precomputed cos/sin table indexed by position (graph friendly)."""

    def __init__(self, head_dim: int, theta: float, max_pos: int,
                 scaling: Optional[dict] = None):
        super().__init__()
        inv = rope_inv_freq(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], -1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, self.cos, self.sin, positions)


@dataclass
class KVView:
    """Where a layer reads and writes KV: caches [N, Hkv, d] and the slots to write (None =
    read-only, e.g. a Frozen-KV draft step)."""
    k: torch.Tensor
    v: torch.Tensor
    out_loc: Optional[torch.Tensor]


class Attention(GemmSites, nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int = 0):
        """The shapes of target layer `layer` (a Gemma-4 global layer has its own KV heads
        and head_dim: LlamaConfig.attn_shape)."""
        super().__init__()
        H = cfg.hidden_size
        nkv, d = cfg.attn_shape(layer)
        self.nq, self.nkv, self.d = cfg.num_attention_heads, nkv, d
        self.q_proj = Linear(H, self.nq * d, bias=False)
        self.k_proj = Linear(H, self.nkv * d, bias=False)
        self.v_proj = Linear(H, self.nkv * d, bias=False)
        self.o_proj = Linear(self.nq * d, H, bias=False)
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

    def fuse(self) -> None:
        self.qkv_weight = fuse_linears(getattr(self, "qkv_weight", None), self.q_proj,
                                       self.k_proj, self.v_proj)

    def gemm_sites(self) -> dict[str, torch.Tensor]:
        w = getattr(self, "qkv_weight", None)
        return {} if w is None else {"qkv": w}

    def site_rope(self, site: str) -> Optional[RopeShape]:
        return RopeShape(self.nq, self.nkv, self.d) if site == "qkv" else None

    def forward_fused(self, h, positions, rope: Rope, kv: KVView, meta: AttnMeta, window: int,
                      attn_fn: AttnFn) -> torch.Tensor:
        T = h.shape[0]
        q = qkv_rope(h, self.qkv_weight, self.gemv.get("qkv"), positions, rope.cos, rope.sin,
                     self.nq, self.nkv, kv.k, kv.v, kv.out_loc)
        o = attn_fn(q, kv.k, kv.v, meta, self.scale, window)
        return self.o_proj(o.reshape(T, self.nq * self.d))


class Block(nn.Module):
    """Pre-norm residual block: `self_attn`, `mlp` and two RMSNorms (set by subclasses)."""

    def forward(self, x, positions, rope, kv, meta, window, attn_fn):
        x = x + self.self_attn(self.input_layernorm(x), positions, rope, kv, meta, window, attn_fn)
        return x + self.mlp(self.post_attention_layernorm(x))

    def fuse(self) -> None:
        self.self_attn.fuse()
        self.mlp.fuse()

    def forward_fused(self, res, delta, positions, rope, kv, meta, window, attn_fn,
                      defer: bool = False):
        """(residual stream, the last block's output not yet added (None before the first))
        -> (residual stream, this block's MLP output not yet added). `defer`: an MoE FFN's
        output may come back as a PendingCombine, which only `add_rmsnorm` consumes."""
        eps = self.input_layernorm.eps
        h, res = add_rmsnorm(res, delta, self.input_layernorm.weight, eps)
        a = self.self_attn.forward_fused(h, positions, rope, kv, meta, window, attn_fn)
        h, res = add_rmsnorm(res, a, self.post_attention_layernorm.weight, eps)
        return res, self.mlp.forward_fused(h, defer)


class DecoderLayer(Block):
    def __init__(self, cfg: LlamaConfig, dense: bool = False, layer: int = 0):
        """Target layer `layer`'s attention shapes; the FFN is a mixture of experts when the
        config has experts (models/moe.py), unless `dense` (an EAGLE draft's layer): then
        SwiGLU of intermediate_size."""
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        if cfg.is_moe and not dense:
            self.mlp = MoEFFN(cfg)
        else:
            self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class FusableModel(nn.Module):
    """A model whose forward has a fused path: `set_fused(True)` concatenates the weights of
    every Block (views, see the module doc) and selects it; `.to()` keeps the views."""
    fused = False

    def blocks(self) -> list:
        return [m for m in self.modules() if isinstance(m, Block)]

    def set_fused(self, on: bool) -> "FusableModel":
        self.fused = bool(on)
        if self.fused:
            for b in self.blocks():
                b.fuse()
        return self

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        if self.fused:                  # the conversion made each weight its own tensor
            for b in self.blocks():
                b.fuse()
        return out


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, layer=i)
                                    for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(FusableModel):
    expert_recorder = None      # an MoE target's ExpertRecorder (moe.attach_recorder), if any

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.make_ropes()

    def make_ropes(self, device=None) -> None:
        """The RoPE tables: `rope` at head_dim, and `rope_global` when global layers have their
        own head_dim (buffers, computed as on the CPU, then moved to `device`)."""
        cfg = self.config
        dims = {cfg.attn_shape(i)[1] for i in range(cfg.num_hidden_layers)} - {cfg.head_dim}
        make = lambda d: Rope(d, cfg.rope_theta, cfg.max_position_embeddings,   # noqa: E731
                              cfg.rope_scaling).to(device)
        self.rope = make(cfg.head_dim)
        self.rope_global = make(dims.pop()) if dims else None

    def rope_of(self, layer: int) -> Rope:
        """The RoPE table of a layer's head_dim."""
        d = self.config.attn_shape(layer)[1]
        return self.rope if d == self.config.head_dim else self.rope_global

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_k: torch.Tensor,
                kv_v: torch.Tensor, out_loc: torch.Tensor, meta: AttnMeta, attn_fn: AttnFn,
                logits_idx: Optional[torch.Tensor] = None):
        """input_ids/positions/out_loc [T]; kv_k/kv_v [L, N, Hkv, d]. Returns (hidden [T,H]
        before the final norm, logits [len(logits_idx) or T, V] in float32)."""
        if self.fused:
            return self._forward_fused(input_ids, positions, kv_k, kv_v, out_loc, meta, attn_fn,
                                       logits_idx)
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, positions, self.rope_of(i), KVView(kv_k[i], kv_v[i], out_loc), meta,
                      self.config.window_of(i), attn_fn)
        h = x if logits_idx is None else x[logits_idx]
        return x, self.logits(h)

    def _forward_fused(self, input_ids, positions, kv_k, kv_v, out_loc, meta, attn_fn,
                       logits_idx):
        res, delta = self.model.embed_tokens(input_ids), None
        for i, layer in enumerate(self.model.layers):
            res, delta = layer.forward_fused(res, delta, positions, self.rope_of(i),
                                             KVView(kv_k[i], kv_v[i], out_loc), meta,
                                             self.config.window_of(i), attn_fn, defer=True)
        normed, hidden = add_rmsnorm(res, delta, self.model.norm.weight, self.model.norm.eps)
        h = normed if logits_idx is None else normed[logits_idx]
        return hidden, self.lm_head(h).float()

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.model.norm(hidden)).float()
