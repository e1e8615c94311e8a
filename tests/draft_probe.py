"""A draft kind that exists only for tests (tests/test_draft_kinds.py): a two-layer Frozen-KV
assistant whose layers both read the target's last layer. It is one module with the three
names a kind's module provides (draft_kinds.py); the test adds its row to the table."""
from __future__ import annotations

from mtplab.models.drafts import AssistantConfig, FrozenKVAssistant
from mtplab.models.zoo import build_draft
from mtplab.speculative.draft_frozen import FrozenDraftWorker

Worker = FrozenDraftWorker


def _make(target):
    c = target.config
    last = c.num_hidden_layers - 1
    return FrozenKVAssistant(AssistantConfig(c.hidden_size, c.hidden_size, 2, [last, last]),
                             target)


def build(target, seed: int = 0):
    return build_draft(target, lambda: _make(target), seed + 7)


def param_count(tcfg) -> int:
    H, q = tcfg.hidden_size, tcfg.num_attention_heads * tcfg.head_dim
    return 2 * H * H + 2 * (2 * H * q + 3 * H * H + 2 * H) + H * H + H
