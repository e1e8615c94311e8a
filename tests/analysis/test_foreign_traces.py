"""The analyser on programs that are not mtplab, recorded on the H100 with torch.profiler's
defaults (no `with_stack`: the Python between ops is not recorded) by
benchmarks/record_foreign_traces.py; tests/data holds a cut of each (`... cut`): transformers
assisted generation and greedy generation (`profile()` around generate calls: fixed windows)
and a plain training step (ProfilerStep#N, the next batch copied on a side stream)."""
from pathlib import Path

import pytest

from mtplab.analysis.bubbles import analyze_run
from mtplab.analysis.plots import timeline_choices
from mtplab.analysis.trace_io import load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = {name: DATA / f"{name}_h100.pt.trace.json.gz"
          for name in ("hf_assisted", "hf_greedy", "torch_train")}


@pytest.mark.parametrize("name", TRACES)
def test_other_keeps_at_most_a_tenth_of_the_bubble(name):
    """Every bubble has a cause but the ones truly unexplained: `other` <= 10% (here none)."""
    s = analyze_run(TRACES[name]).summary
    assert s["bubble_us"] > 0 and s["n_steps"] >= 2
    assert s["bubble_other_us"] <= 0.10 * s["bubble_us"]
    host = {c for c in s["bubble_by_cause_us"] if c.startswith("host:")}
    assert host <= {"host:python", "host:untraced"}          # no mtplab stage spans here


def test_a_late_launch_from_a_thread_with_no_recorded_event_is_a_host_cause():
    """Assisted generation runs Python between ops that the profiler does not record: about
    half the bubble is work issued late by a thread with no event at the gap's start."""
    s = analyze_run(TRACES["hf_assisted"]).summary
    by = s["bubble_by_cause_us"]
    assert by["host:untraced"] > 0.3 * s["bubble_us"]
    assert by["host:untraced"] + by["host:python"] == pytest.approx(s["bubble_host_us"])


@pytest.mark.parametrize("name, lanes", [
    ("hf_greedy", ["host", "compute (stream 7)"]),
    ("torch_train", ["host", "autograd (thread 576)", "compute (stream 7)", "copy (stream 14)"]),
])
def test_lanes_are_named_by_role(name, lanes):
    tr = load_trace(TRACES[name])
    assert timeline_choices(tr, analyze_run(tr))[0] == lanes
