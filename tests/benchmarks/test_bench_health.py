"""benchmarks/bench_health.py's report on arms with known figures (no engine): the table,
the noise, the checks and the file name."""
from __future__ import annotations

from pathlib import Path

from benchmarks.bench_health import Arm, Shape, checks, report, report_path

GPU = Shape("llama3-8b-like@16", "llama3-8b-like", 16, 8, "GPU-bound")


def _arm(name, ras, delay=0.0, **extra):
    return Arm(GPU, name, {}, delay, [dict(run_ahead_frac=r, launch_lead_p50_us=100.0 * r,
                                           meter_tok_per_s=1000.0 + 10 * i, **extra)
                                      for i, r in enumerate(ras)])


def test_checks_and_report_of_known_arms():
    arms = [_arm("overlap+zb", [0.98, 1.0, 0.99]), _arm("overlap off", [0.0, 0.0, 0.0]),
            _arm("overlap+zb + host delay", [0.5, 0.0, 0.02], delay=9000.0)]
    lines = checks(arms)
    assert lines[0].endswith("PASS") and "0.990" in lines[0]
    assert lines[1].endswith("PASS")                             # overlap off: 0
    assert "9000 µs" in lines[2] and lines[2].endswith("PASS")   # median 0.02 <= 0.1
    arms[1].repeats[1]["run_ahead_frac"] = 0.1
    assert checks(arms)[1].endswith("MISS")
    md = report(arms, {"date": "2026-11-29", "device": "NVIDIA H200", "commit": "abc1234def",
                       "command": "python -m benchmarks.bench_health", "prompt_len": 128,
                       "out_len": 64, "repeats": 3})
    assert md.startswith("# Health figures, 2026-11-29")
    assert "- device: NVIDIA H200" in md and "- commit: abc1234def" in md
    row = next(ln for ln in md.splitlines() if "| overlap+zb |" in ln)
    assert "| 0.990 |" in row and "+99" in row                    # medians
    noise = [ln for ln in md.splitlines() if ln.startswith("| llama3-8b-like@16 | overlap+zb |")]
    assert "| 0.020 |" in noise[-1] and "| 2.0% |" in noise[-1]    # range, tok/s 20 / 1010


def test_not_measured_reads_na_and_the_file_name():
    arms = [_arm("overlap off", [float("nan")] * 2, run_ahead_note="not available on CPU")]
    assert checks(arms)[0].endswith("n/a (not measured)")
    assert report_path(Path("/x"), "2026-11-29", "NVIDIA H200", "abc1234def") == \
        Path("/x/2026-11-29_nvidia-h200_abc1234.md")
