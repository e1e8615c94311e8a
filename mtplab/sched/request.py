"""Requests: prompt, sampling, stop conditions, output, and their KV ownership.

Live-request identity (checked in tests): len(prompt_ids) + len(output_ids) ==
kv_committed_len + 1 -- every token but the last output has its KV written.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from ..mem.kv_manager import ReqKV


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0        # 0 = greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")


@dataclass
class Req:
    rid: int
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset = frozenset()
    output_ids: list[int] = field(default_factory=list)
    kv: Optional[ReqKV] = None
    finished_reason: Optional[str] = None     # "stop" | "length" | "abort"
    num_retractions: int = 0
    prefill_len: int = 0          # tokens fed by the last (re-)prefill: the host's length bound
    predrafted: bool = False      # the next round's draft already ran (zb_draft_preexec)
    arrivals: list = field(default_factory=list)   # (perf_counter s, tokens) per processed step

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None

    def fill_ids(self) -> list[int]:
        """What a (re-)prefill feeds: the prompt plus every output token so far."""
        return self.prompt_ids + self.output_ids

    def append_tokens(self, tokens: list[int]) -> int:
        """Append accepted tokens up to a stop or the length limit; returns how many were
        kept. Sets finished_reason. Called exactly once per step per request."""
        kept = 0
        n0 = len(self.output_ids)
        for t in tokens:
            self.output_ids.append(t)
            kept += 1
            if t in self.stop_ids:
                self.finished_reason = "stop"
                break
            if len(self.output_ids) >= self.max_new_tokens:
                self.finished_reason = "length"
                break
        self.arrivals.append((time.perf_counter(), len(self.output_ids) - n0))
        return kept
