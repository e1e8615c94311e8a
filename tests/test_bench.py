"""`mtplab bench`: grid files run by the sweep, the ratio table rendered from results.parquet."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from mtplab.analysis.causes import CAUSES
from mtplab.studies.bench import (GROUPS, REPEAT, SMOKE_NOTE, SMOKE_RATIO, arm_label, effective_doc,
                          grid_doc, table)
from mtplab.sweep import RESULTS_JSONL, RESULTS_PARQUET, grid_from_dict

ROOT = Path(__file__).resolve().parents[1]


def rows_of(text: str) -> list[list[str]]:
    """The body rows of a markdown table, as lists of cells."""
    out = []
    for ln in text.splitlines():
        if ln.startswith("| ") and not ln.startswith("|---"):
            out.append([c.strip() for c in ln.strip().strip("|").split("|")])
    return out[1:]


SWEPT = [g for g in GROUPS if not grid_doc(g).get("runner")]   # `schedule` runs itself


@pytest.mark.parametrize("group", SWEPT)
def test_every_group_is_a_grid_with_interleaved_repeats(group):
    doc = effective_doc(grid_doc(group), smoke=False, repeats=None, bs=None, device="auto")
    assert list(doc["grid"])[0] == REPEAT and doc["grid"][REPEAT] == [0, 1, 2]
    cells = grid_from_dict(doc).cells()
    n_arms = len(doc["arms"])
    # arms are crossed innermost: the first n_arms cells are every arm at one grid point
    for c, arm in zip(cells[:n_arms], doc["arms"]):
        assert {k: c.settings[k] for k in arm} == arm, arm_label(arm)
    for c in cells:        # only the grid's excludes and CUDA-only settings may drop a cell
        assert c.dropped is None or "excluded" in c.dropped or "CUDA" in c.dropped, c.dropped


def test_bench_grids_ship_as_package_data():
    text = (ROOT / "pyproject.toml").read_text()
    assert '"studies/*/*.yaml"' in text


def _record(settings: dict, status="ok", **metrics) -> dict:
    key = json.dumps(settings, sort_keys=True)          # as the sweep runner writes it
    return dict(cell_id=key, status=status, error=metrics.pop("error", ""), settings_json=key,
                **metrics)


def test_ratio_is_against_the_first_arm_of_the_same_grid_point():
    doc = {"grid": {REPEAT: [0, 1], "batch_size": [1, 8]},
           "arms": [{"draft": "none"}, {"draft": "frozen_kv_mtp"}]}
    tps = {(1, "none"): [100, 120, 110], (1, "frozen_kv_mtp"): [200, 240],
           (8, "none"): [400, 400], (8, "frozen_kv_mtp"): [300, 500]}
    recs = []
    for (bs, draft), xs in tps.items():
        for r, x in enumerate(xs):
            recs.append(_record({"repeat": r, "batch_size": bs, "draft": draft},
                                decode_tok_per_s=float(x), accept_len=float("nan"),
                                decode_step_time_p50_ms=2.0, device_busy_step_ms=1.5,
                                bubble_frac=0.25, bubble_frac_profiled=0.3,
                                bubble_sync_frac=0.1,
                                bubble_host_prep_frac=0.05, bubble_launch_frac=0.1,
                                bubble_host_frac=0.02, bubble_other_frac=0.0,
                                kernels_per_step=230.0, kernels_per_layer=12.0,
                                weight_bytes_per_step=4e9, kv_bytes_per_step=2e9))
    recs.append(_record({"repeat": 1, "batch_size": 8, "draft": "eagle"},   # not an arm
                        decode_tok_per_s=1.0))
    got = {(r[0], r[1]): r for r in rows_of(table(pd.DataFrame(recs), doc, bw=2e12))}
    assert set(got) == {("1", "draft=none"), ("1", "draft=frozen_kv_mtp"),
                        ("8", "draft=none"), ("8", "draft=frozen_kv_mtp")}
    assert got[("1", "draft=none")][3] == "100 / 110 / 120"
    assert got[("1", "draft=none")][4] == "1.00x"
    assert got[("1", "draft=frozen_kv_mtp")][4] == f"{220 / 110:.2f}x"
    assert got[("8", "draft=frozen_kv_mtp")][4] == "1.00x"       # 400 vs 400, not vs bs 1
    # the noise verdict of the notebooks: beyond the repeats' spread, or within it
    assert got[("1", "draft=frozen_kv_mtp")][5] == "faster (±18%)"
    assert got[("8", "draft=frozen_kv_mtp")][5] == "within the noise (±50%)"
    assert got[("1", "draft=none")][5] == "-"                      # the baseline itself
    r = got[("8", "draft=none")]
    assert r[2] == "2" and r[8] == "1.00"                          # n repeats; accept len 1
    assert r[9] == "25.0 (10.0/5.0/10.0/2.0/0.0)"                  # meter bubble %; causes
    assert r[10] == "1.500" and r[11] == "75%"                     # bound ms, achieved
    assert r[14] == "230"                                          # kernels per decode step
    assert r[15] == "12"                                           # kernels per decoder layer
    assert r[16] == "3.0000"                     # (4e9 + 2e9 KV) B / 2e12 B/s, per token
    assert r[17] == "3.000 (1.000)"              # floor per step (its KV term)
    assert r[18] == "1.50"                       # floor / step: 3 ms / 2 ms
    assert got[("8", "draft=frozen_kv_mtp")][19] == "1.00x"       # step / the first arm's


def test_an_arm_whose_settings_another_arm_extends_keeps_its_own_rows():
    doc = {"grid": {REPEAT: [0]}, "arms": [{"overlap": False}, {"overlap": True},
                                           {"overlap": True, "zero_bubble": True}]}
    recs = [_record({"repeat": 0, **arm}, decode_tok_per_s=float(x))
            for arm, x in zip(doc["arms"], (100, 150, 300))]
    rows = rows_of(table(pd.DataFrame(recs), doc))
    assert [(r[0], r[3]) for r in rows] == [("overlap=False", "1.00x"), ("overlap=True", "1.50x"),
                                            ("overlap=True zero_bubble=True", "3.00x")]
    assert [r[4] for r in rows] == ["-", "no verdict: one repeat", "no verdict: one repeat"]


def test_failed_and_dropped_cells_show_their_reason_and_excluded_ones_are_left_out():
    doc = {"grid": {REPEAT: [0]}, "arms": [{"overlap": False}, {"overlap": True}]}
    recs = [_record({"repeat": 0, "overlap": False}, status="failed",
                    error="RuntimeError: out of memory"),
            _record({"repeat": 0, "overlap": True}, status="dropped",
                    error="excluded by the grid file: {'overlap': True}")]
    rows = rows_of(table(pd.DataFrame(recs), doc))
    assert len(rows) == 1 and rows[0][1] == "0"
    assert rows[0][2] == "failed: RuntimeError: out of memory"
    # a grid point without its baseline arm has no ratio, and missing figures print "-"
    row = rows_of(table(pd.DataFrame([_record({"repeat": 0, "overlap": True},
                                              decode_tok_per_s=5.0)]), doc))[0]
    assert row[2] == "5 / 5 / 5" and row[3] == "-" and row[8] == "- (-)"


def test_unknown_group_is_one_sentence(capsys):
    from mtplab.studies.bench import main_bench
    assert main_bench(["--groups", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no bench group 'nope'" in err


def test_a_budget_spent_before_any_cell_is_one_sentence(tmp_path, capsys):
    """--budget-s shorter than one cell: no traceback (the empty results table), no table of
    "?" headers: one sentence naming the budget and the resume, exit 2."""
    from mtplab.studies.bench import main_bench
    assert main_bench(["--groups", "fold_seed", "--device", "cpu", "--no-progress",
                       "--dir", str(tmp_path / "bx"), "--budget-s", "0.001"]) == 2
    out = capsys.readouterr()
    err = out.err.strip().splitlines()
    assert err[-1].startswith("mtplab bench: error: the budget (--budget-s 0.001) ran out "
                              "before any cell finished") and "resumes" in err[-1]
    assert "Traceback" not in out.err and "mtplab bench on" not in out.out


def test_gpu_check_whatif_runs_the_ladders_gpu_heavy_rung(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    (fake / "python3").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (fake / "python3").chmod(0o755)
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "-o", str(tmp_path / "o"),
                    "whatif"], env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"},
                   capture_output=True, text=True, check=True)
    args = log.read_text().split()
    assert args[args.index("--groups") + 1] == "regime" and "--quick" in args
    assert args[args.index("--only") + 1:args.index("--only") + 4] == [
        "model=llama3-8b-like", "layers=16", "batch_size=8"]


TINY = """
timeout_s: 300
base: {model: random-tiny, device: cpu, prompt_len_tokens: 16, output_len_tokens: 6,
       warmup_output_len_tokens: 2, profile: true, profile_wait: 1, profile_warmup: 1,
       profile_active: 2}
grid: {repeat: [0, 1], batch_size: [2]}
arms: [{overlap: false}, {overlap: true}]
"""


@pytest.mark.slow
def test_tiny_grid_table_is_rendered_from_results_parquet_and_resumes(tmp_path):
    grid = tmp_path / "tiny.yaml"
    grid.write_text(TINY)
    out = tmp_path / "bench.md"
    cmd = [sys.executable, "-m", "mtplab.cli", "bench", "--groups", str(grid), "--device", "cpu",
           "--repeats", "2", "--dir", str(tmp_path / "b"), "--out", str(out), "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    res = tmp_path / "b" / "tiny"
    df = pd.read_parquet(res / RESULTS_PARQUET)
    assert (df["status"] == "ok").all() and len(df) == 4
    # the arms interleave: repeat 0 (off, on), then repeat 1 (off, on)
    order = [(json.loads(s)["repeat"], json.loads(s)["overlap"]) for s in df["settings_json"]]
    assert order == [(0, False), (0, True), (1, False), (1, True)]
    import yaml
    doc = yaml.safe_load((res / "grid.yaml").read_text())
    assert table(df, doc) in text                        # the printed table is the frame's
    rows = rows_of(table(df, doc))
    assert [r[1] for r in rows] == ["overlap=False", "overlap=True"]
    assert rows[0][4] == "1.00x" and rows[0][2] == "2"
    n_lines = len((res / RESULTS_JSONL).read_text().splitlines())
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0 and len((res / RESULTS_JSONL).read_text().splitlines()) == n_lines


@pytest.mark.slow
def test_bench_smoke_runs_every_group_on_cpu(tmp_path):
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, "-m", "mtplab.cli", "bench", "--smoke", "--device", "cpu",
                        "--dir", str(tmp_path / "b"), "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=1800, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    text = out.read_text()
    for g in SWEPT:
        assert f"### {g} (repeats 1)" in text
        assert (tmp_path / "b" / g / RESULTS_PARQUET).is_file()
    assert "### schedule" in text and (tmp_path / "b" / "schedule" / "results.json").is_file()
    assert "failed:" not in text
    dropped = [ln for ln in text.splitlines() if "dropped:" in ln]
    assert all("CUDA" in ln for ln in dropped)           # only the CUDA-graph arm, on CPU
    assert re.search(r"\| draft=frozen_kv_mtp fold_seed=True \| 1 \| [\d.,]+ / ", text)
    assert SMOKE_NOTE in text and SMOKE_RATIO in text             # path checks, not results


def test_benchmarks_readme_lists_every_script():
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")
                     if p.name != "__init__.py")
    assert scripts
    missing = [s for s in scripts if f"benchmarks/{s}" not in readme]
    assert not missing, f"benchmarks/README.md does not list {missing}"


# the path a clone does not have (split: this file is checked too)
OUTSIDE = "../" + "shared"


def test_gpu_check_lists_its_phases_and_refuses_an_unknown_one(tmp_path):
    script = ROOT / "scripts" / "gpu_check.sh"
    text = script.read_text()
    phases = re.findall(r"^phase_(\w+)\(\)", text, re.M)
    assert {"tests", "bench", "stages", "notebooks"} <= set(phases)
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                       env={**os.environ, "OUT": str(tmp_path / "g")})
    assert r.returncode == 2
    assert not (tmp_path / "g").exists()                  # a usage error writes nothing
    for p in phases:                      # every phase documents itself in the usage
        assert re.search(rf"^  {p}  ", r.stdout, re.M), p
    r = subprocess.run(["bash", str(script), "-o", str(tmp_path), "tests", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown phase 'nope'" in r.stdout
    assert not (tmp_path / "tests.log").exists()          # nothing ran
    assert OUTSIDE not in text


def test_gpu_check_regime_runs_the_quick_ladder_unless_told_the_whole_one(tmp_path):
    """The regime phase passes --quick by default; REGIME_QUICK=0 drops it, so REGIME_ONLY can
    pick rungs of the whole ladder (llama3-8b-like@32 with 8k prompts is not in the quick one)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    (fake / "python3").write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    (fake / "python3").chmod(0o755)
    script = ROOT / "scripts" / "gpu_check.sh"

    def bench_args(**env):
        log.write_text("")
        subprocess.run(["bash", str(script), "-o", str(tmp_path / "out"), "regime"],
                       env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", **env},
                       capture_output=True, text=True, check=True)
        return [ln for ln in log.read_text().splitlines() if "--groups regime" in ln][0].split()

    assert "--quick" in bench_args()
    args = bench_args(REGIME_QUICK="0", REGIME_ONLY="layers=32 batch_size=8")
    assert "--quick" not in args
    assert args[args.index("--only") + 1:args.index("--only") + 3] == ["layers=32", "batch_size=8"]


def test_stage_sum_and_bubble_columns_of_the_bench_table():
    from mtplab.instrument.timeline import COLUMNS
    from mtplab.sweep.metrics import bubble_columns, stage_metrics
    nan = float("nan")
    tl = pd.DataFrame([
        (0, "step[decode bs=1]", "host", 0, 100, nan, nan),
        (0, "verify", "forward", 0, 10, 0.0, 3000.0),       # 3 ms
        (0, "draft", "forward", 10, 20, 3000.0, 4000.0),    # 1 ms
        (0, "schedule", "host", 20, 30, nan, nan),          # host lane: not GPU time
        (1, "step[decode bs=1]", "host", 100, 200, nan, nan),
        (1, "verify", "forward", 100, 110, 5000.0, 7000.0),  # 2 ms
        (2, "step[decode bs=1]", "host", 200, 300, nan, nan),
        (2, "verify", "forward", 200, 210, 8000.0, 9000.0),  # 1 ms
    ], columns=COLUMNS)
    m = stage_metrics(tl, 0)
    assert m["stage_sum_gpu_ms"] == pytest.approx(2.0)      # median of 4, 2, 1 ms per step
    assert m["stage_verify_ms"] == pytest.approx(2.0)
    cpu = tl.assign(gpu_start_us=nan, gpu_end_us=nan)
    assert math.isnan(stage_metrics(cpu, 0)["stage_sum_gpu_ms"])
    steps = pd.DataFrame({"dur_us": [1000.0, 3000.0], "busy_us": [600.0, 1800.0],
                          "bubble_us": [400.0, 1200.0],
                          **{f"bubble_{c}_us": [100.0, 300.0]
                             for c in CAUSES}})
    b = bubble_columns(steps, has_device=True)
    assert b["bubble_frac_profiled"] == pytest.approx(0.4)
    assert b["bubble_sync_frac"] == pytest.approx(0.1)
    assert b["device_busy_step_ms"] == pytest.approx(1.2) and b["step_profiled_ms"] == 2.0
    assert b["bubble_steps"] == 2
    off = bubble_columns(steps, has_device=False)            # a CPU trace: no device figures
    assert math.isnan(off["bubble_frac_profiled"]) and math.isnan(off["device_busy_step_ms"])


def test_every_results_question_the_index_names_has_a_folder():
    """benchmarks/README.md names, per script, the question whose dated reports it feeds."""
    from mtplab.studies import QUESTIONS
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    named = {n for row in readme.splitlines() if row.startswith("| ")
             for n in re.findall(r"`([a-z_]+)`", row.rsplit("|", 2)[-2])}
    assert named
    missing = [n for n in named if n not in QUESTIONS or
               not (ROOT / "docs" / "results" / n).is_dir()]
    assert not missing, f"no question folder docs/results/{missing}"


def test_a_target_only_zero_bubble_arm_survives_the_sweeps_re_resolution():
    """The sweep places a resolved config (dataclasses.replace runs validation again): a
    target-only arm with zero_bubble, as in the drafts and overlap groups, must stay valid."""
    from dataclasses import replace

    from mtplab.config import RunConfig
    cfg = RunConfig(model="random-tiny", device="cpu", overlap=True, zero_bubble=True)
    again = replace(cfg, run_name="placed")
    assert again.zb_device_seq_lens and again.zb_async_d2h and not again.zb_draft_preexec


def test_host_table_gives_stage_us_counts_and_the_floor_per_arm():
    doc = {"base": {"host_stages": True}, "grid": {REPEAT: [0, 1], "batch_size": [1]},
           "arms": [{"overlap": False}, {"overlap": True}]}
    recs = []
    for r in (0, 1):
        for ov, step in ((False, 300.0), (True, 200.0)):
            recs.append(_record({"host_stages": True, "batch_size": 1, "overlap": ov, REPEAT: r},
                                host_step_us=step + 2 * r, host_schedule_us=10.0,
                                host_verify_us=20.0, host_draft_us=0.0, host_loop_us=50.0,
                                host_replays_per_step=2.0, host_copies_per_step=1.0,
                                host_ops_per_step=3.0, host_floor_us=10.0))
    text = table(pd.DataFrame(recs), doc)
    rows = rows_of(text)
    head = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert "draft µs" not in head and "schedule µs" in head and "verify µs" in head
    assert [r[1] for r in rows] == ["overlap=False", "overlap=True"]
    assert rows[0][2] == "2" and rows[0][3] == "301" and rows[1][3] == "201"   # median of 2
    assert rows[1][-1] == "20.1x" and rows[1][-5] == "2.00" and rows[1][4] == "-"


def test_regime_report_names_the_cells_whose_clocks_disagree():
    from mtplab.studies.bench import _suspect_cells
    df = pd.DataFrame({"status": ["ok", "ok", "ok", "failed"],
                       "cell_id": ["a", "b", "c", "d"],
                       "decode_tok_per_s": [100.0, 190.0, 400.0, 900.0],
                       "meter_tok_per_s": [98.0, 100.0, 100.0, 1.0],
                       "host_delay_us": [0, 0, 1000, 0]}, index=[5, 5, 6, 7])
    (line,) = _suspect_cells(df)        # c: a planted delay; d: not ok
    assert line.startswith("suspect: 1 cell(s)") and line.endswith(": b 1.90x")
    assert _suspect_cells(df[df["cell_id"] != "b"]) == []
    # on CPU the meter stamps the host clock: no GPU whose results the host could read early
    assert _suspect_cells(df.assign(**{"cfg.device": "cpu"})) == []
    assert _suspect_cells(df.assign(**{"cfg.device": ["cpu", "cuda", "cuda", "cuda"]}))


def test_bench_labels_each_groups_bar_and_closes_over_every_group(tmp_path, monkeypatch):
    """Each group's progress bar names its group, and the closing line counts the cells of
    every group, not the last one's."""
    from mtplab.studies import bench
    seen = []

    def fake_sweep(cells, out, **kw):
        seen.append(kw["label"])
        status = ["ok", "failed"] if out.name == "a" else ["ok", "dropped", "ok"]
        return pd.DataFrame({"cell_id": [c.cell_id for c in cells][:len(status)],
                             "status": status})

    monkeypatch.setattr("mtplab.sweep.run_sweep", fake_sweep)
    cell = lambda i: type("C", (), {"cell_id": f"c{i}"})()      # noqa: E731
    doc = {"grid": {REPEAT: [0]}, "arms": [{}]}
    frames = {g: bench.run_group(doc, [cell(i) for i in range(3)], tmp_path / g, None)
              for g in ("a", "b")}
    assert seen == ["bench a", "bench b"]
    line = bench.closing_line(frames, tmp_path)
    assert line.startswith("2 group(s) (a, b): 3 ok, 1 failed, 1 dropped;")


def test_gpu_check_tests_shares_the_gpu_between_workers_when_xdist_is_there(tmp_path):
    """With pytest-xdist importable, the tests phase runs tests/gpu in GPU_TEST_WORKERS
    processes without the serial files, then those alone; without it, one plain run."""
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls.log"
    script = ROOT / "scripts" / "gpu_check.sh"

    def calls(has_xdist: bool, **env):
        (fake / "python3").write_text(
            f'#!/bin/sh\nif [ "$1" = "-c" ]; then exit {0 if has_xdist else 1}; fi\n'
            f'echo "$*" >> {log}\n')
        (fake / "python3").chmod(0o755)
        log.write_text("")
        subprocess.run(["bash", str(script), "-o", str(tmp_path / "out"), "tests"],
                       env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", **env},
                       capture_output=True, text=True, check=True)
        return [ln for ln in log.read_text().splitlines() if "pytest" in ln]

    par, ser = calls(True, GPU_TEST_WORKERS="3")
    assert " -n 3 tests/gpu " in f" {par} "
    serial = ["tests/gpu/test_meter_gpu.py", "tests/gpu/test_overlap_hides_host_gpu.py",
              "tests/gpu/test_lifetime_gpu.py"]
    assert all(f"--ignore={f}" in par for f in serial)
    assert ser.split()[-3:] == serial
    (plain,) = calls(False)
    assert plain.endswith("-m pytest -q -p no:cacheprovider tests/gpu")
