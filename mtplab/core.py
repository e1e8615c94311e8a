"""Shared types: the leaf every layer imports; it imports nothing of mtplab but errors.py.

    requests      SamplingParams, ReqKV, Req                      (host, per request)
    hot path      PrefillInputs, DecodeInputs, SamplingTensors    scheduler -> worker
                  DecodeOut                                       worker -> scheduler (d2h)
                  DraftInputs                                     one iteration -> the next,
                                                                  through the future map
    seam          Worker: what the scheduler drives (the twin of speculative/draft_worker.py
                  DraftWorker, what the spec worker drives)
    errors        ConfigError (defined in the torch-free leaf errors.py)

Live-request identity (checked in every engine test): len(prompt_ids) + len(output_ids) ==
kv_committed_len + 1 -- every token but the last output has its KV written.
Per request KV:  0 <= kv_committed_len <= kv_allocated_len <= W (the req_to_token row width).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional, Protocol, runtime_checkable

import numpy as np
import torch

from .errors import ConfigError  # noqa: F401  (re-exported: the historical home)

# The token id a step reports to the host for a request whose target forward was not finite
# (kernels/sampling.py finite_rows, flag_nonfinite; the device keeps a valid next input).
NONFINITE_TOKEN = -1


# -- requests ---------------------------------------------------------------------------------
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


class ReqKV:
    """A request's KV ownership: its req_to_token row and its pages.
    kv_allocated_len = len(pages) * P (page-granular, entries in row order);
    kv_committed_len = entries holding valid KV (advanced only by result processing), kept
    in `lens[row]`: the KV manager's per-row array (mem/kv_manager.py), so the scheduler
    reads and advances a batch's lengths as one array operation."""

    __slots__ = ("row", "page_size", "pages", "lens")

    def __init__(self, row: int, page_size: int, pages: Optional[list] = None,
                 lens: Optional[np.ndarray] = None):
        self.row, self.page_size = row, page_size
        self.pages: list[int] = [] if pages is None else pages
        self.lens = np.zeros(row + 1, dtype=np.int64) if lens is None else lens

    @property
    def kv_committed_len(self) -> int:
        return int(self.lens[self.row])

    @kv_committed_len.setter
    def kv_committed_len(self, n: int) -> None:
        self.lens[self.row] = n

    @property
    def kv_allocated_len(self) -> int:
        return len(self.pages) * self.page_size

    def __repr__(self) -> str:
        return (f"ReqKV(row={self.row}, pages={len(self.pages)}, "
                f"committed={self.kv_committed_len}, allocated={self.kv_allocated_len})")


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
    prefilled: int = 0            # of those, tokens whose prefill forward is launched: below
                                  # prefill_len while a chunked prefill is under way
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


# -- hot-path bundles ---------------------------------------------------------------------------
@dataclass
class SamplingTensors:
    """Per-lane sampling parameters (device tensors, [B] each)."""
    temperature: torch.Tensor
    top_p: torch.Tensor
    seeds: torch.Tensor
    counters: Optional[torch.Tensor] = None   # index of the token being sampled (= tokens
                                              # before it); decode derives it from seq_lens


@dataclass
class PrefillInputs:
    """One prefill forward: a chunk of each request's fill ids (the whole prompt unless
    chunked prefill cuts it), whose earlier chunks' KV is already written."""
    input_ids: torch.Tensor     # [T] packed chunks (prompt + earlier output on re-prefill)
    rows: torch.Tensor          # [B]
    q_lens: torch.Tensor        # [B] tokens fed per request
    cu_q: torch.Tensor          # [B+1]
    positions: torch.Tensor     # [T] prefix_len + i
    max_q: int
    sampling: SamplingTensors   # counters = kv_lens (the sampled token's index)
    kv_lens: Optional[torch.Tensor] = None   # [B] prefix + q_len (None: = q_lens, no prefix)
    max_kv: int = 0             # bound on kv_lens (0: = max_q)
    next_ids: Optional[torch.Tensor] = None  # [B] the fill token after a non-final chunk, -1
                                             # after the final one (None: every chunk final)
    host_rows: Optional[np.ndarray] = None   # [B] int64: `rows` on the host


@dataclass
class DecodeInputs:
    """One decode iteration over B running requests. seq_lens and the input token are not
    here: the worker resolves them from the future map on the device."""
    rows: torch.Tensor          # [B] req_to_token rows (device)
    sampling: SamplingTensors   # counters None: derived from the resolved seq_lens
    max_kv: int                 # host bound on seq_len + tokens this step (eager attention)
    all_greedy: bool            # host flag: every lane has temperature 0
    host_rows: np.ndarray       # [B] int64: `rows` on the host (the worker's own per-row
                                #   state, e.g. which rows it pre-drafted)


@dataclass
class DecodeOut:
    """What result processing reads back: up to n new tokens per request."""
    tokens: torch.Tensor        # [B, n] int64 (n = 1 target-only, S+1 speculative)
    accept_lens: torch.Tensor   # [B] int64, tokens committed this step (bonus included)
    predrafted: bool = False    # the step's draft ran a round early (zb_draft_preexec)
    draft_tokens: int = 0       # draft tokens each request proposed to the verify (D - 1)


@dataclass
class DraftInputs:
    """What one iteration hands the next draft, through the future map (keyed by row).

    bonus      [B]      the token the next verify roots its tree at
    hidden     [B, H]   frozen: target hidden at the last accepted node (the seed);
                        eagle : the draft's hidden at the last accepted position
    topk_logp  [B, K]   eagle: step-0 candidates from draft extend
    topk_index [B, K]
    """
    bonus: torch.Tensor
    hidden: Optional[torch.Tensor] = None
    topk_logp: Optional[torch.Tensor] = None
    topk_index: Optional[torch.Tensor] = None


# -- the scheduler's seam -----------------------------------------------------------------------
@runtime_checkable
class Worker(Protocol):
    """What the scheduler drives: speculative/target_worker.py TargetWorker (target-only),
    speculative/worker.py SpecWorker, speculative/arms.py ScheduleWorker (a spec_schedule).

    prefill(x)   the forward of one prefill batch (prefill, publish, stash) -> the tokens
                 [B] for the host (NONFINITE_TOKEN where the logits were not finite)
    decode(x)    one decode step (resolve .. stash) -> DecodeOut; graphed, its tensors are
                 graph buffers, valid until the next decode is launched
    runners()    its captured graph runners (graphs/runner.py; instrument/hostclock.py counts
                 their replays)
    close()      releases the captured graphs (each graph's function holds the worker's parts)
    """

    def prefill(self, x: PrefillInputs) -> torch.Tensor: ...

    def decode(self, x: DecodeInputs) -> DecodeOut: ...

    def runners(self) -> list: ...

    def close(self) -> None: ...

