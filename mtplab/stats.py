"""The figures of one `generate`: throughput, latency percentiles, acceptance, syncs.

    accept_len            tokens committed per verify, bonus included (mean over requests x steps)
    accept_rate_per_pos   P(accept_len > k) for k = 1..S
    TPOT                  per request (last - first token arrival) / (tokens - 1)
    ITL                   gaps between a request's consecutive arrivals from its first decode
                          step on (a speculative step delivers several tokens at once: one
                          arrival); the gap from the prefill's token to the first decode
                          step's is left out: it holds the prefills scheduled in between, a
                          share of time to first token, not of the decode cadence

Health figures (mtplab/health.py), from what result processing read back already:
    accept_len_by_ctx     mean accept length by context-position bucket (0, 256, 512, ...)
    accept_alarm          a window of verify steps accepted below a floor of the run's mean
                          (or nothing); accept_alarm_steps: the stretches, as scheduler
                          iterations (the event timeline's step numbers) [first, last]
    draft_tokens          draft tokens proposed to the verifies; draft_tokens_accepted of
                          them; draft_waste_frac = (proposed - accepted) / proposed
    escape_frac           emitted tokens outside a hot draft vocabulary (draft_vocab hot:N) /
                          emitted tokens: each one a position no draft token could match

`LEGEND` says, in one line each, what the less obvious keys of the table mean (`mtplab run`
prints it under its stats table).
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from .core import Req
from .health import ALARM_FLOOR, ALARM_WINDOW, accept_alarm, accept_by_context

LEGEND = {
    "accept_len": "tokens committed per verify, bonus token included",
    "tpot_p50_ms": "TPOT: per request, (last token - first token) / (tokens - 1)",
    "itl_p50_ms": "ITL: gaps between a request's token deliveries from its first decode step "
                  "on (the prefill-to-first-decode gap is left out; one delivery per step)",
    "decode_tok_per_s": "tokens of decode steps / the time of decode steps (prefill left out)",
    "retractions": "requests sent back to the queue when the KV pool ran short",
    "overshoot_rows": "batch rows the overlap loop ran for a request the step before had "
                      "already finished (launched before that result was read); their tokens "
                      "are dropped, and no KV is committed",
    "predrafted_steps": "decode steps whose draft ran a round early (zb_draft_preexec)",
    "bubble_frac": "the bubble meter's share of decode-step wall time that no stage covers; "
                   "meter_clock says what it stamped: the device, or on CPU the host clock "
                   "(no device there: host time between stage spans, not an idle GPU)",
    "run_ahead_frac": "decode steps whose next launch was issued before the step's last GPU "
                      "work ended (the host ran ahead; healthy: near 1 under overlap); "
                      "bubble meter on a GPU only (run_ahead_note says why not)",
    "launch_lead_p50_us": "the bubble meter's launch lead: end of a step's GPU work - the "
                          "host's launch of the next step (> 0: run-ahead), p10/p50/p90",
    "draft_busy_frac": "the draft's stages' share of decode-step GPU busy time (bubble meter)",
    "draft_waste_frac": "draft tokens proposed to the verifies but rejected / proposed",
    "accept_len_ctx0": "accept length of the verifies at context positions [lo, 2 lo) (the "
                       "first bucket [0, 256)); healthy: flat, no bucket falling to 1",
    "accept_alarm": "a window of verify steps accepted < 20% of the run's mean, or nothing "
                    "(accept_alarm_steps: the stretches; an AcceptanceAlarm warning)",
    "escape_frac": "emitted tokens outside the hot draft vocabulary (draft_vocab hot:N), each "
                   "a position no draft token could match",
    "experts_per_verify": "MoE: distinct experts per layer touched by one verify's tokens "
                          "(mean over verifies and layers); _uniform: E(1-(1-k/E)^n) for them",
}


HEALTH_KEYS = ("draft_tokens", "draft_tokens_accepted", "draft_waste_frac", "accept_alarm",
               "escape_frac", "experts_per_verify", "experts_per_verify_uniform",
               "experts_per_draft_step")


def health_columns(stats: dict) -> dict:
    """The health figures of an `Engine.stats()` as scalar columns (the sweep's row, `mtplab
    run`'s table): HEALTH_KEYS (NaN without a draft, or experts without moe_stats),
    accept_len_ctx<lo> per context
    bucket, accept_alarm_steps_json (the stretches, JSON)."""
    out = {k: stats.get(k, float("nan")) for k in HEALTH_KEYS}
    out.update({f"accept_len_ctx{lo}": v
                for lo, v in (stats.get("accept_len_by_ctx") or {}).items()})
    steps = stats.get("accept_alarm_steps")
    out["accept_alarm_steps_json"] = json.dumps(steps) if steps is not None else None
    return out


def pct_ms(xs: list, q: float) -> float:
    """The q-th percentile of seconds `xs`, in ms (0.0 when empty)."""
    if not xs:
        return 0.0
    xs = sorted(xs)
    return 1e3 * xs[min(len(xs) - 1, int(len(xs) * q / 100))]


def acceptance_health(s, *, window: int = ALARM_WINDOW, floor: float = ALARM_FLOOR) -> dict:
    """The acceptance and draft figures of the module doc from the StepStats `s`."""
    steps = np.asarray(s.verify_steps, dtype=np.int64).reshape(-1, 4)
    it, lanes, acc, prop = steps.T
    stretches = accept_alarm(lanes, acc, prop, window=window, floor=floor)
    proposed, accepted = int(prop.sum()), int(acc[prop > 0].sum())
    return {
        "accept_len_by_ctx": accept_by_context(s.accept_ctx, s.accept_lens, s.draft_tokens),
        "accept_alarm": bool(stretches),
        "accept_alarm_steps": [[int(it[a]), int(it[b])] for a, b in stretches],
        "draft_tokens": proposed, "draft_tokens_accepted": accepted,
        "draft_waste_frac": (proposed - accepted) / proposed if proposed else float("nan"),
    }


def escape_frac(reqs: list[Req], hot: Optional[np.ndarray]) -> float:
    """Emitted tokens outside the hot vocabulary (`hot`: a bool mask over the vocabulary) /
    emitted tokens; NaN without a hot vocabulary or tokens."""
    toks = [t for r in reqs for t in r.output_ids]
    if hot is None or not toks:
        return float("nan")
    return float((~hot[np.asarray(toks, dtype=np.int64)]).mean())


def collect_stats(reqs: list[Req], s, wall: float, *, num_steps: int, speculative: bool,
                  simulated: bool, hot: Optional[np.ndarray] = None) -> dict:
    """`s` is the scheduler's StepStats of the call; `hot` the hot draft vocabulary as a bool
    mask over the vocabulary (None: the draft reads every token)."""
    tokens = sum(len(r.output_ids) for r in reqs)
    steps = sorted(s.step_times_s)
    acc = s.accept_lens
    tpot = [(r.arrivals[-1][0] - r.arrivals[0][0]) / (len(r.output_ids) - 1)
            for r in reqs if len(r.output_ids) > 1 and r.arrivals]
    itl = [b[0] - a[0] for r in reqs for a, b in zip(r.arrivals[1:], r.arrivals[2:])]
    spec = {}
    if speculative and acc:
        spec = {
            "accept_len": sum(acc) / len(acc),
            "accept_rate_per_pos": [sum(a > k for a in acc) / len(acc)
                                    for k in range(1, num_steps + 1)],
            "accept_len_hist": {n: acc.count(n) for n in range(1, num_steps + 2)},
            "verify_steps": s.decode_steps, "draft_steps": s.decode_steps * num_steps,
            "simulated": simulated, **acceptance_health(s), "escape_frac": escape_frac(reqs, hot),
        }
    return {
        **spec,
        "requests": len(reqs), "tokens": tokens, "wall_s": wall,
        "tok_per_s": tokens / wall if wall > 0 else 0.0,
        "steps": s.prefill_steps + s.decode_steps, "prefill_steps": s.prefill_steps,
        "decode_steps": s.decode_steps, "retractions": s.retractions,
        "decode_tok_per_s": s.decode_tokens / s.decode_time_s if s.decode_time_s else 0.0,
        "step_time_p50_ms": 1e3 * steps[len(steps) // 2] if steps else 0.0,
        "tpot_p50_ms": pct_ms(tpot, 50), "tpot_p90_ms": pct_ms(tpot, 90),
        "itl_p50_ms": pct_ms(itl, 50), "itl_p99_ms": pct_ms(itl, 99),
        "decode_step_p50_ms": pct_ms(s.decode_step_times_s, 50),
        "decode_step_p90_ms": pct_ms(s.decode_step_times_s, 90),
        "overshoot_rows": s.overshoot_rows, "predrafted_steps": s.predrafted_steps,
        "host_syncs": dict(s.host_syncs),
        "finish_reasons": {k: sum(r.finished_reason == k for r in reqs)
                           for k in ("stop", "length", "abort")},
    }
