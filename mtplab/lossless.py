"""Leaf: how far a speculative run's output departs from a target-only run of the same workload.

Greedy speculative decoding is lossless when every request's tokens equal target-only's. That
holds token for token in fp32, and in bf16 only where the target's forward is batch-invariant
(RunConfig.deterministic=True; docs/deterministic.md). By default the one-token decode GEMMs
(M = batch) and the tree-verify GEMMs (M = batch x D) round differently, so bf16 outputs can
part near logit ties at batch sizes > 1: this module counts that instead of hiding it.
"""
from __future__ import annotations

from typing import Optional, Sequence


def first_divergence(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """Index of the first token where a and b differ (a length difference counts at the
    shorter length); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence(spec_outputs: Sequence[Sequence[int]],
               target_outputs: Sequence[Sequence[int]]) -> tuple[int, list[Optional[int]]]:
    """-> (number of requests whose outputs differ, first divergence index per request, None
    for an equal one). Both lists hold the same requests in the same order."""
    if len(spec_outputs) != len(target_outputs):
        raise ValueError(f"divergence: {len(spec_outputs)} spec outputs vs "
                         f"{len(target_outputs)} target-only outputs; pass the same requests.")
    firsts = [first_divergence(s, t) for s, t in zip(spec_outputs, target_outputs)]
    return sum(f is not None for f in firsts), firsts
