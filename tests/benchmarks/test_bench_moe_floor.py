"""benchmarks/bench_moe_floor.py (and bench_moe.py), the entry points of the MoE study's
runners, without a GPU: each runs its study module's `main`; each phase's outcome lands in the
results doc (done, an error with its message, skipped by the time box) and the report says
which phases measured nothing."""
from __future__ import annotations

import pytest
import torch

from benchmarks import bench_moe, bench_moe_floor
from mtplab.kernels import moe_route as mr
from mtplab.studies import reports as R
from mtplab.studies.moe import moe_figures, moe_floor_runner
from mtplab.studies.moe import moe_floor as floor
from mtplab.studies.moe.moe_floor_runner import Log


@pytest.mark.parametrize("entry,runner", [(bench_moe_floor, moe_floor_runner),
                                          (bench_moe, moe_figures)])
def test_the_scripts_run_their_studys_main(entry, runner):
    assert entry.main is runner.main
    assert runner.__name__.replace(".", "/") + ".py" in entry.__doc__


def test_the_runners_refuse_a_machine_without_cuda(capsys):
    assert bench_moe_floor.main(["--batches", "1"]) == 2
    assert bench_moe.main(["--only", "experts"]) == 2
    cap = capsys.readouterr()
    assert "bench_moe_floor needs CUDA" in cap.err and "bench_moe needs CUDA" in cap.out


def test_each_phase_outcome_is_kept_and_reported(capsys):
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    log = Log(doc, budget_s=100.0)

    def bandwidth():
        doc["bandwidth"] = [4.0e12, 4.1e12, 4.2e12]

    log.phase("bandwidth", bandwidth, reserve_s=0)
    assert log.phase("check", lambda: 1 / 0) is None               # recorded, not raised
    log.phase("ffn", bandwidth, reserve_s=1000.0)                  # past the time box
    assert doc["phases"]["bandwidth"]["status"] == "done"
    assert doc["phases"]["check"] == {"status": "error",
                                      "error": "ZeroDivisionError: division by zero"}
    assert doc["phases"]["ffn"]["status"] == "skipped"
    printed = capsys.readouterr().out
    assert "## bandwidth" in printed and "copy bandwidth 4.100 TB/s" in printed
    assert "- ERROR ZeroDivisionError: division by zero" in printed
    md = floor.render(R.plain(R.stamped(
        doc, date="2026-12-03", device="h200", device_name="NVIDIA H200", commit="abc1234",
        command="python -m benchmarks.bench_moe_floor")))
    answer = md.split(R.ANSWER)[1].splitlines()[0]
    assert answer.strip() == "not measured: check (error), ffn (skipped)."
    assert "## decode" not in md                                    # not run: no section


def test_the_ffn_section_shows_the_routing_kernel_alone_when_measured():
    """ffn rows with the routing kernel's µs and serial work get two more columns (a results
    file without them renders as before: the fixture report regenerates byte for byte)."""
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    doc["bandwidth"] = [4.0e12, 4.1e12, 4.2e12]
    doc["phases"] = {"bandwidth": {"status": "done", "seconds": 0.4},
                     "ffn": {"status": "done", "seconds": 5.0}}
    work = mr.serial_work(1, 2816, 128, 8, 16, torch.bfloat16)
    doc["ffn"].append({"T": 1, "split_us": [150.0, 152.0, 151.0], "split_kernels": 54,
                       "grouped_us": [60.0, 61.0, 60.5], "grouped_kernels": 4,
                       "route": [{"warps": 4, "us": [20.0, 20.5, 20.2]},
                                 {"warps": 8, "us": [12.0, 12.5, 12.2]}],
                       "route_work": work})
    md = floor.render(R.plain(R.stamped(
        doc, date="2026-12-03", device="h200", device_name="NVIDIA H200", commit="abc1234",
        command="python -m benchmarks.bench_moe_floor --only ffn")))
    assert "| routing kernel µs at 4 / 8 warps (spread) | its serial work |" in md
    assert "| 20.2 (2%) / 12.2 (4%) | programs 72, phases 2, aligning trips 1 |" in md
    assert "gate_up / routing launch" not in md


def test_the_ffn_section_sets_the_shared_rows_in_gate_up_beside_the_routing_launch():
    """ffn rows with both placements of the shared expert's act rows get their own table and
    a part of the answer: gate_up's µs / the routing launch's."""
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    doc["bandwidth"] = [4.0e12, 4.1e12, 4.2e12]
    doc["phases"] = {"ffn": {"status": "done", "seconds": 5.0}}
    doc["ffn"].append({"T": 1, "split_us": [150.0, 151.0, 152.0], "split_kernels": 54,
                       "grouped_us": [60.0, 60.5, 61.0], "grouped_kernels": 4,
                       "shared_in_gate_up_us": [66.0, 66.0, 66.5],
                       "shared_in_route_us": [60.0, 60.0, 60.5]})
    md = floor.render(R.plain(R.stamped(
        doc, date="2026-12-03", device="h200", device_name="NVIDIA H200", commit="abc1234",
        command="python -m benchmarks.bench_moe_floor --only ffn")))
    assert "| tokens | rows in gate_up µs | rows in the routing launch µs |" in md
    assert "| 1 | 66.0 | 60.0 | 1.100x ±2.0%, pays | 3/3 |" in md
    assert "the grouped FFN with the shared rows in gate_up / in the routing launch " \
        "1.100x ±2.0% (pays) at T=1" in md


def test_the_kernel_tables_profile_the_greedy_decode_the_steps_run():
    """decode_forward (every kernel table's bs-1 forward) runs the greedy plan the measured
    decode steps run: an argmax, no sampling softmax; experts_touched reads the same forward
    on an MoE preset."""
    import torch

    from mtplab import Engine, RunConfig
    from mtplab.instrument.hostclock import OpCounter
    from mtplab.studies.gpu_figures import decode_forward
    from mtplab.studies.moe import moe_floor_runner

    eng = Engine(RunConfig(model="random-tiny", attention_backend="triton", context_len=256,
                           page_size=16))
    with torch.no_grad(), OpCounter() as oc:
        decode_forward(eng)()
    assert "argmax" in oc.ops and not {"_softmax", "sort", "searchsorted"} & set(oc.ops)
    eng.check_invariants()
    eng.close()
    eng = Engine(RunConfig(model="random-tiny-moe", context_len=256, page_size=16,
                           max_running_requests=4))
    assert 1 <= moe_floor_runner.experts_touched(eng, 3) <= 12        # top-4 of 16, 3 tokens
    eng.check_invariants()
    eng.close()


def test_the_decode_section_tables_the_grouped_engines_gemm_plan():
    """The decode phase keeps the grouped engine's Engine.gemm_plan; the section tables each
    shape's cuBLAS and Triton µs and what the engine kept (a results file without a plan
    renders as before)."""
    doc = floor.new_doc(model="gemma4-26b-a4b-like", layers=30, batches=[1], repeats=3,
                        tokens=48, prompt=64)
    doc["bandwidth"] = [4.0e12, 4.1e12, 4.2e12]
    doc["phases"] = {"decode": {"status": "done", "seconds": 50.0}}
    stamp = dict(date="2026-12-03", device="h200", device_name="NVIDIA H200",
                 commit="abc1234", command="python -m benchmarks.bench_moe_floor")
    plain = floor.render(R.plain(R.stamped(doc, **stamp)))
    assert "decode GEMM plan" not in plain
    doc["decode"]["gemm_plan"] = [
        {"model": "target", "n": 8192, "k": 2816, "dtype": "bfloat16", "sites": 30,
         "cublas_us": 30.1, "triton_us": 25.0, "launch": "32x256 s1 w4 st4"},
        {"model": "target", "n": 262144, "k": 2816, "dtype": "bfloat16", "sites": 1,
         "cublas_us": 900.0, "triton_us": 910.0, "launch": None}]
    md = floor.render(R.plain(R.stamped(doc, **stamp)))
    assert "| 8192 x 2816 | 30 | 30.1 | 25.0 | 32x256 s1 w4 st4 |" in md
    assert "| 262144 x 2816 | 1 | 900.0 | 910.0 | cuBLAS |" in md
