"""One cell's measurement, inside the cell's own process: build the engine, run a warm-up
generate, run the measured generate, then (event timeline on) the same workload once more
with spans for the stage times, then (profile=True) profiled generates of the same workload;
write the run folder and derive the figures.

    engine steps:  [warm-up][measured generate][timeline generate][host][profiled generate(s)]
    spans:          on       paused             on                 on
    profiler:      held in `wait` ----------------------------->  wait | warmup | active
    figures:                tok/s, latency      stage times,       bubble fractions, launch
                                                tok/s with spans   and sync counts (trace)
This is the one measurement procedure of mtplab: `mtplab sweep`, `mtplab bench` (grid files in
mtplab/studies/<question>/) and the scripts in benchmarks/ all time engine runs through it, one cell
per process (mtplab.sweep.runner).

Latency: TPOT/ITL and the decode step time are `Engine.stats()` of the measured generate
(per-request token arrival times, see mtplab.sweep's table schema), which neither the
profiler (no collection, no trace export inside it) nor the spans (paused: an event pair per
stage has a cost comparable to a small model's kernels, docs/results/meter_trust/) touch.
The event-timeline figures use only the steps of the timeline generate; the trace covers
profiled steps only, so no warm-up step is in it (`trace_skip_steps` = 0). With the workload's
`host_stages`, two more runs of the workload give the host-stage columns ([host]: a
generate with the host clock, spans off; a step-by-step run under the op counter; sweep/host.py).
With `step_profile`, one more generate (spans off, meter on, a StepClock) writes the what-if
predictor's tables into the run folder (sweep/step_profile.py). `host_delay_us` plants a
busy-wait of that length after every engine step of every generate (an on_step hook).
"""
from __future__ import annotations

import contextlib
import functools
import time
import json
import random
from dataclasses import replace
from typing import Any

from ..config import RunConfig
from ..lossless import divergence
from ..models.floor import StepBytes, engine_step_bytes
from .grid import Workload
from ..instrument.meter import meter_figures
from ..stats import health_columns
from . import step_profile
from .host import host_columns
from .metrics import stage_metrics, trace_metrics

LATENCY_KEYS = ("tpot_p50_ms", "tpot_p90_ms", "itl_p50_ms", "itl_p99_ms")


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """n random prompts of `length` token ids in [3, vocab) (ids 0-2 are special)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def lossless_columns(cfg: RunConfig, ps: list, n: int, outputs: list) -> dict[str, Any]:
    """check_lossless: the same prompts greedy on a target-only engine of the same numerics
    -> diverging_requests, first_divergence_tokens (JSON list, diverging requests in order);
    None for a cell without a real draft (nothing to compare)."""
    from ..engine import Engine

    if not cfg.speculative or cfg.simulated:
        return {"diverging_requests": None, "first_divergence_tokens": None}
    target = Engine(RunConfig(
        model=cfg.model, page_size=cfg.page_size, max_running_requests=cfg.max_running_requests,
        context_len=cfg.context_len, cuda_graphs=cfg.cuda_graphs,
        cuda_graph_max_bs=cfg.cuda_graph_max_bs, attention_backend=cfg.attention_backend,
        device=cfg.device, dtype=cfg.dtype, deterministic=cfg.deterministic, seed=cfg.seed))
    n_div, firsts = divergence(outputs, target.generate(ps, max_new_tokens=n, ignore_eos=True))
    return {"diverging_requests": n_div,
            "first_divergence_tokens": json.dumps([f for f in firsts if f is not None])}


def code_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of exactly `length` tokens: the last `length` tokens of held-out stdlib code
    snippets (mtplab.models.corpus; the prompt ends where the model continues)."""
    from ..models.corpus import heldout_snippets

    if tokenizer is None:
        raise ValueError("prompts='code' needs a model with a tokenizer; use prompts='random'.")
    out = [tokenizer.encode(t)[-length:] for t in heldout_snippets(n, 2 * length + 64)]
    short = min(len(p) for p in out)
    if short < length:
        raise ValueError(f"a held-out code snippet has {short} tokens, fewer than "
                         f"prompt_len_tokens={length}; shorten prompt_len_tokens.")
    return out


def spin(us: float, _step: int = 0) -> None:
    """Busy-wait `us` microseconds on the host (a planted delay after every engine step)."""
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def floor_context(wl: Workload) -> float:
    """The committed context of a mean measured decode step: the prompt plus half the output
    (the KV term of the floor grows linearly over the generate)."""
    return wl.prompt_len_tokens + wl.output_len_tokens / 2


def floor_bytes_per_step(eng, wl: Workload) -> StepBytes:
    """The bytes a mean decode step of the workload reads (models/floor.py `step_bytes`)."""
    bs = min(wl.batch_size, wl.requests)
    return engine_step_bytes(eng, bs, floor_context(wl))


def measure(cfg: RunConfig, wl: Workload) -> dict[str, Any]:
    """Run the cell; return the metric columns of its results row (see mtplab.sweep)."""
    from ..engine import Engine

    if wl.fail:
        raise RuntimeError("workload fail=True: this cell fails on purpose (test hook).")
    cfg = replace(cfg, bubble_meter=True)         # the headline bubble_frac (instrument/meter.py)
    eng = Engine(cfg)
    if wl.host_delay_us:
        eng.on_step(functools.partial(spin, wl.host_delay_us))
    V = eng.model.config.vocab_size
    if wl.prompts == "code":
        measured = code_prompts(eng.tokenizer, wl.requests, wl.prompt_len_tokens)
        warm = measured[:wl.batch_size]
    else:
        measured = prompts(wl.requests, wl.prompt_len_tokens, V, cfg.seed)
        warm = prompts(wl.batch_size, wl.prompt_len_tokens, V, cfg.seed + 1)

    def run(ps, n):
        return eng.generate(ps, max_new_tokens=n, ignore_eos=True, temperature=wl.temperature)

    prof = eng.profiler
    with prof.held() if prof is not None else contextlib.nullcontext():
        if wl.warmup_output_len_tokens:
            run(warm, wl.warmup_output_len_tokens)
        with eng.spans.paused(keep_meter=True):
            outputs = run(measured, wl.output_len_tokens)           # measured
        st = eng.stats()
        first_step = end_step = 0
        timeline_tps = float("nan")
        if eng.timeline is not None:
            first_step = eng.timeline.step + 1
            run(measured, wl.output_len_tokens)                     # stage times
            end_step = eng.timeline.step + 1
            timeline_tps = eng.stats()["decode_tok_per_s"]
    host = host_columns(eng, measured, wl.output_len_tokens, wl.temperature) \
        if wl.host_stages else {}
    profile = {}
    if wl.step_profile:
        written = step_profile.record(eng, measured, wl.output_len_tokens, wl.temperature,
                                      st["meter_tok_per_s"])
        anchor = json.loads(written["whatif"].read_text())
        profile = {k: anchor[k] for k in ("host_period_us", "host_busy_us_per_step",
                                          "host_busy_p50_us_per_step", "latency_us")}
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
    row.update(health_columns(st))
    fb = floor_bytes_per_step(eng, wl)
    row["weight_bytes_per_step"] = fb.weights          # the floor's terms (models/floor.py)
    row["kv_bytes_per_step"] = fb.kv
    row["floor_context_tokens"] = floor_context(wl)
    for i, r in enumerate(st.get("accept_rate_per_pos", []), start=1):
        row[f"accept_rate_pos{i}"] = r
    man = cfg.manifest()
    row.update(device_name=man["device_name"], git_commit=man["git_commit"],
               mtplab_version=man["versions"]["mtplab"], torch_version=man["versions"]["torch"])
    row.update(host)
    row.update(profile)
    if wl.check_lossless:
        row.update(lossless_columns(cfg, measured, wl.output_len_tokens, outputs))
    row["run_dir"] = str(eng.run_dir)
    row["manifest_path"] = str(files["manifest"]) if "manifest" in files else None
    row["timeline_path"] = str(files["timeline"]) if "timeline" in files else None
    row["timeline_first_step"], row["timeline_end_step"] = first_step, end_step
    row["timeline_decode_tok_per_s"] = timeline_tps       # the same workload, spans on
    if eng.timeline is not None:
        row.update(stage_metrics(eng.timeline_frame(), first_step, end_step))
    row["trace_path"] = str(files["trace0"]) if "trace0" in files else None
    if row["trace_path"]:
        row["trace_skip_steps"] = 0
        row.update(trace_metrics(row["trace_path"], 0, eng.model.config.num_hidden_layers))
    return row
