"""The HBM floor of a decode step: the bytes one step must read, counted in one place.

`step_bytes` is the only function that counts them; `mtplab bench` (through the sweep's
`weight_bytes_per_step` / `kv_bytes_per_step` columns), the sweep rows
(sweep/measure.py) and benchmarks/bench_kernels.py all read it. floor = bytes / the device
copy bandwidth measured in the same process.

One decode iteration over bs requests at committed context c (D = tree nodes, 1 without a
draft; S = draft forwards per iteration; per-token-layer KV = Hkv x d x 2 (K and V) x dtype):

    target weights   every layer + final norm + LM head, once (one GEMM over the bs*D tokens),
                     plus bs*D rows of the input embedding: an untied embedding table is not
                     read whole (a tied one is, as the LM head)
    target KV        per layer l: bs x (min(c, window_l) + D) entries   (window_l = inf for
                     full attention; a sliding layer reads at most its window)
    draft weights    S x (the draft's own parameters + the target's LM head it shares)
                     + S x bs*K embedding rows
    draft KV         a draft reading the target's KV (frozen_kv_mtp; owns_kv False in
                     draft_kinds.py): S x per assistant layer a, bs x min(c, window of the
                     target layer it reads) -- one read per request for all K branches
                     a draft owning KV (eagle): S x bs x min(c, window of the last layer) of
                     its one-layer pool
The bytes are counted once per step whatever the kernels do: a kernel that reads a KV page
twice (or a GEMM that re-reads a weight tile) is slower than the floor, not a larger floor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..draft_kinds import draft_kind
from .llama_config import LlamaConfig


@dataclass(frozen=True)
class StepBytes:
    """Bytes one decode iteration reads (see the module doc), by where they come from."""
    target_weights: int
    target_kv: int
    draft_weights: int = 0
    draft_kv: int = 0

    @property
    def weights(self) -> int:
        return self.target_weights + self.draft_weights

    @property
    def kv(self) -> int:
        return self.target_kv + self.draft_kv

    @property
    def total(self) -> int:
        return self.weights + self.kv


def layer_weight_params(c: LlamaConfig) -> int:
    """Parameters of one decoder layer (q/k/v/o, gate/up/down, two norms)."""
    H, q, kv = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return H * q * 2 + H * kv * 2 + 3 * H * c.intermediate_size + 2 * H


def kv_entry_bytes(c: LlamaConfig, dtype_bytes: int) -> int:
    """Bytes of one KV entry of one layer (K and V, every KV head)."""
    return c.num_key_value_heads * c.head_dim * 2 * dtype_bytes


def visible_entries(c: LlamaConfig, layer: int, context: float) -> float:
    """KV entries of the committed context a query of `layer` reads: its window at most."""
    w = c.window_of(layer)
    return min(context, w) if w else context


def step_bytes(c: LlamaConfig, *, dtype_bytes: int, bs: int, context: float,
               draft: str = "none", num_steps: int = 0, topk: int = 1,
               num_draft_tokens: int = 1, draft_param_bytes: int = 0,
               draft_kv_layers: Sequence[int] = ()) -> StepBytes:
    """Bytes one decode iteration of `bs` requests at committed context `context` reads.

    draft_param_bytes: the draft's own parameters in bytes (not the target's embedding and
    LM head it shares); draft_kv_layers: the target layers a draft without KV of its own reads.
    """
    spec = draft != "none"
    D = num_draft_tokens if spec else 1
    H, V = c.hidden_size, c.vocab_size
    row = H * dtype_bytes
    lm_head = V * row
    weights = (c.num_hidden_layers * layer_weight_params(c) + H) * dtype_bytes + lm_head
    weights += bs * D * row                                  # input-embedding rows
    entry = kv_entry_bytes(c, dtype_bytes)
    kv = sum(bs * (visible_entries(c, li, context) + D) * entry
             for li in range(c.num_hidden_layers))
    if not spec:
        return StepBytes(int(weights), int(kv))
    S = num_steps
    d_weights = S * (draft_param_bytes + lm_head + bs * topk * row)
    if draft_kind(draft).owns_kv:       # its own one-layer pool, the target's last layer's shape
        d_kv = S * bs * visible_entries(c, c.num_hidden_layers - 1, context) * entry
    else:                               # the target layers it reads
        d_kv = S * sum(bs * visible_entries(c, li, context) * entry for li in draft_kv_layers)
    return StepBytes(int(weights), int(kv), int(d_weights), int(d_kv))


def module_bytes(module) -> int:
    """Bytes of a module's parameters, each storage once (a tied weight counts once)."""
    seen, n = set(), 0
    for p in module.parameters():
        key = p.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            n += p.untyped_storage().nbytes()
    return n


def engine_step_bytes(eng, bs: int, context: float) -> StepBytes:
    """`step_bytes` of a built engine: its target's config and dtype, its draft's own
    parameters (trained drafts may differ from the preset shapes) and run settings."""
    cfg = eng.cfg
    dtype_bytes = eng.model.lm_head.weight.element_size()
    draft_model = eng.draft_model
    kv_layers = getattr(getattr(draft_model, "acfg", None), "kv_layers", ())
    return step_bytes(
        eng.model.config, dtype_bytes=dtype_bytes, bs=bs, context=context, draft=cfg.draft,
        num_steps=cfg.num_steps, topk=cfg.topk, num_draft_tokens=cfg.num_draft_tokens,
        draft_param_bytes=module_bytes(draft_model) if draft_model is not None else 0,
        draft_kv_layers=kv_layers)
