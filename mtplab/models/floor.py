"""The HBM floor of a decode step: the bytes one step must read, counted in one place.

`step_bytes` is the only function that counts them; `mtplab bench` (through the sweep's
`weight_bytes_per_step` / `kv_bytes_per_step` columns), the sweep rows (sweep/measure.py) and
the decode-floor runners (studies/decode_floor, studies/long_context) all read it. floor =
bytes / the device copy bandwidth measured in the same process.

One decode iteration over bs requests at committed context c (D = tree nodes, 1 without a
draft; S = draft forwards per iteration; per-token-layer KV = Hkv x d x 2 (K and V) x dtype):

    target weights   every layer + final norm + LM head, once (one GEMM over the bs*D tokens),
                     plus bs*D rows of the input embedding: an untied embedding table is not
                     read whole (a tied one is, as the LM head); an MoE layer reads its router
                     and shared expert and only the routed experts the bs*D tokens touch
                     (measured, else E(1 - (1 - k/E)^(bs*D)) for uniform routing)
    target KV        per layer l: bs x (min(c, window_l) + D) entries   (window_l = inf for
                     full attention; a sliding layer reads at most its window)
    draft weights    S x (the draft's own parameters + the LM-head rows it reads: the target's
                     head, or a kind's own; all V rows, or those of its draft_vocab)
                     + S x bs*K embedding rows
    draft KV         a draft reading the target's KV (frozen_kv_mtp; owns_kv False in
                     draft_kinds.py): S x per assistant layer a, bs x min(c, window of the
                     target layer it reads, draft_kv_window) -- one read per request for all
                     K branches
                     a draft owning KV (eagle): S x bs x min(c, window of the last layer) of
                     its one-layer pool
The bytes are counted once per step whatever the kernels do: a kernel that reads a KV page
twice (or a GEMM that re-reads a weight tile) is slower than the floor, not a larger floor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..draft_kinds import draft_kind
from ..health import expected_experts as uniform_experts
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


def expected_experts(c: LlamaConfig, tokens: float) -> float:
    """Distinct experts `tokens` tokens touch in one MoE layer of `c` if each picks its top-k
    uniformly at random (health.expected_experts)."""
    return uniform_experts(c.num_experts, c.num_experts_per_tok, tokens)


def layer_weight_params(c: LlamaConfig, experts: Optional[float] = None,
                        layer: int = 0) -> float:
    """Parameters decoder layer `layer` reads: q/k/v/o (at its head_dim and KV heads), two
    norms and the FFN (gate/up/down); an MoE layer's router, shared expert and gate, and
    `experts` of its routed experts (all of them when None)."""
    nkv, d = c.attn_shape(layer)
    H, q, kv = c.hidden_size, c.num_attention_heads * d, nkv * d
    attn = H * q * 2 + H * kv * 2 + 2 * H
    if not c.is_moe:
        return attn + 3 * H * c.intermediate_size
    Is, E = c.shared_expert_intermediate_size, c.num_experts
    router = H * E + (E if c.moe_router_bias else 0)
    shared = 3 * H * Is + H if Is else 0
    used = E if experts is None else experts
    return attn + router + shared + used * 3 * H * c.moe_intermediate_size


def kv_entry_bytes(c: LlamaConfig, dtype_bytes: int, layer: int = 0) -> int:
    """Bytes of one KV entry of layer `layer` (K and V, every KV head, at its head_dim)."""
    nkv, d = c.attn_shape(layer)
    return nkv * d * 2 * dtype_bytes


def visible_entries(c: LlamaConfig, layer: int, context: float) -> float:
    """KV entries of the committed context a query of `layer` reads: its window at most."""
    w = c.window_of(layer)
    return min(context, w) if w else context


def step_bytes(c: LlamaConfig, *, dtype_bytes: int, bs: int, context: float,
               draft: str = "none", num_steps: int = 0, topk: int = 1,
               num_draft_tokens: int = 1, draft_param_bytes: int = 0,
               draft_kv_layers: Sequence[int] = (),
               experts_touched: Optional[float] = None,
               draft_head_bytes: Optional[int] = None,
               draft_kv_window: int = 0) -> StepBytes:
    """Bytes one decode iteration of `bs` requests at committed context `context` reads.

    draft_param_bytes: the draft's own parameters in bytes (not the target's embedding and
    LM head it shares); draft_kv_layers: the target layers a draft without KV of its own reads;
    experts_touched: for an MoE target, the distinct experts per layer its forward over the
    bs*D tokens touched (measured; None: `expected_experts` under uniform routing);
    draft_head_bytes: the LM-head rows one draft forward reads (None: the target's whole LM
    head; a hot or centroid vocabulary reads fewer, a kind with its own head reads its own);
    draft_kv_window: the last entries of the target's KV a draft reading it attends (0: all
    its layer reads; RunConfig.draft_kv_window).
    """
    spec = draft != "none"
    D = num_draft_tokens if spec else 1
    H, V = c.hidden_size, c.vocab_size
    row = H * dtype_bytes
    lm_head = V * row
    if c.is_moe and experts_touched is None:
        experts_touched = expected_experts(c, bs * D)
    weights = (sum(layer_weight_params(c, experts_touched, li)
                   for li in range(c.num_hidden_layers)) + H) * dtype_bytes + lm_head
    weights += bs * D * row                                  # input-embedding rows
    entry = [kv_entry_bytes(c, dtype_bytes, li) for li in range(c.num_hidden_layers)]
    kv = sum(bs * (visible_entries(c, li, context) + D) * entry[li]
             for li in range(c.num_hidden_layers))
    if not spec:
        return StepBytes(int(weights), int(kv))
    S = num_steps
    head = lm_head if draft_head_bytes is None else draft_head_bytes
    d_weights = S * (draft_param_bytes + head + bs * topk * row)
    if draft_kind(draft).owns_kv:       # its own one-layer pool, the target's last layer's shape
        d_kv = S * bs * visible_entries(c, c.num_hidden_layers - 1, context) * entry[-1]
    else:                               # the target layers it reads
        seen = min(context, draft_kv_window) if draft_kv_window else context
        d_kv = S * sum(bs * visible_entries(c, li, seen) * entry[li]
                       for li in draft_kv_layers)
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


def engine_step_bytes(eng, bs: int, context: float,
                      experts_touched: Optional[float] = None) -> StepBytes:
    """`step_bytes` of a built engine: its target's config and dtype, its draft's own
    parameters (trained drafts may differ from the preset shapes), the draft head's rows
    read, run settings, and for an MoE target the experts touched (None: uniform routing's
    expectation)."""
    cfg = eng.cfg
    dtype_bytes = eng.model.lm_head.weight.element_size()
    draft_model = eng.draft_model
    kv_layers = getattr(getattr(draft_model, "acfg", None), "kv_layers", ())
    params, head = 0, None
    if draft_model is not None:
        params, head = draft_head_split(draft_model, eng.model.config.vocab_size)
    return step_bytes(
        eng.model.config, dtype_bytes=dtype_bytes, bs=bs, context=context, draft=cfg.draft,
        num_steps=cfg.num_steps, topk=cfg.topk, num_draft_tokens=cfg.num_draft_tokens,
        draft_param_bytes=params, draft_kv_layers=kv_layers, draft_head_bytes=head,
        experts_touched=experts_touched, draft_kv_window=cfg.draft_kv_window)


def draft_head_split(draft_model, vocab_size: int) -> tuple[int, int]:
    """(bytes of the draft's own parameters without a head of its own, bytes of the head
    rows one draft forward reads: models/drafts.py DraftHead, its draft_vocab)."""
    w = draft_model.head_weight
    vh = draft_model.vocab_head
    rows = vocab_size if vh is None else vh.rows_read(vocab_size)
    own = any(p is w for p in draft_model.parameters())
    params = module_bytes(draft_model) - (w.untyped_storage().nbytes() if own else 0)
    return params, rows * w.shape[1] * w.element_size()
