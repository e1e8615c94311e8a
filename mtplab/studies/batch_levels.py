"""Timing a batch that shrinks level by level: one engine measures every batch size.

    prompts of B requests, request r given tokens for `steps` decode steps at each level
    b > r of the batch sizes (request_tokens), so the running batch falls B -> ... -> 1:

        running  B B B ... B | b2 b2 ... b2 | ... | 1 1 ... 1
                 level B       level b2             level 1

    every iteration timed (host wall between step() returns: the GPU step when the loop is
    GPU-bound) beside the running count and the tokens out (time_levels); an iteration counts
    for bs b when b requests ran in it and in the STEADY iterations either side, with no
    prefill among them (steady_cells), its window p50s the measurements.

The runners of `long_context_spec` and of the MoE speculation study (`moe`) share it.
"""
from __future__ import annotations

import gc
import time

import numpy as np
import torch

from mtplab import Engine, RunConfig
from mtplab.sched.scheduler import StepStats

STEADY = 2                           # iterations either side with the same running count


def tokens_per_step(kw: dict) -> float:
    """Tokens a request gains per decode step at the arm's simulated acceptance."""
    if kw.get("simulate_accept_len"):
        return float(kw["simulate_accept_len"])
    if kw.get("simulate_accept_rates"):
        return 1.0 + float(np.sum(np.cumprod(kw["simulate_accept_rates"])))
    return 1.0


def request_tokens(batches: list[int], B: int, steps: int, per_step: float) -> list[int]:
    """Tokens of each of B requests: request r lives `steps` decode steps at each level b of
    `batches` (<= B) with r < b, so the running batch falls level by level."""
    levels = [b for b in batches if b <= B]
    return [max(2, int(round(steps * sum(r < b for b in levels) * per_step)))
            for r in range(B)]


def time_levels(eng: Engine, prompts: list[list[int]], tokens: list[int]) -> tuple[list, float]:
    """Run the staggered requests to the end: per iteration (seconds, running count, tokens
    out so far, prefill steps so far); and the seconds until the last prefill. The
    scheduler's step stats and an expert recorder (moe_stats) start afresh, as a generate's
    do, so they hold this run's steps only."""
    sched = eng.scheduler
    sched.stats = StepStats()
    if eng.experts is not None:
        eng.experts.reset()
    reqs = [eng.add_request(p, max_new_tokens=n, ignore_eos=True)
            for p, n in zip(prompts, tokens)]
    rows = []
    t_prefill = None
    t0 = last = time.perf_counter()
    while not eng.idle:
        eng.step()
        now = time.perf_counter()
        rows.append((now - last, len(sched.running), sum(len(r.output_ids) for r in reqs),
                     sched.stats.prefill_steps))
        if t_prefill is None and not sched.waiting and len(rows) > 1 and \
                rows[-1][3] == rows[-2][3]:
            t_prefill = now - t0
        last = now
    eng.check_invariants()
    return rows, t_prefill or 0.0


def steady_cells(rows: list, batches: list[int], windows: int) -> dict:
    """{bs: (window p50 ms list, tokens per step)} of the iterations counted for each bs."""
    out = {}
    n = len(rows)
    for bs in batches:
        sel = [i for i in range(STEADY, n - STEADY)
               if all(rows[j][1] == bs for j in range(i - STEADY, i + STEADY + 1))
               and rows[i - STEADY][3] == rows[i + STEADY][3]]
        if len(sel) < windows:
            continue
        dts = np.asarray([rows[i][0] for i in sel])
        toks = np.asarray([rows[i][2] - rows[i - 1][2] for i in sel], dtype=float)
        ms = [1e3 * float(np.median(w)) for w in np.array_split(dts, windows)]
        out[bs] = (ms, float(toks.mean()), len(sel))
    return out


def level_prompts(eng: Engine, B: int, prompt_len: int, seed: int) -> list[list[int]]:
    """B random prompts of prompt_len tokens of eng's vocabulary (seeded)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, eng.model.config.vocab_size, (B, prompt_len),
                         generator=g).tolist()


def run_levels(cfg: RunConfig, batches: list[int], steps: int, per_step: float,
               prompt_len: int, seed: int) -> tuple[list, float, float]:
    """One engine of `cfg` at its batch B (cfg.max_running_requests): B random prompts of
    `prompt_len` tokens given request_tokens(batches, B, steps, per_step), run to the end ->
    (time_levels' rows, build seconds, seconds until the last prefill). The engine is closed
    and the device's cached memory given back however the run ends."""
    B = cfg.max_running_requests
    t0 = time.perf_counter()
    eng = None
    try:
        eng = Engine(cfg)
        build_s = time.perf_counter() - t0
        rows, prefill_s = time_levels(eng, level_prompts(eng, B, prompt_len, seed),
                                      request_tokens(batches, B, steps, per_step))
        return rows, build_s, prefill_s
    finally:
        if eng is not None:
            eng.close()
        del eng
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
