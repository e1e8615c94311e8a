"""Sweeps: grids of runs, one process per cell, one results table.

    mtplab sweep examples/grids/overlap_bs.yaml            # built-in measurement per cell
    mtplab sweep --notebook notebooks/00_quickstart.ipynb GRID.yaml   # papermill per cell

    from mtplab.sweep import load_grid, run_sweep
    df = run_sweep(load_grid("grid.yaml").cells(), "traces/sweeps/x")

Grid files and cell ids: `grid.py`. Resume and output layout: `runner.py`; one cell's process
(isolation, timeout, death with its parent): `process.py` and `child.py`; where cells run
(here or on Dask workers): `executors.py`; the out-dir lock: `lock.py`; the journal and table:
`results.py`. docs/sweeps.md is the user guide.
What one cell measures: `measure.py`; ITL/TPOT and bubble definitions: `metrics.py`; what an
arm buys against its baseline over interleaved rounds (notebooks 01, 02, 04): `effects.py`.

Results table (`results.parquet`, one row per cell; `results.jsonl` holds the same records,
one line per finished or dropped cell, the last one per `cell_id` wins). Units are in the
column names (`_ms`, `_s`, `_us`, `_tokens`, `_frac`, `per_step`):

  identity    cell_id, status (ok | failed | dropped), error ('' when ok: the dropped reason
              or the failure's `Type: message`), cell_wall_s (the cell process, start to end),
              settings_json (the cell's settings as written in the grid file, JSON),
              worker (where it ran: `local`, or the Dask worker's name and `/gpu<id>`)
  config      cfg.<field> for every RunConfig field, resolved (as written for dropped cells);
              a sweep cell defaults max_running_requests = batch_size and event_timeline = True
  KV          kv_alloc_per_decode_tokens, kv_reserved_per_req_tokens (reserve per decode step
              per request = cfg.reserve_per_decode), kv_row_width_tokens (req_to_token row)
  workload    batch_size, num_requests, prompt_len_tokens, output_len_tokens,
              warmup_output_len_tokens, temperature, prompts, repeat, check_lossless,
              host_stages, fail, sleep_s (see grid.Workload)
  notebook    param.<key> (grid keys that are neither), nb.<key> (scalars of answer.json)
  throughput  requests, tokens, wall_s, tok_per_s, decode_tok_per_s, steps, decode_steps,
              prefill_steps, retractions (of the measured generate; warm-up excluded),
              timeline_decode_tok_per_s (the timeline generate: the same workload, spans on),
              weight_bytes_per_step, kv_bytes_per_step: the HBM floor's terms, the bytes
              a mean decode step reads (mtplab/models/floor.py `step_bytes`: weights actually
              read, the KV of floor_context_tokens = prompt + output / 2, windows counted as
              the window, the draft's S forwards)
  latency     step_time_p50_ms (all steps), decode_step_time_p50_ms (decode step wall time),
              itl_p50_ms, itl_p99_ms, tpot_p50_ms, tpot_p90_ms, from Engine.stats(): ITL =
              time between consecutive token deliveries to one request from its first
              decode step on (the prefill-to-first-decode gap is left out; a speculative
              step delivers its accepted tokens at once, so one sample per request per step);
              TPOT = per request (last delivery - first delivery) / (tokens - 1)
  acceptance  accept_len (tokens committed per verify, bonus included; NaN without a draft),
              accept_rate_pos<i> (i = 1..num_steps), accept_simulated
  health      (mtplab/health.py; stats.py health_columns) draft_tokens (proposed to the
              verifies), draft_tokens_accepted, draft_waste_frac, accept_alarm (a window of
              verify steps accepted < 20% of the run's mean, or nothing),
              accept_alarm_steps_json (its stretches, scheduler iterations), accept_len_ctx<lo>
              (accept length by context bucket, lo = 0, 256, 512, ...), escape_frac (emitted
              tokens outside a hot draft vocabulary; NaN without one); from the bubble meter
              (GPU; NaN on CPU, where there is no device to run ahead of): run_ahead_frac,
              launch_lead_p10_us / _p50_us / _p90_us, run_ahead_steps, and draft_busy_frac
              (the draft stages' share of decode-step busy time, the meter's clock);
              experts_per_verify, experts_per_verify_uniform, experts_per_draft_step (MoE
              targets: distinct experts per layer per verify, and E(1-(1-k/E)^n) for its
              n = bs x D tokens; NaN for a dense target or a dense draft)
  lossless    diverging_requests, first_divergence_tokens (workload check_lossless=True: the
              measured prompts re-run target-only, greedy, same numerics; see mtplab/lossless.py)
  host        host_<stage>_us, host_step_us, host_loop_us, host_replays_per_step,
              host_copies_per_step, host_ops_per_step, host_views_per_step, replay_floor_us,
              host_floor_us (workload host_stages=True; mtplab/sweep/host.py)
  what-if     run_dir holds host_steps.parquet and whatif.json (workload step_profile=True;
              sweep/step_profile.py), read by `mtplab whatif` and studies/whatif/check.py;
              host_period_us, host_busy_us_per_step (the host's own time per decode step:
              the iteration less its waits; host_busy_p50_us_per_step: the median step's),
              latency_us (the predictor's L and W)
  stages      stage_<stage>_ms (median per decode step), stage_sum_gpu_ms, sync_spans_per_step,
              listed_syncs_per_step / listed_syncs_json (sync sites CUDA's sync debug mode
              flagged in decode steps, with debug_syncs=True; NaN / null otherwise)
  bubbles     bubble_frac, bubble_us_per_step, meter_wall_us_per_step, meter_steps: the
              headline, from the bubble meter over the measured generate's decode steps
              (unprofiled; instrument/meter.py; on CPU it stamps the host clock, and
              tables and figures name it so: metrics.meter_name); meter_tok_per_s: decode
              tokens / the meter's decode-step wall summed (every host delay between
              iterations counted, unlike decode_tok_per_s; the regime map and the what-if
              validation compare it);
              bubble_frac_profiled, bubble_<cause>_frac (each cause of
              analysis/causes.py: bubble_sync_frac, ..., bubble_other_frac), bubble_steps,
              device_busy_step_ms, step_profiled_ms, launches_per_step,
              draft_launches_per_step, draft_ops_per_step,
              host_syncs_per_step: from the Kineto trace when profile=True (the profiler
              inflates host time: the where/why view; NaN on CPU, where the trace has no GPU
              lanes)
  kernels     kernels_per_step (GPU activities -- kernels, memcpys, memsets -- starting in a
              profiled decode step's device window, median over the steps),
              kernels_per_layer (GPU activities per decoder layer of the target forward: in
              each profiled decode step's `verify` span, the length of the block of kernel
              names that repeats back to back once per target layer, L - 1 or L times; median
              over the forwards where it is found; analysis/kernels.py): from the trace when
              profile=True; NaN on CPU (no GPU lanes), and kernels_per_layer also where the
              layers do not launch one identical kernel sequence
  environment device_name, git_commit, mtplab_version, torch_version
  paths       run_dir, trace_path, timeline_path, manifest_path, log_path, notebook_path,
              timeline_first_step, timeline_end_step, trace_skip_steps (the timeline
              generate's steps [first, end);
              steps to skip in the trace: 0, it holds profiled steps only -- with
              profile=True the profiler waits through the warm-up and measured generates
              and records extra generates of the same workload, so tok/s and latency are
              never measured under the profiler)

Lazy: `python -m mtplab.sweep.child` and Dask workers import only what a cell's process
needs (no torch before the child has tied itself to its parent, see child.py).
"""
from importlib import import_module

_WHERE = {
    "main_sweep": "cli",
    "Cell": "grid", "Grid": "grid", "Workload": "grid", "grid_from_dict": "grid",
    "load_grid": "grid", "make_cell": "grid",
    "DaskExecutor": "executors", "LocalExecutor": "executors",
    "OutDirLocked": "lock",
    "RESULTS_JSONL": "results", "RESULTS_PARQUET": "results", "collect": "results",
    "run_sweep": "runner",
}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
