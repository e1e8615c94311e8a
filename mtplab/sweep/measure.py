"""One cell's measurement, inside the cell's own process: build the engine, run a warm-up
generate, run the measured generate, then (event timeline on) the same workload once more
with spans for the stage times, then (profile=True) profiled generates of the same workload;
write the run folder and derive the figures.

    engine steps:  [warm-up][measured generate][timeline generate][profiled generate(s) ...]
    spans:          on       paused             on                 on
    profiler:      held in `wait` ----------------------------->  wait | warmup | active
    figures:                tok/s, latency      stage times        bubble fractions, launch
                                                                   and sync counts (trace)
Latency: TPOT/ITL and the decode step time are `Engine.stats()` of the measured generate
(per-request token arrival times, see mtplab.sweep's table schema), which neither the
profiler (no collection, no trace export inside it) nor the spans (paused: an event pair per
stage costs 15-25% of a small model's decode step on the GPU, docs/benchmarks.md) touch.
The event-timeline figures use only the steps of the timeline generate; the trace covers
profiled steps only, so no warm-up step is in it (`trace_skip_steps` = 0).
"""
from __future__ import annotations

import contextlib
import json
import random
from dataclasses import replace
from typing import Any

from ..config import RunConfig
from .grid import Workload
from ..instrument.meter import meter_figures
from .metrics import stage_metrics, trace_metrics

LATENCY_KEYS = ("tpot_p50_ms", "tpot_p90_ms", "itl_p50_ms", "itl_p99_ms")


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n random prompts of `length` token ids in [3, vocab) (ids 0-2 are special)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def measure(cfg: RunConfig, wl: Workload) -> dict[str, Any]:
    """Run the cell; return the metric columns of its results row (see mtplab.sweep)."""
    from ..engine import Engine

    if wl.fail:
        raise RuntimeError("workload fail=True: this cell fails on purpose (test hook).")
    cfg = replace(cfg, bubble_meter=True)         # the headline bubble_frac (instrument/meter.py)
    eng = Engine(cfg)
    V = eng.model.config.vocab_size
    measured = prompts(wl.requests, wl.prompt_len_tokens, V, cfg.seed)

    def run(ps, n):
        eng.generate(ps, max_new_tokens=n, ignore_eos=True, temperature=wl.temperature)

    prof = eng.profiler
    with prof.held() if prof is not None else contextlib.nullcontext():
        if wl.warmup_output_len_tokens:
            run(prompts(wl.batch_size, wl.prompt_len_tokens, V, cfg.seed + 1),
                wl.warmup_output_len_tokens)
        with eng.spans.paused(keep_meter=True):
            run(measured, wl.output_len_tokens)                     # measured
        st = eng.stats()
        first_step = end_step = 0
        if eng.timeline is not None:
            first_step = eng.timeline.step + 1
            run(measured, wl.output_len_tokens)                     # stage times
            end_step = eng.timeline.step + 1
    eng.check_invariants()
    if prof is not None:
        while not prof.done:
            run(measured, wl.output_len_tokens)                     # profiled
        eng.check_invariants()
    files = eng.finish()
    row: dict[str, Any] = {k: st.get(k) for k in (
        "requests", "tokens", "wall_s", "tok_per_s", "decode_tok_per_s", "steps",
        "decode_steps", "prefill_steps", "retractions", "step_time_p50_ms")}
    row.update({k: st[k] for k in LATENCY_KEYS})
    row["decode_step_time_p50_ms"] = st["decode_step_p50_ms"]
    sites = {k: v for k, v in (st.get("host_syncs") or {}).items() if k.startswith("decode")}
    row["listed_syncs_json"] = json.dumps(sites) if cfg.debug_syncs else None
    row["listed_syncs_per_step"] = (sum(sites.values()) / max(1, st["decode_steps"])
                                    if cfg.debug_syncs else float("nan"))
    row.update(meter_figures(st))
    row["accept_len"] = st.get("accept_len", float("nan"))
    row["accept_simulated"] = bool(st.get("simulated", False))
    for i, r in enumerate(st.get("accept_rate_per_pos", []), start=1):
        row[f"accept_rate_pos{i}"] = r
    man = cfg.manifest()
    row.update(device_name=man["device_name"], git_commit=man["git_commit"],
               mtplab_version=man["versions"]["mtplab"], torch_version=man["versions"]["torch"])
    row["run_dir"] = str(eng.run_dir)
    row["manifest_path"] = str(files["manifest"]) if "manifest" in files else None
    row["timeline_path"] = str(files["timeline"]) if "timeline" in files else None
    row["timeline_first_step"] = first_step
    if eng.timeline is not None:
        row.update(stage_metrics(eng.timeline_frame(), first_step, end_step))
    row["trace_path"] = str(files["trace0"]) if "trace0" in files else None
    if row["trace_path"]:
        row["trace_skip_steps"] = 0
        row.update(trace_metrics(row["trace_path"], 0))
    return row
