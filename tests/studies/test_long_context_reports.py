"""The dense-floor report of question `long_context` (studies/long_context/floor_report.py),
rendered from synthetic results docs: a missed target shows where each microsecond of its
step goes, a met one its PASS; `mtplab report long_context --check` regenerates it byte for
byte; a malformed results file is one ConfigError."""
from __future__ import annotations

import json

import pytest

from mtplab.errors import ConfigError
from mtplab.studies import reports as R
from mtplab.studies import study
from mtplab.studies.cli import main_report
from mtplab.studies.long_context import floor_report as F

BW = 4.0e12
GB = 1e9


def _layer() -> list:
    """One decoder layer's activities, launch order, µs (as a fused llama step runs them)."""
    return [["nvjet_tst_128x8_64x4_2x1_v_bz_TNT", 16.0],          # qkv
            ["_rope_kv_kernel", 3.0],
            ["_split_kernel", 5.0], ["_split_reduce_kernel", 1.0],
            ["nvjet_tst_64x8_64x4_2x1_v_bz_TNT", 12.0],            # o_proj
            ["_add_rmsnorm_kernel", 2.0],
            ["sm90_xmma_gemm_bf16bf16_bf16f32", 50.0],              # gate_up
            ["splitKreduce_kernel", 1.0],
            ["_silu_mul_kernel", 2.0],
            ["nvjet_tst_256x8_64x4_2x1_v_bz_TNT", 30.0],           # down
            ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<int>>",
             1.0]]


def _kernels(layers: int = 2) -> list:
    return (sum((_layer() for _ in range(layers)), [])
            + [["_add_rmsnorm_kernel", 2.0], ["nvjet_tst_lm_head", 40.0],
               ["_argmax_kernel", 3.0], ["Memcpy DtoH (Device -> Pinned)", 2.0]])


def _step(model, arm, ctx, bs, ms, floor_ms, topk=1, D=None, kv_ms=0.0):
    return {"figure": "x", "model": model, "arm": arm, "ctx": ctx, "bs": bs, "ms": ms,
            "floor_bytes": floor_ms * BW / 1e3, "kv_bytes": kv_ms * BW / 1e3,
            "weight_bytes": (floor_ms - kv_ms) * BW / 1e3, "topk": topk, "draft_tokens": D}


def _doc() -> dict:
    doc = F.new_doc(new_tokens=48, windows=3, warmup_steps=4)
    doc["bandwidth"] = [BW, 0.99 * BW, 1.01 * BW]
    m, lm = "llama3-8b-like@32", "llama3.1-8b-like@32"
    doc["steps"] = [
        _step(m, "target", 64, 1, [0.40, 0.41, 0.40], 0.30),        # 0.75: MISS
        _step(m, "target", 64, 8, [0.33, 0.33, 0.332], 0.30),       # 0.91: PASS
        _step(lm, "target", 32768, 1, [0.50, 0.50, 0.505], 0.44, kv_ms=0.1),   # 0.88: PASS
        _step(lm, "frozen_kv_mtp topk 1", 32768, 1, [0.68, 0.68, 0.69], 0.60, kv_ms=0.2),
        _step(lm, "frozen_kv_mtp topk 1", 8192, 1, [0.6, 0.6, 0.6], 0.55),  # no target base
    ]
    doc["kernels"] = [{"label": f"target-only {m}", "model": m, "arm": "target", "topk": 1,
                       "ctx": 64, "bs": 1, "layers": 2, "steps": 1, "kernels": _kernels(),
                       "proj_bytes": {"qkv": 0.012 * GB, "o_proj": 0.0084 * GB,
                                      "gate_up": 0.15 * GB, "down": 0.075 * GB,
                                      "lm_head": 0.13 * GB}}]
    doc["figures"] = {"short": {"status": "done", "seconds": 30.0},
                      "llama": {"status": "done", "seconds": 80.0},
                      "gemma": {"status": "skipped", "left_s": 12.0}}
    return R.plain(R.stamped(doc, date="2026-11-29", device="h200",
                               device_name="NVIDIA H200", commit="abc1234",
                               command="python -m benchmarks.bench_long_context"))


def test_kernels_are_labelled_by_kind_and_gemms_by_projection():
    labels = [lab for _, lab, _ in F.label_kernels(_kernels(), layers=2, steps=1)]
    gemms = [lab for lab in labels if lab.startswith("gemm")]
    assert gemms == (["gemm qkv", "gemm o_proj", "gemm gate_up", "gemm gate_up", "gemm down"]
                     * 2 + ["gemm lm_head"])           # the split-K reduce joins its GEMM
    assert labels[1:4] == ["norm_rope_elementwise", "attention", "attention"]
    assert labels[-1] == "fill_copy" and labels[10] == "fill_copy"     # the FillFunctor
    assert labels[-2] == "other"                                       # argmax
    # a GEMM count that is not 4 per layer + the LM head (a spec step): no projection
    odd = F.label_kernels(_kernels()[:-4], layers=2, steps=1)
    assert {lab for _, lab, _ in odd if lab.startswith("gemm")} == {"gemm"}


def test_a_missed_target_shows_its_breakdown_and_a_met_one_its_pass(tmp_path):
    doc = _doc()
    path = R.write(doc, study("long_context").render, tmp_path)
    md = path.read_text()
    assert path == tmp_path / "long_context" / "2026-11-29_h200_abc1234.md"
    answer = R.answer_line(path)
    assert "0.750 ±2.5% MISS at llama3-8b-like@32 ctx 64 bs 1" in answer
    assert "0.909 ±2.0% PASS at llama3-8b-like@32 ctx 64 bs 8" in answer
    assert "1.360 ±2.0% MISS (<= 1.25; floors 1.364) for topk 1 bs 1" in answer
    assert "not measured: gemma (skipped)" in answer
    where = md.split("## Where the time goes")[1]
    assert "- llama3-8b-like@32 target ctx 64 bs 8: PASS (0.909 ±2.0%)" in where
    assert "- llama3.1-8b-like@32 target ctx 32768 bs 1: PASS" in where
    miss = where.split("### llama3-8b-like@32 target ctx 64 bs 1: MISS (0.750 ±2.5%)")[1]
    # qkv: 2 x 16 µs for 12 MB at 4 TB/s: 0.012e9 / 32e-6 / 4e12 = 0.09 of copy bandwidth
    assert "| GEMMs qkv | 2 | 32.0 | 8.0% | 0.012 GB, 0.09 |" in miss
    assert "| GEMMs gate_up | 4 | 102.0 |" in miss
    assert "| attention | 4 | 12.0 |" in miss
    assert "| fills / copies | 3 | 4.0 |" in miss
    busy = sum(us for _, us in _kernels())
    assert f"| gaps (step - kernels busy) | - | {400 - busy:.1f} |" in miss
    # the spec row missed with no kernel table: said so, not hidden, with its floors:
    # 0.60 ms against 0.44 ms of bytes, 1.364x before any kernel runs
    assert "frozen_kv_mtp topk 1 ctx 32768 bs 1: MISS (1.360 ±2.0%); no kernel table was " \
           "measured for this cell. At their floors the spec step takes 0.600 ms and the " \
           "target step 0.440 ms: 1.364x from the bytes alone, against the target <= 1.25. " \
           "The spec step runs at 0.882 of its floor, the target step at 0.880 of its." in where
    assert "| llama3.1-8b-like@32 | frozen_kv_mtp topk 1 | 32768 | 1 | 0.680 | 0.500 | " \
           "1.360 ±2.0% | 1.364 | 0.882 | <= 1.25 | MISS |" in md
    assert "| 8192 |" not in md.split("## Spec step")[1]    # no target step at 8k: no ratio
    assert "- gemma: SKIPPED (time box: 12 s left)" in md


def test_the_cli_regenerates_it_byte_for_byte(tmp_path, capsys):
    path = R.write(_doc(), study("long_context").render, tmp_path)
    assert main_report(["long_context", "--root", str(tmp_path)]) == 0      # the index
    assert main_report(["long_context", "--root", str(tmp_path), "--check"]) == 0
    text = path.read_text()
    path.write_text(text.replace("MISS", "PASS"))
    assert main_report(["long_context", "--root", str(tmp_path), "--check"]) == 1
    assert f"differs: {path}" in capsys.readouterr().out
    assert main_report(["long_context", "--root", str(tmp_path)]) == 0
    assert path.read_text() == text


@pytest.mark.parametrize("spoil", [
    lambda d: d.pop("steps"),
    lambda d: d["steps"][0].pop("ms"),
    lambda d: d["kernels"][0].pop("layers"),
])
def test_a_malformed_results_file_is_one_config_error(tmp_path, capsys, spoil):
    path = R.write(_doc(), study("long_context").render, tmp_path).with_suffix(".json")
    doc = json.loads(path.read_text())
    spoil(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bench_long_context --out-dir DIR"):
        study("long_context").render(R.load(path))
    assert main_report(["long_context", "--root", str(tmp_path), "--check"]) == 2
    assert "mtplab report: error:" in capsys.readouterr().err


def test_a_results_file_that_is_not_json_is_one_config_error(tmp_path, capsys):
    path = R.write(_doc(), study("long_context").render, tmp_path).with_suffix(".json")
    path.write_text(path.read_text()[:-20])
    assert main_report(["long_context", "--root", str(tmp_path), "--check"]) == 2
    assert "not a results file" in capsys.readouterr().err


def test_a_trace_without_the_graphs_kernels_is_said_to_be_blind():
    doc = _doc()
    doc["kernels"][0]["kernels"] = [["cudaGraphLaunch", 5.0]]
    md = study("long_context").render(doc)
    assert "the profiler saw no kernels inside the graph replays, and this table is not " \
           "the step's." in md
    assert "not the step's" not in study("long_context").render(_doc())


def test_the_gemm_figure_sets_cublas_beside_the_fastest_triton_launch():
    """o_proj: cuBLAS 13.0 µs against a Triton launch shape at 11.9 (1.092x, beyond the 2%
    noise: pays); qkv: cuBLAS faster (0.700x: costs); the sum per M takes the faster arm of
    each GEMM; the answer counts the GEMMs where Triton pays; a doc without the figure shows
    no section."""
    doc = _doc()
    plain = F.render(doc)
    assert "## Decode GEMMs" not in plain and "decode GEMMs:" not in F.answer(doc)

    def cell(shape, n, k, cub, pick, other):
        return {"shape": shape, "N": n, "K": k, "M": 1, "floor_us": 8.0, "config": {},
                "arms": {"cublas": {"us": [cub] * 3, "max_abs_err": 0.0},
                         "triton": {"us": [pick] * 3, "max_abs_err": 1e-3},
                         "triton 32x256 s1 w4 st4": {"us": [other] * 3, "max_abs_err": 1e-3}}}
    doc["gemm"] = [cell("o_proj", 4096, 4096, 13.0, 16.0, 11.9),
                   cell("qkv", 6144, 4096, 15.5, 22.1, 23.0)]
    rows = F.gemm_rows(doc)
    assert [(r["best"], r["words"]) for r in rows] == [("triton 32x256 s1 w4 st4", R.PAYS),
                                                       ("triton", R.COSTS)]
    md = F.render(doc)
    assert ("| 1 | o_proj | 4096 x 4096 | 8.0 | 13.0 (0.615) | 16.0 | triton 32x256 s1 w4 "
            "st4: 11.9 (0.672) | 1.092x ±2.0%, pays |") in md
    assert "- M = 1: the 2 GEMMs once each take 28.5 µs on cuBLAS, 27.4 µs with the faster " \
           "arm per GEMM (-3.9%)" in md
    assert "decode GEMMs: the Triton GEMM beats cuBLAS beyond the noise on 1 of 2 " \
           "(o_proj M=1)" in F.answer(doc)


def test_the_attn_section_sets_each_verify_beside_the_decode_of_its_bs():
    """A 4-node verify at 60 µs beside a decode at 40 (same bs, same KV bytes): 1.50x, its
    floor / µs from the cell's floor; the fastest swept launch and the engine's µs over it;
    a bs with no decode reads '-'; the answer lists the verify shapes; a doc without the
    figure shows no section."""
    doc = _doc()
    assert "## Verify attention" not in F.render(doc)

    def cell(shape, q, bs, us, sweep=None):
        c = {"shape": shape, "kind": "decode" if q == 1 else f"tree{q}", "bs": bs,
             "kv_len": 32768, "queries": q, "splits": 66, "floor_us": 32.0, "us": us}
        return {**c, "sweep": sweep} if sweep is not None else c
    doc["attn"] = [cell("llama decode bs1 32k", 1, 1, [40.0, 40.4, 39.6]),
                   cell("llama tree D4 bs1 32k", 4, 1, [60.0, 60.0, 61.0],
                        [{"launch": "32/4/3/4", "us": 60.5}, {"launch": "64/8/2/2", "us": 48.0}]),
                   cell("llama tree D4 bs8 32k", 4, 8, [300.0, 300.0, 300.0])]
    rows = F.attn_rows(doc)
    assert [round(r["vs_decode"], 3) for r in rows[:2]] == [1.0, 1.5]
    assert rows[2]["vs_decode"] != rows[2]["vs_decode"]                     # NaN: no decode
    assert rows[1]["best"] == {"launch": "64/8/2/2", "us": 48.0} and rows[1]["vs_best"] == 1.25
    md = F.render(doc)
    assert "## Verify attention at 32k: the split kernel per layer" in md
    assert ("| llama tree D4 bs1 32k | 4 | 66 | 32.0 | 60.0 (1.7%, 3) | 0.533 | 1.50 | "
            "64/8/2/2: 48.0 | 1.25 |") in md
    assert "| llama tree D4 bs8 32k | 4 | 66 | 32.0 | 300.0 (0.0%, 3) | 0.107 | - | - | - |" \
        in md
    assert "verify attention per layer at 32k / a decode's 1.50x (4 nodes, bs 1); " in \
        F.answer(doc)


def test_the_plan_section_sets_the_cublas_engine_beside_the_planned_one():
    """A CUBLAS_ARM cell pairs with its target-only twin (cuBLAS step / planned step), is
    neither a floor row nor a spec row, and the recorded plan is tabled."""
    doc = _doc()
    m = "llama3-8b-like@32"
    doc["steps"] += [_step(m, F.CUBLAS_ARM, 64, 1, [0.44, 0.44, 0.441], 0.30),    # 1.1x
                     _step(m, F.CUBLAS_ARM, 64, 8, [0.333, 0.332, 0.333], 0.30)]  # a tie
    doc["gemm_plan"] = {m: [
        {"model": "target", "n": 6144, "k": 4096, "dtype": "bfloat16", "sites": 32,
         "cublas_us": 46.0, "triton_us": 41.0, "launch": "64x128 s1 w4 st4"},
        {"model": "target", "n": 28672, "k": 4096, "dtype": "bfloat16", "sites": 32,
         "cublas_us": 161.5, "triton_us": 164.9, "launch": None}]}
    rows = F.plan_rows(doc)
    assert [(r["bs"], r["words"]) for r in rows] == [(1, R.PAYS), (8, R.NOISE)]
    assert rows[0]["ratio"] == pytest.approx(0.44 / 0.40)
    assert all(r["arm"] == "target" for r in F.floor_rows(doc))
    assert all(r["arm"] != F.CUBLAS_ARM for r in F.spec_rows(doc))
    md = F.render(doc)
    assert "## The engine's decode GEMM plan beside cuBLAS" in md
    assert "| 6144 x 4096 | 32 | 46.0 | 41.0 | 64x128 s1 w4 st4 |" in md
    assert "| 28672 x 4096 | 32 | 161.5 | 164.9 | cuBLAS |" in md
    assert "the engine's GEMM plan against cuBLAS (step / step) 1.100x" in F.answer(doc)


def test_a_kernel_serving_several_projections_shows_them_all():
    """The skinny GEMM runs qkv, o_proj, down and the LM head under one name: its row in the
    busiest kernels names every projection, in launch order."""
    layer = [["_gemv_kernel", 16.0], ["_rope_kv_kernel", 3.0], ["_split_kernel", 5.0],
             ["_gemv_kernel", 12.0], ["_add_rmsnorm_kernel", 2.0], ["nvjet_gate_up", 50.0],
             ["_gemv_kernel", 30.0]]
    k = {"kernels": layer * 2 + [["_gemv_kernel", 40.0]], "layers": 2, "steps": 1}
    rows = {r.split(" | ")[0].strip("| "): r for r in F.top_kernels(k)[0].splitlines()[2:]}
    assert "| gemm qkv, o_proj, down, lm_head |" in rows["_gemv_kernel"]
    assert "| gemm gate_up |" in rows["nvjet_gate_up"]
    assert F._labels_text(["attention", "other"]) == "attention, other"
