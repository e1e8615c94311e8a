"""A run's step profile: what the what-if predictor (analysis/whatif.py) reads from a run
folder, recorded by one more generate of the measured workload.

    files = record(eng, prompts, n, temperature, tok_per_s)
      <run_dir>/host_steps.parquet   per decode step: host µs per span (instrument/stepclock.py)
      <run_dir>/whatif.json          meter_tok_per_s (the measured generate's decode tokens
                                     over its meter wall: the anchor a what-if's tok/s
                                     scales), latency_us (L = W), seed_forward,
                                     eager_launches, first_step, steps
      (engine.finish() then writes meter_stages.parquet, whose steps the host table names)

The generate runs with the spans paused (no event pairs, no profiler ranges), the bubble
meter stamping and a StepClock timing every span, so the two tables describe the same steps.
`mtplab run --step-profile true` and a sweep cell with `step_profile: true` record it;
`mtplab whatif RUN_DIR` reads it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from ..analysis.whatif import ANCHOR_FILE, HOST_STEPS_FILE, host_waits
from ..atomic import atomic_path, atomic_write_json
from ..draft_kinds import DRAFT_KINDS
from ..instrument.stepclock import StepClock, launch_latency_us


def record(eng, prompts: list, n: int, temperature: float,
           tok_per_s: float) -> dict[str, Path]:
    """Run the workload once more with a StepClock; write the host table and the anchor
    (`host_figures` of the host table are in the anchor too)."""
    if eng.meter is None:
        raise ValueError("the step profile pairs host spans with the bubble meter's stage "
                         "intervals; build the engine with bubble_meter=True.")
    clock = StepClock(first_step=eng.meter.step + 1)
    with eng.spans.clocked(clock):
        eng.generate(prompts, max_new_tokens=n, ignore_eos=True, temperature=temperature)
    host = clock.frame()
    cfg = eng.cfg
    kind = DRAFT_KINDS.get(cfg.draft)
    anchor: dict[str, Any] = {
        "meter_tok_per_s": tok_per_s,
        "latency_us": launch_latency_us(eng.device.torch_device),
        "seed_forward": bool(cfg.speculative and kind is not None and kind.seed_forward),
        "eager_launches": sorted(clock.eager), "first_step": clock.first_step,
        "steps": int(len(host)), **host_figures(host)}
    out = Path(eng.run_dir)
    with atomic_path(out / HOST_STEPS_FILE) as tmp:
        host.to_parquet(tmp)
    return {"host_steps": out / HOST_STEPS_FILE,
            "whatif": atomic_write_json(out / ANCHOR_FILE, anchor)}


def host_figures(host: pd.DataFrame) -> dict[str, float]:
    """host_period_us: the mean iteration; host_busy_us_per_step: the same less the host's
    waits (`sync` spans, nested ones too): the host's own time per decode step;
    host_busy_p50_us_per_step: the median step's (the regime map's denominator,
    studies/regime/ladder.py: a few steps' page allocation, or a launch call blocked on a full
    device queue when the GPU is the longer, do not move it)."""
    if host.empty:
        return {"host_period_us": math.nan, "host_busy_us_per_step": math.nan,
                "host_busy_p50_us_per_step": math.nan}
    busy = host["period_us"] - host_waits(host)
    return {"host_period_us": float(host["period_us"].mean()),
            "host_busy_us_per_step": float(busy.mean()),
            "host_busy_p50_us_per_step": float(busy.median())}


def run_host_figures(run_dir: str | Path) -> dict[str, float]:
    """`host_figures` of a run folder's host table (empty when it has none)."""
    path = Path(run_dir) / HOST_STEPS_FILE
    return host_figures(pd.read_parquet(path)) if path.is_file() else {}
