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
