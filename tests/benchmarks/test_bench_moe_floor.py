"""benchmarks/bench_moe_floor.py without a GPU: each phase's outcome lands in the results doc
(done, an error with its message, skipped by the time box) and the report says which phases
measured nothing."""
from __future__ import annotations

from benchmarks.bench_moe_floor import Log
from mtplab.studies import reports as R
from mtplab.studies.moe import moe_floor as floor


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
    md = floor.render(floor.clean_doc(floor.stamp(
        doc, date="2026-12-03", device="h200", device_name="NVIDIA H200", commit="abc1234",
        command="python -m benchmarks.bench_moe_floor")))
    answer = md.split(R.ANSWER)[1].splitlines()[0]
    assert answer.strip() == "not measured: check (error), ffn (skipped)."
    assert "## decode" not in md                                    # not run: no section
