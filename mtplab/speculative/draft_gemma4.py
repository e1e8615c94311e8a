"""The Gemma-4 MTP assistant as a draft kind (`draft="gemma4_assistant"`): a Frozen-KV draft
with Gemma-4's structure (vLLM `gemma4_mtp`, transformers' Gemma4AssistantForCausalLM, SGLang's
FROZEN_KV_MTP worker), run by the Frozen-KV worker (draft_frozen.py).

    x  = pre_projection( target_embed(token) * sqrt(H) ⊕ hidden )       [2H -> Ha]
    x  = 4 Q-only layers: layers 0-2 read the target's layer n-2, layer 3 reads layer n-1
         (on a Gemma target: three sliding layers on the last sliding layer, one global
         layer on the last global layer), each with that layer's window
    s  = norm(x)                                                        [Ha]
    h' = post_projection(s)                                             [Ha -> H] recurrent
    logits = lm_head(s), lm_head tied to the assistant's own embedding  [V, Ha]

Against the generic assistant (draft_frozen.py: one layer per attention type, the target's LM
head at width H on the post-projected state) it reads its own, narrower head: a draft step's
LM head costs V x Ha, not V x H. Width Ha = H / 2 and SwiGLU 4 Ha are this module's choice (the
published configs give the structure, not the 26B/31B widths); a trained preset ships its own
weights under <preset>/gemma4_assistant/, the shape presets are seeded random.

Adding this kind took this module and one row of draft_kinds.py.
"""
from __future__ import annotations


import torch
from torch import nn

from ..kernels.fused_ops import add_rmsnorm
from ..models.drafts import AssistantConfig, FrozenKVAssistant
from ..models.linear import Linear
from ..models.llama import RMSNorm
from ..models.llama_config import LlamaConfig
from ..models.zoo import build_draft, trained_draft_dir
from .draft_frozen import FrozenDraftWorker

LAYERS = 4          # layers 0..2 read the target's layer n-2, layer 3 reads n-1


def gemma4_config(tcfg: LlamaConfig) -> AssistantConfig:
    n = tcfg.num_hidden_layers
    if n < 2:
        raise ValueError(f"the Gemma-4 assistant reads the target's layers n-2 and n-1; the "
                         f"target has {n} layer(s).")
    Ha = max(tcfg.hidden_size // 2, tcfg.num_attention_heads)
    return AssistantConfig(hidden_size=Ha, intermediate_size=4 * Ha, num_layers=LAYERS,
                           kv_layers=[n - 2] * (LAYERS - 1) + [n - 1])


assistant_config = gemma4_config       # the kind's AssistantConfig (draft_kinds.py)


class Gemma4Assistant(FrozenKVAssistant):
    """The generic assistant's pre-projection and Q-only layers, with Gemma-4's output: the
    final norm at width Ha before the post-projection, and its own tied embedding / head."""

    def __init__(self, acfg: AssistantConfig, target):
        super().__init__(acfg, target)
        Ha, V = acfg.hidden_size, target.config.vocab_size
        self.norm = RMSNorm(Ha, target.config.rms_norm_eps)
        self.embed_tokens = nn.Embedding(V, Ha)
        self.lm_head = Linear(Ha, V, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.embed_tokens.weight

    @property
    def head_weight(self) -> torch.Tensor:
        return self.lm_head.weight

    def output(self, x: torch.Tensor):
        s = self.norm(x)
        return self.post_projection(s), self.logits_of(s)

    def output_fused(self, x: torch.Tensor, delta):
        s = add_rmsnorm(x, delta, self.norm.weight, self.norm.eps)[0]
        return self.post_projection(s), self.logits_of(s)


Worker = FrozenDraftWorker


def build(target, seed: int = 0) -> Gemma4Assistant:
    trained = trained_draft_dir(target, "gemma4_assistant")
    acfg = gemma4_config(target.config) if trained is None else AssistantConfig.read(trained)
    return build_draft(target, lambda: Gemma4Assistant(acfg, target), seed + 3, trained)


def param_count(tcfg: LlamaConfig) -> int:
    """pre_projection 2H x Ha, four Q-only layers (q and o: Ha x heads*d each, SwiGLU, two
    norms; q at the head_dim of the layer each reads), the norm, post_projection Ha x H, the
    tied embedding / head V x Ha."""
    a = gemma4_config(tcfg)
    H, Ha = tcfg.hidden_size, a.hidden_size
    layers = sum(2 * Ha * tcfg.num_attention_heads * tcfg.attn_shape(li)[1]
                 + 3 * Ha * a.intermediate_size + 2 * Ha for li in a.kv_layers)
    return 2 * H * Ha + layers + Ha + Ha * H + tcfg.vocab_size * Ha
