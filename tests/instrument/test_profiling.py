"""Spans, the event timeline and profiler sessions on CPU (the engine records a real trace)."""
import gzip
import json

import pandas as pd
import pytest

from mtplab import Engine, RunConfig
from mtplab.analysis.bubbles import analyze
from mtplab.instrument.spans import NO_SPANS, Spans
from mtplab.stages import STAGES
from mtplab.analysis.trace_io import load_trace
from tests.helpers import random_prompts


def test_disabled_spans_cost_nothing_and_names_are_checked():
    assert NO_SPANS.stage("verify") is NO_SPANS.stage("draft")      # one shared nullcontext
    with pytest.raises(ValueError, match="not a stage name"):
        with Spans(enabled=True).stage("decode_forward"):
            pass


@pytest.mark.parametrize("draft", ["frozen_kv_mtp", "eagle"])
def test_profiled_run_writes_trace_timeline_and_manifest(tmp_path, draft):
    cfg = RunConfig(model="random-tiny", draft=draft, topk=2, num_steps=3, num_draft_tokens=5,
                    profile=True, event_timeline=True, trace_dir=str(tmp_path), run_name="r",
                    profile_wait=1, profile_warmup=1, profile_active=4)
    eng = Engine(cfg)
    eng.generate(random_prompts(3, [5, 17], 320), max_new_tokens=24, ignore_eos=True)
    eng.check_invariants()
    files = eng.finish()
    run = tmp_path / "r"
    traces = list(run.glob("*.pt.trace.json.gz"))
    assert len(traces) == 1 and files["trace0"] == traces[0]
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["draft"] == draft and manifest["config"]["profile"] is True
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    names = {e.get("name") for e in events}
    want = {"schedule", "prepare", "resolve", "draft", "tree", "verify", "accept", "commit",
            "stash", "d2h", "sync", "process_result"}
    want |= ({"draft.seed", "draft.step"} if draft == "frozen_kv_mtp"
             else {"draft.step", "draft_extend"})
    assert want <= names, want - names
    assert any(n.startswith("step[decode bs=") for n in names if n)
    # the analyser reads the engine's own trace
    res = analyze(load_trace(traces[0]))
    assert res.summary["n_steps"] >= 3
    # the event timeline: every stage from the vocabulary, steps in order
    tl = pd.read_parquet(run / "timeline.parquet")
    assert set(tl["stage"]) - set(STAGES) <= {s for s in tl["stage"] if s.startswith("step[")}
    assert want <= set(tl["stage"])
    assert tl["step"].is_monotonic_increasing
    assert (tl["host_end_us"] >= tl["host_start_us"]).all()


def test_demo_style_prefill_only_run_and_no_files_without_profiling(tmp_path):
    eng = Engine(RunConfig(model="random-tiny", trace_dir=str(tmp_path)))
    eng.generate([[5, 6]], max_new_tokens=1)
    assert eng.finish() == {} and not any(tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="event timeline is off"):
        eng.timeline_frame()


def test_sampled_event_timeline_records_every_nth_step_only():
    every = 4
    eng = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", event_timeline=True,
                           event_timeline_every=every))
    out = eng.generate(random_prompts(2, [5, 9], 320), max_new_tokens=20, ignore_eos=True)
    eng.check_invariants()
    tl = eng.timeline_frame()
    steps = set(tl["step"])
    assert len(steps) >= 2 and all(s % every == 0 for s in steps)
    assert {"schedule", "verify", "draft", "process_result"} <= set(tl["stage"])
    full = Engine(RunConfig(model="random-tiny", draft="frozen_kv_mtp", event_timeline=True))
    assert full.generate(random_prompts(2, [5, 9], 320), max_new_tokens=20,
                         ignore_eos=True) == out
    assert set(full.timeline_frame()["step"]) > steps
    with pytest.raises(Exception, match="event_timeline_every must be a positive integer"):
        RunConfig(event_timeline_every=0)
