"""The batch-aware speculation schedule in the engine: one SpecWorker (an *arm*) per draft
setting the schedule names, every arm's graphs captured at start, the arm picked per decode
step by the batch size (RunConfig.spec_schedule, mtplab/spec_schedule.py).

    decode(x): bs = rows ──> bucket lo < bs <= hi ──> arm (S, K)  ──> arm.decode(x)
                                                       │
           ┌───────────────────────────────────────────┴────────────────────────────┐
           arm (3, 1)              arm (2, 4)              arm (0, 1) "off"
           graphs: buckets of      graphs: buckets of      graphs: buckets of
           bs in its ranges        bs in its ranges        bs in its ranges
           │                       │                       │
           └──────── shared: target worker (weights, KV), draft model (EAGLE: its KV),
                     future map, req_to_token; no arm captures after start

What one step leaves in the future map is what any arm reads at the next, so a switch between
two steps (either direction, under overlap too: the arm of step k+1 is chosen when it is
launched, and stream order puts k's publish/stash before k+1's resolve) needs no copy:
    seq_lens, bonus     every arm publishes and stashes them
    draft inputs        Frozen-KV / Gemma-4 assistant: (token, target hidden at it), written
                        by every arm's commit, the off arm's included (its verify is the
                        target's decode forward); EAGLE: draft hidden and top-k from
                        draft_extend, which the off arm runs over its one token (its draft KV
                        never falls behind), the top-k at the run's topk width (a narrower
                        arm reads the first columns: speculative/draft_eagle.py)
    pre-drafted rows    (zb_draft_preexec) an arm's own candidates: on a switch the new arm
                        forgets every pre-draft it recorded, and its first step drafts
                        afresh from the draft inputs (the old arm stashed them as usual)
A prefill resets every arm's pre-draft record for its rows and runs through the first arm
(the prefill and the draft's first inputs do not depend on the setting).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..core import DecodeInputs, DecodeOut, PrefillInputs
from ..graphs.runner import GraphRunner, default_buckets
from .draft_select import num_candidates
from .plan import SpecParams
from .worker import SpecWorker

Setting = tuple[int, int]          # (num_steps, topk); (0, 1) is off


def arm_buckets(ranges: list[tuple[int, int, Setting]], setting: Setting,
                graph_max_bs: int) -> list[int]:
    """The graph buckets an arm replays: the bucket of every batch size its ranges hold, up
    to graph_max_bs (larger batches run eagerly, as without a schedule)."""
    full = default_buckets(graph_max_bs)
    return sorted({next(b for b in full if b >= bs) for lo, hi, s in ranges if s == setting
                   for bs in range(lo + 1, min(hi, graph_max_bs) + 1)})


class ScheduleWorker:
    """The scheduler's worker when a spec_schedule is set: prefill and decode as SpecWorker's,
    decode through the arm of the batch's bucket (module doc)."""

    def __init__(self, arms: dict[Setting, SpecWorker],
                 ranges: list[tuple[int, int, Setting]]):
        self.arms = arms
        self.ranges = ranges
        self._first = next(iter(arms.values()))
        self._last: Optional[SpecWorker] = None
        self.steps = {s: 0 for s in arms}         # decode steps each arm ran

    def arm(self, bs: int) -> Setting:
        return next(s for lo, hi, s in self.ranges if bs <= hi)

    def prefill(self, x: PrefillInputs):
        rows = x.host_rows
        for a in self.arms.values():
            a.forget_predrafts(rows)
        return self._first.prefill(x)

    def decode(self, x: DecodeInputs) -> DecodeOut:
        s = self.arm(x.rows.shape[0])
        w = self.arms[s]
        if w is not self._last:
            w.forget_predrafts()
            self._last = w
        self.steps[s] += 1
        return w.decode(x)

    def runners(self) -> list[GraphRunner]:
        return [r for a in self.arms.values() for r in a.runners()]

    def close(self) -> None:
        for a in self.arms.values():
            a.close()
        self.arms.clear()


def build(target, draft, future_map, ranges: list[tuple[int, int, Setting]],
          base: SpecParams, rates: Optional[tuple], cuda_graphs: bool, graph_max_bs: int,
          granularity: str) -> ScheduleWorker:
    """An arm per setting of `ranges` (lo, hi, (S, K)): `base`'s knobs (fold_seed, the
    zero-bubble ones) at S steps x K branches verifying every proposed node (S+1, or S*K+1),
    simulated at the first S of `rates` (per-position acceptance), each capturing the graph
    buckets of its own batch sizes. Off arms (S = 0) draft nothing ahead."""
    settings = list(dict.fromkeys(s for _, _, s in ranges))
    if base.draft_preexec:                # the widest arm's room, before any capture
        future_map.hold_predrafts(max(num_candidates(S, K) for S, K in settings if S) if
                                  any(S for S, _ in settings) else 0)
    arms = {}
    for S, K in settings:
        p = replace(base, num_steps=S, topk=K,
                    num_draft_tokens=S + 1 if K == 1 else S * K + 1,
                    draft_preexec=base.draft_preexec and S > 0,
                    simulate_accept_len=None,
                    simulate_accept_rates=tuple(rates[:S]) if rates is not None and S else None)
        arms[(S, K)] = SpecWorker(target, draft.with_setting(S, K), future_map, p, cuda_graphs,
                                  graph_max_bs, granularity,
                                  arm_buckets(ranges, (S, K), graph_max_bs))
    return ScheduleWorker(arms, ranges)


def step_counts(before: dict, after: dict) -> dict:
    """The figures of a schedule's decode steps between two `ScheduleWorker.steps` counts:
    draft_steps (each step's S; off steps draft nothing) and the steps per setting
    ("SxK" or "off")."""
    n = {s: after[s] - before.get(s, 0) for s in after}
    return {"draft_steps": sum(S * k for (S, _), k in n.items()),
            "schedule_steps": {("off" if S == 0 else f"{S}x{K}"): k
                               for (S, K), k in n.items()}}
