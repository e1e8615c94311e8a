"""The analyser on a real plain PyTorch trace (no mtplab code in the profiled program):
transformers' greedy and assisted `generate` on a tiny random Llama, recorded on the H100 by
benchmarks/record_plain_trace.py (tests/data/plain_transformers_h100.pt.trace.json.gz)."""
from pathlib import Path

from mtplab.analysis.bubbles import analyze

TRACE = Path(__file__).resolve().parents[1] / "data" / "plain_transformers_h100.pt.trace.json.gz"


def test_a_plain_pytorch_bubble_is_explained():
    """Work issued late while the host ran Python (aten ops, no stage spans) is `host:python`;
    `other` keeps at most 10% of the bubble."""
    res = analyze(TRACE, skip_steps=0)
    s = res.summary
    assert s["step_source"].startswith("ProfilerStep") and s["n_steps"] >= 1
    assert s["bubble_us"] > 0
    by = s["bubble_by_cause_us"]
    assert by.get("host:python", 0) > 0.5 * s["bubble_us"]
    assert not any(c.startswith("host:") and c != "host:python" for c in by)   # no mtplab spans
    assert s["bubble_other_us"] <= 0.10 * s["bubble_us"]
