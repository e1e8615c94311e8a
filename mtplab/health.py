"""Health figures of a run, from tables the engine and the analyser already keep (numpy
only: the bubble meter, the scheduler's result processing and the trace analyser share it).

Run-ahead (the host's launch lead)
    lead[k] = end of step k's last GPU work - the host's issue of step k+1's first GPU work
    on one clock. lead > 0: the host ran ahead (step k+1's work was queued before the GPU ran
    out of step k's); lead <= 0: the GPU waited for the host. The host stays off the critical
    path iff host loop time < GPU step time, i.e. every lead > 0.
        run_ahead_frac        share of steps with a next launch whose lead is > 0
        launch_lead_pXX_us    percentiles 10 / 50 / 90 of the leads (µs)
    A step with no next launch in the same run (the last step of a generate) has no lead.

Acceptance over the run (per verify step: the lanes it verified, the draft tokens it
proposed, those accepted)
    the alarm    a window of `window` consecutive verify steps whose accepted draft tokens
                 per lane fall below `floor` x the run's own mean, or are 0 while the run
                 proposed drafts; overlapping alarmed windows merge into one stretch
    by context   the mean accept length of the verified lanes bucketed by their context
                 position (power-of-two buckets)

Experts touched (MoE): the uniform expectation E (1 - (1 - k/E)^n) of distinct experts n
tokens touch when each picks k of E at random.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

NAN = float("nan")
RUN_AHEAD_KEYS = ("run_ahead_frac", "launch_lead_p10_us", "launch_lead_p50_us",
                  "launch_lead_p90_us", "run_ahead_steps")
ALARM_WINDOW = 32           # verify steps per window
ALARM_FLOOR = 0.2           # of the run's own mean accepted draft tokens per lane


def launch_leads(last_end: np.ndarray, next_launch: np.ndarray) -> np.ndarray:
    """lead[k] = last_end[k] - next_launch[k] (one clock; NaN where either is unknown)."""
    return np.asarray(last_end, dtype=float) - np.asarray(next_launch, dtype=float)


def run_ahead(leads: Sequence[float]) -> dict:
    """The run-ahead figures (RUN_AHEAD_KEYS) of per-step leads in µs; NaN leads (no next
    launch) are left out; every figure NaN when none is left."""
    x = np.asarray(leads, dtype=float)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"run_ahead_frac": NAN, "launch_lead_p10_us": NAN, "launch_lead_p50_us": NAN,
                "launch_lead_p90_us": NAN, "run_ahead_steps": 0}
    p10, p50, p90 = np.percentile(x, [10, 50, 90]).tolist()
    return {"run_ahead_frac": float((x > 0).mean()), "launch_lead_p10_us": p10,
            "launch_lead_p50_us": p50, "launch_lead_p90_us": p90, "run_ahead_steps": int(x.size)}


def run_ahead_unavailable() -> dict:
    """RUN_AHEAD_KEYS with no measurement (NaN, 0 steps)."""
    return run_ahead([])


def accept_alarm(lanes: Sequence[int], accepted: Sequence[int], proposed: Sequence[int], *,
                 window: int = ALARM_WINDOW, floor: float = ALARM_FLOOR) -> list[tuple[int, int]]:
    """Stretches [first, last] (verify-step indices, inclusive) of the windows of `window`
    consecutive verify steps that proposed drafts and whose accepted draft tokens per lane are
    below `floor` x the run's mean, or are 0. Steps that proposed nothing (a target-only step
    of a speculation schedule) are left out of the windows. No window fits: no alarm."""
    if window < 1 or not 0 <= floor <= 1:
        raise ValueError(f"the acceptance alarm takes window >= 1 and 0 <= floor <= 1, got "
                         f"window={window}, floor={floor}.")
    n = np.asarray(lanes, dtype=float)
    a = np.asarray(accepted, dtype=float)
    d = np.asarray(proposed, dtype=float)
    idx = np.flatnonzero(d > 0)
    if idx.size < window:
        return []
    n, a = n[idx], a[idx]
    mean = a.sum() / n.sum()
    cs_a = np.concatenate(([0.0], np.cumsum(a)))
    cs_n = np.concatenate(([0.0], np.cumsum(n)))
    wa = cs_a[window:] - cs_a[:-window]
    wn = cs_n[window:] - cs_n[:-window]
    low = (wa == 0) | (wa / wn < floor * mean)
    out: list[tuple[int, int]] = []
    for s in np.flatnonzero(low).tolist():
        first, last = int(idx[s]), int(idx[s + window - 1])
        if out and first <= out[-1][1]:
            out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


def context_buckets(pos) -> np.ndarray:
    """The lower bound of the power-of-two bucket holding each context position ([0, 256)
    is the first bucket; then [256, 512), [512, 1024), ...)."""
    p = np.asarray(pos, dtype=np.int64)
    return np.where(p < 256, 0, 1 << np.floor(np.log2(np.maximum(p, 1))).astype(np.int64))


def accept_by_context(ctx: Sequence[int], accept_lens: Sequence[int],
                      proposed: Sequence[int]) -> dict[int, float]:
    """The mean accept length (tokens committed per verify, bonus included) of the verified
    lanes by the bucket of their context position (`context_buckets`), buckets in order;
    lanes that proposed no draft token are left out."""
    c = np.asarray(ctx, dtype=np.int64)
    a = np.asarray(accept_lens, dtype=float)
    keep = np.asarray(proposed) > 0
    c, a = c[keep], a[keep]
    if c.size == 0:
        return {}
    b = context_buckets(c)
    return {int(lo): float(a[b == lo].mean()) for lo in np.unique(b).tolist()}


def expected_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Distinct experts `tokens` tokens touch in one MoE layer if each picks its top-k of
    `num_experts` uniformly at random: E (1 - (1 - k/E)^n)."""
    E, k = num_experts, top_k
    return E * (1.0 - (1.0 - k / E) ** tokens)
