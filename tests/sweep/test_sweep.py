"""Sweeps on CPU: isolation of a failing cell, resume, the results table, dropped cells,
timeouts, papermill cells, and the per-stage figures."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from mtplab.config import RunConfig
from mtplab.sweep import (
    RESULTS_JSONL,
    RESULTS_PARQUET,
    grid_from_dict,
    main_sweep,
    make_cell,
    run_sweep,
)
from mtplab.sweep.metrics import stage_metrics

# The documented columns of results.parquet (mtplab/sweep/__init__.py), units in the names.
DOCUMENTED = [
    "cell_id", "status", "error", "cell_wall_s", "settings_json",
    "cfg.model", "cfg.draft", "cfg.page_size", "cfg.topk", "cfg.num_steps", "cfg.overlap",
    "cfg.device", "cfg.max_running_requests",
    "kv_alloc_per_decode_tokens", "kv_reserved_per_req_tokens", "kv_row_width_tokens",
    "batch_size", "num_requests", "prompt_len_tokens", "output_len_tokens",
    "warmup_output_len_tokens", "temperature",
    "requests", "tokens", "wall_s", "tok_per_s", "decode_tok_per_s", "steps", "decode_steps",
    "step_time_p50_ms", "decode_step_time_p50_ms", "itl_p50_ms", "itl_p99_ms", "tpot_p50_ms",
    "tpot_p90_ms", "accept_len", "accept_rate_pos1", "accept_rate_pos3", "accept_simulated",
    "stage_verify_ms", "sync_spans_per_step", "listed_syncs_per_step", "listed_syncs_json",
    "bubble_frac", "bubble_us_per_step", "bubble_frac_profiled", "bubble_sync_frac",
    "bubble_host_prep_frac", "bubble_launch_frac", "bubble_host_frac", "bubble_other_frac",
    "bubble_steps", "launches_per_step", "draft_launches_per_step",
    "draft_ops_per_step", "host_syncs_per_step", "kernels_per_step", "kernels_per_layer",
    "device_name", "git_commit", "mtplab_version", "torch_version",
    "run_dir", "trace_path", "timeline_path", "manifest_path", "log_path",
    "timeline_first_step", "trace_skip_steps",
]

GRID = {
    "base": {"model": "random-tiny", "draft": "frozen_kv_mtp", "simulate_accept_len": 2.5,
             "context_len": 128, "prompt_len_tokens": 8, "output_len_tokens": 12,
             "device": "cpu", "profile": True},
    "grid": {"batch_size": [1, 2], "page_size": [1, 4, 3]},     # page_size 3: dropped
    # one failing cell (the arm pins the axes, so all its points are one cell)
    "arms": [{}, {"fail": True, "batch_size": 1, "page_size": 1}],
}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    grid = root / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    out = root / "out"
    rc = main_sweep([str(grid), "--out", str(out), "--no-progress"])
    return grid, out, rc


def test_failing_cell_leaves_the_others(swept):
    _, out, rc = swept
    assert rc == 1                                  # a failed cell: exit 1
    df = pd.read_parquet(out / RESULTS_PARQUET)
    assert len(df) == 7 and df["cell_id"].is_unique
    assert df["status"].value_counts().to_dict() == {"ok": 4, "dropped": 2, "failed": 1}
    bad = df[df["status"] == "failed"].iloc[0]
    assert "fail=True" in bad["error"] and bad["fail"]
    ok = df[df["status"] == "ok"]
    assert (ok["error"] == "").all()
    for r in ok.itertuples():
        assert Path(r.trace_path).is_file() and Path(r.timeline_path).is_file()
        assert Path(r.manifest_path).is_file() and Path(r.run_dir).name == r.cell_id
    assert len((out / RESULTS_JSONL).read_text().splitlines()) == 7


def test_dropped_cells_have_their_reason(swept):
    _, out, _ = swept
    df = pd.read_parquet(out / RESULTS_PARQUET)
    dropped = df[df["status"] == "dropped"]
    assert len(dropped) == 2
    assert all("power of two" in e for e in dropped["error"])
    assert set(dropped["cfg.page_size"].astype(int)) == {3}


def test_results_table_columns_and_values(swept):
    _, out, _ = swept
    df = pd.read_parquet(out / RESULTS_PARQUET)
    missing = [c for c in DOCUMENTED if c not in df.columns]
    assert not missing, missing
    ok = df[df["status"] == "ok"]
    assert (ok["tok_per_s"] > 0).all() and (ok["decode_tok_per_s"] > 0).all()
    assert ok["accept_simulated"].all()
    assert ((ok["accept_len"] >= 1) & (ok["accept_len"] <= 4)).all()
    # a chunk carries accept_len tokens, so a token takes less than a chunk interval
    assert (ok["tpot_p50_ms"] < ok["itl_p50_ms"]).all() and (ok["itl_p50_ms"] > 0).all()
    assert (ok["itl_p99_ms"] >= ok["itl_p50_ms"]).all()
    assert ok["bubble_frac_profiled"].isna().all()  # CPU: no GPU lanes in the trace
    assert ok["kernels_per_step"].isna().all() and ok["kernels_per_layer"].isna().all()
    assert ((ok["bubble_frac"] > 0) & (ok["bubble_frac"] < 1)).all()   # the meter: host clock
    assert (ok["meter_steps"] > 0).all()
    assert (ok["bubble_steps"] > 0).all() and (ok["requests"] == ok["batch_size"]).all()
    assert (ok["cfg.max_running_requests"] == ok["batch_size"]).all()
    for _, r in ok.iterrows():
        cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", device="cpu",
                        context_len=128, page_size=int(r["cfg.page_size"]))
        assert r["kv_reserved_per_req_tokens"] == cfg.reserve_per_decode
        assert r["kv_row_width_tokens"] == cfg.row_width
        assert r["tokens"] == r["batch_size"] * 12


def test_rerun_skips_done_cells(swept):
    grid, out, _ = swept
    df0 = pd.read_parquet(out / RESULTS_PARQUET)
    ok = df0[df0["status"] == "ok"]
    stamps = {p: Path(p).stat().st_mtime_ns for p in ok["trace_path"]}
    n0 = len((out / RESULTS_JSONL).read_text().splitlines())
    assert main_sweep([str(grid), "--out", str(out), "--no-progress",
                       "--no-retry-failed"]) == 1                  # the grid still has one

    assert len((out / RESULTS_JSONL).read_text().splitlines()) == n0     # nothing ran
    assert main_sweep([str(grid), "--out", str(out), "--no-progress"]) == 1
    assert len((out / RESULTS_JSONL).read_text().splitlines()) == n0 + 1  # the failed one
    assert {p: Path(p).stat().st_mtime_ns for p in ok["trace_path"]} == stamps
    df1 = pd.read_parquet(out / RESULTS_PARQUET)
    assert len(df1) == len(df0)
    pd.testing.assert_series_equal(df1.set_index("cell_id")["tok_per_s"].loc[ok["cell_id"]],
                                   ok.set_index("cell_id")["tok_per_s"])


def test_cell_ids_are_stable_and_location_free():
    s = {"model": "random-tiny", "device": "cpu", "batch_size": 2}
    a, b = make_cell(s), make_cell(dict(s, trace_dir="elsewhere", run_name="x"))
    assert a.cell_id == b.cell_id == make_cell(dict(s)).cell_id
    assert make_cell(dict(s, batch_size=3)).cell_id != a.cell_id
    # an explicit default resolves to the same cell
    assert make_cell(dict(s, page_size=1)).cell_id == a.cell_id


def test_invalid_settings_drop_the_cell():
    assert "unknown settings ['bogus']" in make_cell({"bogus": 1}).dropped
    assert make_cell({"bogus": 1}, notebook="nb.ipynb").dropped is None
    assert "positive integer" in make_cell({"batch_size": 0}).dropped
    assert "exceeds context_len" in make_cell({"context_len": 16, "prompt_len_tokens": 16}).dropped
    g = grid_from_dict({"grid": {"page_size": [1, 2]}, "exclude": [{"page_size": 2}]})
    assert [c.dropped is not None for c in g.cells()] == [False, True]


def test_timeout_marks_the_cell_failed(tmp_path):
    cells = grid_from_dict({"base": {"device": "cpu", "output_len_tokens": 4}}).cells()
    df = run_sweep(cells, tmp_path, timeout_s=0.3, progress=False)
    assert df["status"].tolist() == ["failed"] and "timed out" in df["error"].iloc[0]


@pytest.mark.slow
def test_notebook_sweep_isolates_a_failing_notebook(tmp_path):
    pytest.importorskip("papermill")
    pytest.importorskip("ipykernel")
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('x = 1\nout_dir = "."')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(
        "import json, pathlib\n"
        "if x == 2:\n    raise ValueError('boom')\n"
        "pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)\n"
        "(pathlib.Path(out_dir) / 'answer.json').write_text(json.dumps({'y': 10 * x}))")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"base": {"device": "cpu"}, "grid": {"x": [1, 2, 3]}}))
    out = tmp_path / "out"
    assert main_sweep(["--notebook", str(path), str(grid), "--out", str(out),
                       "--no-progress"]) == 1
    df = pd.read_parquet(out / RESULTS_PARQUET).set_index("param.x")
    assert df["status"].to_dict() == {1: "ok", 2: "failed", 3: "ok"}
    assert "ValueError: boom" in df.loc[2, "error"]
    assert df.loc[1, "nb.y"] == 10 and df.loc[3, "nb.y"] == 30
    for cid in df["cell_id"]:
        assert (out / "notebooks" / f"{cid}.ipynb").is_file()


def test_stage_metrics_per_decode_step():
    # steps 0-1 warm-up; measured: prefill (step 2) then decodes 3, 4, 5
    names = {0: "step[prefill bs=2]", 1: "step[decode bs=2]", 2: "step[prefill bs=2]",
             3: "step[decode bs=2]", 4: "step[decode bs=2]", 5: "step[decode bs=1]"}
    rows = [(s, n, "host", 1000.0 * s, 1000.0 * s + 900, np.nan, np.nan) for s, n in names.items()]
    rows += [(1, "verify", "forward", 1000.0, 1900.0, np.nan, np.nan),      # warm-up: ignored
             (3, "verify", "forward", 3000.0, 3500.0, np.nan, np.nan),
             (4, "verify", "forward", 4000.0, 4300.0, np.nan, np.nan),
             (4, "verify", "forward", 4400.0, 4500.0, np.nan, np.nan),      # summed per step
             (4, "sync", "host", 4600.0, 4700.0, np.nan, np.nan),
             (5, "verify", "forward", 5000.0, 5000.0, 0.0, 2000.0)]         # GPU clock wins
    tl = pd.DataFrame(rows, columns=["step", "stage", "stream", "host_start_us", "host_end_us",
                                     "gpu_start_us", "gpu_end_us"])
    m = stage_metrics(tl, first_step=2)
    assert math.isclose(m["stage_verify_ms"], 0.5)          # median of 0.5, 0.4, 2.0
    assert math.isclose(m["stage_sync_ms"], 0.0)            # median of 0, 0.1, 0
    assert math.isclose(m["sync_spans_per_step"], 1 / 3)
    assert json.dumps(m)


def test_stage_shares_add_up_with_the_time_between_stages():
    """Notebook 00's table: each instant of a decode step goes to one outermost stage (split
    where lanes overlap) or to `other / between stages`, so the shares add up to 1; a span
    inside another of its lane (draft.step in draft) is that one's time."""
    from mtplab.sweep.metrics import OTHER_STAGE, stage_shares
    cols = ["step", "stage", "stream", "host_start_us", "host_end_us", "gpu_start_us",
            "gpu_end_us"]
    rows = [(0, "step[prefill bs=2]", "host", 0.0, 500.0, np.nan, np.nan),
            (0, "verify", "forward", 0.0, 400.0, np.nan, np.nan)]      # before the range
    for k in (1, 2):                                                  # CPU: the host clock
        t = 1000.0 * k
        rows += [(k, "step[decode bs=2]", "host", t, t + 1000, np.nan, np.nan),
                 (k, "schedule", "host", t, t + 100, np.nan, np.nan),
                 (k, "draft", "forward", t + 200, t + 400, np.nan, np.nan),
                 (k, "draft.step", "forward", t + 250, t + 350, np.nan, np.nan),
                 (k, "verify", "forward", t + 400, t + 800, np.nan, np.nan),
                 (k, "d2h", "copy", t + 700, t + 800, np.nan, np.nan),   # beside verify
                 (k, "process_result", "host", t + 900, t + 950, np.nan, np.nan)]
    tab = stage_shares(pd.DataFrame(rows, columns=cols), first_step=1)
    ms = tab["ms_per_decode_step"]
    assert math.isclose(tab["share_of_step"].sum(), 1.0)
    assert math.isclose(ms.sum(), 1.0)                               # the 1 ms step
    assert list(tab.index)[-1] == OTHER_STAGE and "draft.step" not in tab.index
    assert math.isclose(ms["draft"], 0.2) and math.isclose(ms["schedule"], 0.1)
    assert math.isclose(ms["verify"], 0.35) and math.isclose(ms["d2h"], 0.05)
    assert math.isclose(ms[OTHER_STAGE], 0.25)           # 100-200, 800-900, 950-1000
    # with GPU times: the device lanes on the GPU clock, host stages beside them left out
    gpu = [(1, "step[decode bs=2]", "host", 0.0, 50.0, np.nan, np.nan),
           (1, "schedule", "host", 0.0, 40.0, np.nan, np.nan),
           (1, "verify", "forward", 0.0, 1.0, 100.0, 400.0),
           (1, "accept", "forward", 0.0, 1.0, 500.0, 600.0)]
    g = stage_shares(pd.DataFrame(gpu, columns=cols), first_step=1)
    assert "schedule" not in g.index and math.isclose(g["share_of_step"].sum(), 1.0)
    assert math.isclose(g.loc[OTHER_STAGE, "ms_per_decode_step"], 0.1)
    assert stage_shares(pd.DataFrame(gpu, columns=cols), first_step=2).empty


def test_profiled_cell_measures_outside_the_profiler(tmp_path):
    """tok/s comes from a generate the profiler never touched; the trace holds exactly the
    profiled steps of the extra generates (none of the warm-up or measured ones)."""
    from mtplab.analysis.trace_io import load_trace
    from mtplab.sweep.grid import Workload
    from mtplab.sweep.measure import measure

    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", profile=True, profile_wait=3,
                    profile_warmup=1, profile_active=4, event_timeline=True,
                    max_running_requests=2, trace_dir=str(tmp_path), run_name="cell")
    row = measure(cfg, Workload(batch_size=2, output_len_tokens=12))
    assert row["tok_per_s"] > 0 and row["trace_skip_steps"] == 0
    tr = load_trace(row["trace_path"])
    steps = tr.name_mask(lambda s: s.startswith("step[")) & tr.cat_mask("user_annotation")
    assert int(steps.sum()) == 4
    assert not math.isnan(row["stage_verify_ms"])


def test_measured_generate_runs_without_spans(tmp_path):
    """The timed generate emits no span (event pairs cost GPU time); the stage times come from
    the generate after it, whose steps the timeline holds."""
    import pandas as pd

    from mtplab.sweep.grid import Workload
    from mtplab.sweep.measure import measure

    cfg = RunConfig(model="random-tiny", draft="frozen_kv_mtp", event_timeline=True,
                    max_running_requests=2, trace_dir=str(tmp_path), run_name="cell")
    row = measure(cfg, Workload(batch_size=2, output_len_tokens=12, warmup_output_len_tokens=4))
    tl = pd.read_parquet(row["timeline_path"])
    first = row["timeline_first_step"]
    spanned = set(tl["step"])
    before = sorted(x for x in spanned if x < first)        # the warm-up generate's steps
    timed = range(before[-1] + 1, first)                    # the measured generate's steps
    assert len(timed) == row["steps"] > 0
    assert not spanned & set(timed)
    assert {first, first + row["steps"] - 1} <= spanned     # the timeline generate: spanned
    assert not math.isnan(row["stage_verify_ms"])


def test_spans_paused_holds_sampled_steps_too():
    from mtplab.instrument.spans import NO_SPANS, Spans

    sp = Spans(enabled=True, timeline=None, annotate=False, sample_every=4)
    with sp.paused():
        sp.begin_step(8)                                    # a sampled step
        assert sp.stage("verify") is NO_SPANS.stage("verify")
    sp.begin_step(8)
    assert sp.enabled


def test_profiler_hold_keeps_the_schedule_waiting(tmp_path):
    from mtplab import Engine

    eng = Engine(RunConfig(model="random-tiny", profile=True, profile_wait=2, profile_warmup=1,
                           profile_active=2, trace_dir=str(tmp_path)))
    with eng.profiler.held():
        eng.generate([[5, 6, 7]], max_new_tokens=6, ignore_eos=True)
    assert eng.profiler.steps == 0
    eng.generate([[5, 6, 7]], max_new_tokens=6, ignore_eos=True)
    assert eng.profiler.steps > 2
    eng.check_invariants()
    with pytest.raises(RuntimeError, match="past its wait phase"):
        with eng.profiler.held():
            pass
    eng.finish()
