"""Draft models that ride on a target: the Frozen-KV MTP assistant and the EAGLE-style draft.

Frozen-KV MTP assistant (owns no KV):
    x   = pre_projection( embed(token) * sqrt(H) ⊕ hidden )          [2H -> Ha]
    x   = layers(x) where layer i's attention has only a q projection and reads the target's
          cached K/V of `kv_layer[i]` (the target's last layer of the same type) over the
          committed prefix [0, seq_len), at the constant position seq_len - 1
    h'  = post_projection(x)                                          [Ha -> H]  (recurrent)
    logits = target.lm_head(norm(h'))                                 (shared LM head)
Every draft scores through `DraftHead.logits_of`: its head (the target's LM head, or a kind's
own) over the draft vocabulary (`draft_vocab`: full, a hot subset, centroid-masked).

EAGLE draft (owns a one-layer KV pool sharing slot ids with the target):
    x = fc( embed(token) ⊕ hidden ) ; x = decoder_layer(x) (writes its own KV) ; h' = x
    logits = target.lm_head(norm(h'))

Both have the target's fused path (`set_fused`, models/llama.py): their blocks run
`Block.forward_fused` (the assistant's q-only attention rotates q and writes no KV).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from ..kernels.attn_meta import AttnMeta
from ..kernels.fused_ops import add_rmsnorm, rope_qkv_cache
from .llama import (AttnFn, Block, DecoderLayer, FusableModel, KVView, LlamaForCausalLM, RMSNorm,
                    Rope)
from .linear import GemmSites, Linear, linear
from .llama_config import LlamaConfig
from .mlp import MLP


@dataclass
class AssistantConfig:
    hidden_size: int            # Ha
    intermediate_size: int
    num_layers: int
    kv_layers: list             # target layer each assistant layer reads (same attention type)

    @classmethod
    def read(cls, directory: Path) -> "AssistantConfig":
        """The shapes a trained assistant ships: its directory's config.json (models/train.py
        writes it with a `format` key beside these fields)."""
        d = json.loads((Path(directory) / "config.json").read_text())
        return cls(**{f.name: d[f.name] for f in fields(cls)})


class FrozenAttention(nn.Module):
    """Attention with a q projection only: K/V come from the target's cache, read-only, at
    the head_dim of the target layer it reads (`kv_layer`)."""

    def __init__(self, Ha: int, tcfg: LlamaConfig, kv_layer: int = 0):
        super().__init__()
        self.nq, self.d = tcfg.num_attention_heads, tcfg.attn_shape(kv_layer)[1]
        self.q_proj = Linear(Ha, self.nq * self.d, bias=False)
        self.o_proj = Linear(self.nq * self.d, Ha, bias=False)
        self.scale = self.d ** -0.5

    def forward(self, x, positions, rope: Rope, kv: KVView, meta, window, attn_fn):
        T = x.shape[0]
        q = rope(self.q_proj(x).view(T, self.nq, self.d), positions)
        o = attn_fn(q, kv.k, kv.v, meta, self.scale, window)
        return self.o_proj(o.reshape(T, self.nq * self.d))

    def fuse(self) -> None:
        """Nothing to concatenate: the q projection is the only one."""

    def forward_fused(self, h, positions, rope: Rope, kv: KVView, meta, window, attn_fn):
        T = h.shape[0]
        q = rope_qkv_cache(self.q_proj(h), positions, rope.cos, rope.sin, self.nq, 0, None,
                           None, None)
        o = attn_fn(q, kv.k, kv.v, meta, self.scale, window)
        return self.o_proj(o.reshape(T, self.nq * self.d))


class FrozenLayer(Block):
    def __init__(self, Ha: int, I: int, tcfg: LlamaConfig, kv_layer: int = 0):
        super().__init__()
        self.self_attn = FrozenAttention(Ha, tcfg, kv_layer)
        self.mlp = MLP(Ha, I)
        self.input_layernorm = RMSNorm(Ha, tcfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(Ha, tcfg.rms_norm_eps)


def last_layer_of_type(tcfg: LlamaConfig, layer_type: str) -> int:
    idx = [i for i, t in enumerate(tcfg.layer_types) if t == layer_type]
    if not idx:
        raise ValueError(f"the target has no {layer_type} layer for the assistant to read.")
    return idx[-1]


class DraftHead(GemmSites, FusableModel):
    """A draft's LM head: `head_weight` (the target's LM head unless a kind has its own),
    scored over the draft vocabulary (`vocab_head`, models/draft_vocab.py; None: full).
    `vocab_ids` maps a reduced head's indices back to token ids (None: they are token ids)."""

    def __init__(self):
        super().__init__()
        self.vocab_head = None          # a submodule once set (set_draft_vocab)

    @property
    def head_weight(self) -> torch.Tensor:
        return self.target.lm_head.weight

    @property
    def vocab_ids(self):
        return None if self.vocab_head is None else self.vocab_head.vocab_ids

    def gemm_sites(self) -> dict[str, torch.Tensor]:
        return {"head": self.head_weight} if self.vocab_head is None else {}

    def logits_of(self, s: torch.Tensor) -> torch.Tensor:
        w = self.head_weight
        if self.vocab_head is None:
            return linear(s, w, self.gemv.get("head")).float()
        return self.vocab_head(s, w).float()


class FrozenKVAssistant(DraftHead):
    def __init__(self, acfg: AssistantConfig, target: LlamaForCausalLM):
        super().__init__()
        tcfg = target.config
        H, Ha = tcfg.hidden_size, acfg.hidden_size
        self.acfg, self.tcfg = acfg, tcfg
        self.pre_projection = Linear(2 * H, Ha, bias=False)
        self.layers = nn.ModuleList(FrozenLayer(Ha, acfg.intermediate_size, tcfg, li)
                                    for li in acfg.kv_layers)
        self.post_projection = Linear(Ha, H, bias=False)
        self.norm = RMSNorm(H, tcfg.rms_norm_eps)
        # Shared with the target (not registered as this module's parameters).
        self._target = [target]
        self.embed_scale = math.sqrt(H)
        self.kv_window = 0              # RunConfig.draft_kv_window (set_kv_window)

    def set_kv_window(self, n: int) -> "FrozenKVAssistant":
        """Attend only the last n entries of the target's KV (0: all its layer reads)."""
        self.kv_window = int(n)
        return self

    def window_of(self, li: int) -> int:
        """The window a query reads target layer li's KV through: the layer's own (0: none),
        at most kv_window."""
        w, cap = self.tcfg.window_of(li), self.kv_window
        return min(w, cap) if w and cap else w or cap

    @property
    def target(self) -> LlamaForCausalLM:
        return self._target[0]

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                kv_k: torch.Tensor, kv_v: torch.Tensor, meta: AttnMeta, attn_fn: AttnFn):
        """tokens [T], hidden [T, H], positions [T] (= seq_len - 1), target caches [L, N, ...].
        Returns (next hidden [T, H], logits [T, V] float32). Writes no KV."""
        t = self.target
        e = t.model.embed_tokens(tokens) * self.embed_scale
        x = self.pre_projection(torch.cat([e, hidden.to(e.dtype)], -1))
        if self.fused:
            delta = None
            for layer, li in zip(self.layers, self.acfg.kv_layers):
                x, delta = layer.forward_fused(x, delta, positions, t.rope_of(li),
                                               KVView(kv_k[li], kv_v[li], None), meta,
                                               self.window_of(li), attn_fn)
            return self.output_fused(x, delta)
        for layer, li in zip(self.layers, self.acfg.kv_layers):
            x = layer(x, positions, t.rope_of(li), KVView(kv_k[li], kv_v[li], None), meta,
                      self.window_of(li), attn_fn)
        return self.output(x)

    def output(self, x: torch.Tensor):
        """The last layer's residual stream [T, Ha] -> (recurrent hidden [T, H], logits):
        post-project, then the target's final-norm-like norm and shared LM head."""
        h = self.post_projection(x)
        return h, self.logits_of(self.norm(h))

    def output_fused(self, x: torch.Tensor, delta):
        """`output` of the fused path: x + delta (the last block's pending MLP output)."""
        h = self.post_projection(x if delta is None else x + delta)
        normed = add_rmsnorm(h, None, self.norm.weight, self.norm.eps)[0]
        return h, self.logits_of(normed)


class EagleDraft(DraftHead):
    def __init__(self, target: LlamaForCausalLM):
        super().__init__()
        tcfg = target.config
        H = tcfg.hidden_size
        self.fc = Linear(2 * H, H, bias=False)
        self.layer = DecoderLayer(tcfg, dense=True, layer=tcfg.num_hidden_layers - 1)
        self.norm = RMSNorm(H, tcfg.rms_norm_eps)
        self.window = tcfg.window_of(tcfg.num_hidden_layers - 1)
        self._target = [target]

    @property
    def target(self) -> LlamaForCausalLM:
        return self._target[0]

    @property
    def rope(self) -> Rope:
        """The RoPE table of the target's last layer, whose shapes the draft layer has."""
        return self.target.rope_of(self.target.config.num_hidden_layers - 1)

    def forward(self, tokens, hidden, positions, kv_k, kv_v, out_loc, meta, attn_fn,
                logits_idx=None):
        """Like a one-layer target forward; kv_k/kv_v are the draft pool [1, N, Hkv, d]."""
        t = self.target
        x = self.fc(torch.cat([t.model.embed_tokens(tokens), hidden.to(self.fc.weight.dtype)], -1))
        kv = KVView(kv_k[0], kv_v[0], out_loc)
        if self.fused:
            res, delta = self.layer.forward_fused(x, None, positions, self.rope, kv, meta,
                                                  self.window, attn_fn)
            normed, x = add_rmsnorm(res, delta, self.norm.weight, self.norm.eps)
            h = normed if logits_idx is None else normed[logits_idx]
            return x, self.logits_of(h)
        x = self.layer(x, positions, self.rope, kv, meta, self.window, attn_fn)
        h = x if logits_idx is None else x[logits_idx]
        return x, self.logits_of(self.norm(h))
