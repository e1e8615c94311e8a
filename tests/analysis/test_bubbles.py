"""Bubble analysis on synthetic Kineto traces with planted gaps (exact float µs)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from mtplab.analysis.bubbles import analyze, stage_of, write_analysis
from mtplab.analysis.trace_io import load_trace
from tests.helpers import Synth, overlap_trace, plain_pytorch_trace


def end(ev: dict) -> float:
    return ev["ts"] + ev["dur"]


def planted() -> tuple[Synth, list[tuple]]:
    """Four steps on three streams; every cause planted. Returns (trace, expected device gaps).

    Expected rows: (step, gap start event end, gap end event, cause, before, after).
    """
    s = Synth()
    for k in range(4):
        s.host("step[decode bs=4]", 100 * k, 100)
    # step 0: eager draft kernel, a CUDA graph replay (two kernels sharing the launch's
    # correlation, 2.5 µs apart), a D2H copy overlapping on the copy stream, a host sync.
    s.host("schedule", 0, 20)
    s.gpu(s.launch(20), 25, 35)
    s.gpu_ann("draft", 25, 35)
    g = s.launch(30, "cudaGraphLaunch", 5)
    g1 = s.gpu(g, 60, 20, name="graph_k1")
    g2 = s.gpu(g, 82.5, 12.5, name="graph_k2")
    s.gpu_ann("verify", 60, 35)
    s.gpu(s.launch(40, "cudaMemcpyAsync"), 62, 16, stream=20, cat="gpu_memcpy")
    s.gpu_ann("d2h", 62, 16, stream=20)
    s.host("cudaStreamSynchronize", 83, 13, cat="cuda_runtime")
    # step 1: the sync gap straddles the host step boundary; host_prep; launch latency
    s.host("process_result", 100, 10)
    s.host("schedule", 110, 10)
    b = s.gpu(s.launch(125), 130, 20)
    s.gpu_ann("draft", 130, 20)
    s.host("prepare", 140, 30)
    d = s.gpu(s.launch(165), 172, 18)
    s.gpu_ann("verify", 172, 18)
    e = s.gpu(s.launch(175), 195, 3, stream=13)
    # step 2: work issued late while the host was in its `verify` span (host:verify; the
    # gap crosses the host step boundary; the stage after is on the host only: fallback),
    # a memset overlapping, a cross-stream event wait (not a host block), an .item() sync
    s.host("verify", 196, 12)
    f = s.gpu(s.launch(205), 210, 30)
    s.host("stash", 218, 4)
    m = s.gpu(s.launch(220, "cudaMemsetAsync"), 230, 20, stream=20, cat="gpu_memset")
    gk = s.gpu(s.launch(241), 260, 10)
    s.host("cudaStreamWaitEvent", 245, 1, cat="cuda_runtime")
    s.gpu_ann("accept", 260, 10)
    s.host("aten::item", 262, 18, cat="cpu_op")
    h = s.gpu(s.launch(282), 285, 5)
    # step 3: a gap nobody explains: the work has no launch call in the trace
    i = s.gpu(99_999, 310, 20)
    expected = [
        (0, end(g1), g2["ts"], "launch", "verify", "verify"),
        (1, end(g2), b["ts"], "sync", "verify", "draft"),
        (1, end(b), d["ts"], "host_prep", "draft", "verify"),
        (1, end(d), e["ts"], "launch", "verify", "unknown"),
        (2, end(e), f["ts"], "host:verify", "unknown", "verify"),
        (2, end(m), gk["ts"], "launch", "stash", "accept"),
        (2, end(gk), h["ts"], "sync", "accept", "unknown"),
        (3, end(h), i["ts"], "other", "unknown", "unknown"),
    ]
    return s, expected


@pytest.fixture(scope="module")
def planted_trace(tmp_path_factory):
    s, expected = planted()
    path = s.write(tmp_path_factory.mktemp("synth") / "w.pt.trace.json.gz", gz=True)
    return s, expected, path


def test_every_planted_gap_found_exactly(planted_trace):
    s, expected, path = planted_trace
    res = analyze(path)
    gaps = res.device_gaps
    assert len(gaps) == len(expected), gaps  # none invented, none missed
    for row, (step, g0, g1, cause, before, after) in zip(gaps.itertuples(), expected):
        assert row.step == step
        assert row.start_us == g0 and row.end_us == g1  # exact float equality, no rounding
        assert row.gap_us == g1 - g0
        assert (row.cause, row.before, row.after) == (cause, before, after)


def test_steps_tile_the_device_timeline(planted_trace):
    s, expected, path = planted_trace
    res = analyze(path)
    st = res.steps
    assert list(st["step"]) == [0, 1, 2, 3]
    assert (st["name"] == "step[decode bs=4]").all()
    assert res.summary["step_source"] == "step spans"
    np.testing.assert_allclose(st["busy_us"] + st["bubble_us"], st["dur_us"], rtol=0, atol=1e-6)
    assert st["start_us"].iloc[0] == s.t(25)
    # window k ends where step k's last activity ends
    assert list(st["start_us"] + st["dur_us"]) == pytest.approx(
        [s.t(95), s.t(198), s.t(290), s.t(330)], abs=1e-6)
    bub = {k: sum(g1 - g0 for kk, g0, g1, *_ in expected if kk == k) for k in range(4)}
    assert list(st["bubble_us"]) == pytest.approx([bub[k] for k in range(4)], abs=1e-9)
    assert list(st["n_gaps"]) == [1, 3, 3, 1]
    causes = st[["bubble_sync_us", "bubble_host_prep_us", "bubble_launch_us", "bubble_host_us",
                 "bubble_other_us"]]
    np.testing.assert_allclose(causes.sum(axis=1), st["bubble_us"], atol=1e-9)
    sm = res.summary
    assert sm["n_steps"] == 4 and sm["bubble_us"] == pytest.approx(sum(bub.values()))
    assert sm["bubble_frac"] == pytest.approx(sm["bubble_us"] / sm["wall_us"])
    assert sm["wall_us"] == pytest.approx(s.t(330) - s.t(25))


def _independent_stream_idle(s: Synth, delay_us: float = 30.0) -> dict[int, dict[str, float]]:
    launch = {e["args"]["correlation"]: e["ts"] for e in s.events if e.get("cat") == "cuda_runtime"
              and "correlation" in e.get("args", {})}
    out = {}
    for sid in sorted({a["args"]["stream"] for a in s.activities}):
        acts = sorted((a for a in s.activities if a["args"]["stream"] == sid),
                      key=lambda a: a["ts"])
        tot = {"idle": 0.0, "host_wait": 0.0, "kernel_wait": 0.0, "other": 0.0, "busy": 0.0}
        for prev, nxt in zip(acts, acts[1:]):
            gap = nxt["ts"] - end(prev)
            assert gap >= 0
            if gap == 0:
                continue
            tot["idle"] += gap
            if launch.get(nxt["args"]["correlation"], math.nan) > end(prev):  # NaN: no launch
                tot["host_wait"] += gap
            elif gap < delay_us:
                tot["kernel_wait"] += gap
            else:
                tot["other"] += gap
        tot["busy"] = sum(a["dur"] for a in acts)
        out[sid] = tot
    return out


def test_stream_idle_matches_independent_computation(planted_trace):
    s, _, path = planted_trace
    res = analyze(path)
    ref = _independent_stream_idle(s)
    assert sorted(res.streams["stream"]) == sorted(ref)
    for row in res.streams.itertuples():
        r = ref[row.stream]
        assert row.idle_us == pytest.approx(r["idle"], abs=1e-9)
        assert row.busy_us == pytest.approx(r["busy"], abs=1e-6)
        assert row.idle_host_wait_us == pytest.approx(r["host_wait"], abs=1e-9)
        assert row.idle_kernel_wait_us == pytest.approx(r["kernel_wait"], abs=1e-9)
        assert row.idle_other_us == pytest.approx(r["other"], abs=1e-9)
    sg = res.gaps[res.gaps["scope"] == "stream"]
    assert set(sg["stream"]) <= set(ref) and (sg["gap_us"] > 0).all()


def test_skip_steps_drops_warmup(planted_trace):
    s, expected, path = planted_trace
    res = analyze(path, skip_steps=1)
    assert list(res.steps["step"]) == [1, 2, 3]
    assert list(res.device_gaps["step"]) == [k for k, *_ in expected if k >= 1]
    assert res.summary["n_steps"] == 3
    assert res.summary["wall_us"] == pytest.approx(s.t(330) - s.t(95))


def test_profiler_step_fallback_and_windows(tmp_path):
    s = Synth()
    for k in range(2):
        s.host(f"ProfilerStep#{k + 3}", 100 * k, 100)
    s.gpu(s.launch(1), 10, 10)
    s.gpu(s.launch(101), 110, 10)
    res = analyze(s.write(tmp_path / "p.json"))
    assert res.summary["step_source"] == "ProfilerStep#N"
    assert list(res.steps["name"]) == ["ProfilerStep#3", "ProfilerStep#4"]
    assert list(res.device_gaps["gap_us"]) == [s.t(110) - s.t(20)]
    # no step spans at all: fixed windows, cuts moved out of gaps, stated in the summary
    w = Synth()
    w.gpu(w.launch(0), 10, 10)
    w.gpu(w.launch(1), 50, 10)
    w.gpu(w.launch(2), 60, 30)
    res = analyze(w.write(tmp_path / "w.json"), window_us=25.0)
    assert res.summary["step_source"].startswith("fixed windows of 25 us")
    assert res.device_gaps["gap_us"].tolist() == [w.t(50) - w.t(20)]
    np.testing.assert_allclose(res.steps["busy_us"] + res.steps["bubble_us"], res.steps["dur_us"],
                               atol=1e-6)
    assert res.steps["dur_us"].sum() == pytest.approx(80.0)


def test_sglang_spans(tmp_path):
    s = Synth()
    s.host("scheduler.get_next_batch_to_run", 0, 20)
    s.host("step[DRAFT_LOOP raw_bs=2 bs=2 topk=1]", 20, 10)
    s.gpu(s.launch(21, "cudaGraphLaunch"), 25, 10)
    s.gpu_ann("step[DRAFT_LOOP raw_bs=2 bs=2 topk=1]", 25, 10)
    s.host("scheduler.run_batch", 31, 40)
    s.host("step[VERIFY bs=2]", 50, 10)
    s.gpu(s.launch(51), 60, 10)
    s.gpu_ann("step[VERIFY bs=2]", 60, 10)
    res = analyze(s.write(tmp_path / "sgl.json"))
    # a draft loop and its verify are one decode step, and the source says so
    assert list(res.steps["name"]) == ["step[decode bs=2: DRAFT_LOOP+VERIFY]"]
    assert res.summary["step_source"].startswith("SGLang forward spans grouped into decode")
    assert res.steps["host_start_us"].tolist() == [s.t(20)]
    assert res.steps["host_dur_us"].tolist() == [40.0]
    (g,) = res.device_gaps.itertuples()
    assert (g.step, g.cause, g.before, g.after) == (0, "host_prep", "draft", "verify")
    assert stage_of("step[DRAFT_EXTEND bs=4]") == "draft_extend"
    assert stage_of("step[decode bs=4]") is None and stage_of("draft.seed") == "draft.seed"


def test_sglang_verify_spans_own_the_draft_launched_after_them(tmp_path):
    """SGLang 0.5.17 spans only its verify forwards; the draft graph it launches after each
    span (before the next) is that step's work. Lead of step 0 = the draft kernel's end - the
    next verify's launch: +6 µs here (run-ahead); the verify kernel alone would give -14."""
    s = Synth()
    s.host("step[TARGET_VERIFY bs=1]", 0, 10)
    s.gpu(s.launch(2, "cudaGraphLaunch"), 10, 20)                 # verify: 10 .. 30
    draft = s.gpu(s.launch(15, "cudaGraphLaunch"), 30, 20)        # draft:  30 .. 50
    s.host("step[TARGET_VERIFY bs=1]", 40, 10)
    nxt = s.launch(44, "cudaGraphLaunch")
    s.gpu(nxt, 50, 20)
    res = analyze(s.write(tmp_path / "sgl017.json"))
    assert list(res.steps["name"]) == ["step[TARGET_VERIFY bs=1]"] * 2
    lead = res.steps["launch_lead_us"].tolist()[0]
    assert lead == pytest.approx(end(draft) - s.t(44))
    assert lead == pytest.approx(6.0)
    assert res.summary["run_ahead_frac"] == 1.0


def test_graph_replay_owned_by_launching_step_with_host_stage(tmp_path):
    """Overlap: step 0's graph runs while the host is already in step 1; no GPU-lane annotation."""
    s = Synth()
    s.host("step[decode bs=2]", 0, 50)
    s.host("step[decode bs=2]", 50, 50)
    s.host("verify", 40, 8)
    g = s.launch(45, "cudaGraphLaunch", 3)
    ks = [s.gpu(g, 60, 5), s.gpu(g, 66.25, 5), s.gpu(g, 72, 5)]  # replayed after step 0 ended
    s.host("schedule", 52, 10)
    nxt = s.gpu(s.launch(90), 100, 5)
    res = analyze(s.write(tmp_path / "g.json"))
    got = [(r.step, r.gap_us, r.cause, r.before, r.after) for r in res.device_gaps.itertuples()]
    assert got == [(0, ks[1]["ts"] - end(ks[0]), "launch", "verify", "verify"),
                   (0, ks[2]["ts"] - end(ks[1]), "launch", "verify", "verify"),
                   (1, nxt["ts"] - end(ks[2]), "host:python", "verify", "unknown")]
    assert res.steps["start_us"].tolist() == [s.t(60), end(ks[2])]


def test_write_analysis_atomic_outputs(planted_trace, tmp_path):
    _, _, path = planted_trace
    res = analyze(path)
    paths = write_analysis(res, tmp_path / "out")
    assert {p.name for p in (tmp_path / "out").iterdir()} == {
        "steps.parquet", "gaps.parquet", "streams.parquet", "summary.json"}
    pd.testing.assert_frame_equal(pd.read_parquet(paths["steps"]), res.steps)
    pd.testing.assert_frame_equal(pd.read_parquet(paths["gaps"]), res.gaps)
    assert orjson.loads(paths["summary"].read_bytes())["n_steps"] == 4


def test_multi_device_picks_busiest_and_notes(tmp_path):
    s = Synth()
    s.host("step[decode bs=1]", 0, 100)
    s.gpu(s.launch(1), 10, 10)
    s.gpu(s.launch(2), 30, 10)
    s.device = 1
    s.gpu(s.launch(3), 10, 50)
    res = analyze(s.write(tmp_path / "two.json"))
    assert res.summary["device"] == 1 and "devices [0, 1]" in res.summary["notes"][0]
    assert len(analyze(tmp_path / "two.json", device=0).device_gaps) == 1


@pytest.mark.filterwarnings("ignore")  # third-party deprecation noise
def test_cpu_only_profile_from_torch_profiler(tmp_path):
    """A real trace from torch.profiler on CPU: no device activity, said cleanly."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    written: list[Path] = []

    def on_ready(prof):
        p = tmp_path / "cpu.pt.trace.json"
        prof.export_chrome_trace(str(p))
        written.append(p)

    x = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=3),
                 on_trace_ready=on_ready) as prof:
        for _ in range(4):
            with record_function("verify"):
                x = torch.tanh(x @ x)
            prof.step()
    (path,) = written
    res = analyze(path)
    assert res.summary["n_steps"] == 3 and res.summary["step_source"] == "ProfilerStep#N"
    assert 0 < res.summary["busy_us"] <= res.summary["wall_us"]    # the host's time in ops
    assert res.summary["bubble_us"] == 0
    assert math.isnan(res.summary["bubble_frac"])
    assert "no GPU activity" in res.summary["notes"][0]
    assert res.gaps.empty and res.streams.empty
    assert (res.steps["dur_us"] > 0).all()


@pytest.mark.filterwarnings("ignore")  # third-party deprecation noise
def test_plain_cpu_profile_of_an_mlp_loop_has_host_steps_and_says_what_it_shows(tmp_path):
    """torch.profiler with its defaults around a training loop (no schedule, no step spans):
    the host's ops make the steps (fixed windows cut between ops) and their busy time; the
    notes say what a CPU trace can and cannot show; the plot draws the ops on a host lane."""
    torch = pytest.importorskip("torch")
    from torch.profiler import profile

    from mtplab.analysis.bubbles import CPU_TRACE_NOTE
    from mtplab.analysis.plots import plot_timeline

    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with profile() as prof:
        for _ in range(5):
            m(x).sum().backward()
    path = tmp_path / "mlp.json"
    prof.export_chrome_trace(str(path))
    tr = load_trace(path)
    span = float(tr.end.max() - tr.ts.min())
    res = analyze(tr, window_us=span / 8)
    sm = res.summary
    assert sm["step_source"].startswith("fixed windows") and sm["n_steps"] >= 4
    assert sm["busy_us"] > 0 and (res.steps["busy_us"] > 0).sum() >= 2
    assert (res.steps["busy_us"] <= res.steps["dur_us"] + 1e-6).all()
    assert sm["bubble_us"] == 0 and math.isnan(sm["bubble_frac"])
    assert sm["notes"] == [CPU_TRACE_NOTE]
    assert "cannot show GPU work, device bubbles" in CPU_TRACE_NOTE
    ax = plot_timeline(tr, res).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["host"]
    assert "host op" in {t.get_text() for t in ax.get_legend().get_texts()}
    assert len(ax.collections) >= 2 and any(len(c.get_paths()) > 1 for c in ax.collections)
    import matplotlib.pyplot as plt
    plt.close("all")


def _rounded_like_hta(s: Synth) -> Synth:
    """A copy of the trace with ts rounded up and end rounded down, as HTA's parser does."""
    r = Synth(base=s.base)
    r.events, r.activities = [], []
    for e in s.events:
        e = dict(e)
        if e["ph"] == "X" and isinstance(e.get("ts"), float) and e["cat"] != "Trace":
            ts, en = math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])
            e["ts"], e["dur"] = float(ts), float(en - ts)
        r.events.append(e)
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            r.activities.append(e)
    return r


@pytest.mark.filterwarnings("ignore")  # third-party deprecation noise
def test_hta_rounding_bias(tmp_path):
    """HTA over-reports idle (ts up, end down); on integer timestamps its categories equal ours."""
    pytest.importorskip("hta")
    from hta.trace_analysis import TraceAnalysis

    def hta_idle(s: Synth, name: str) -> pd.DataFrame:
        d = tmp_path / name
        d.mkdir()
        s.write(d / "rank0.json")
        df, _ = TraceAnalysis(trace_dir=str(d)).get_idle_time_breakdown(ranks=[0], visualize=False)
        return df.pivot_table(index="stream", columns="idle_category", values="idle_time",
                              aggfunc="sum").fillna(0.0)

    s, _ = planted()  # ns-fraction timestamps
    ours = analyze(s.write(tmp_path / "exact.json")).streams.set_index("stream")
    theirs = hta_idle(s, "frac")
    rounded = _independent_stream_idle(_rounded_like_hta(s))
    for sid, row in ours.iterrows():
        if row["idle_us"] == 0:
            continue
        assert theirs.loc[sid].sum() > row["idle_us"]  # the bias mtplab avoids
        assert theirs.loc[sid].sum() == pytest.approx(rounded[sid]["idle"])
        assert row["idle_us"] == pytest.approx(_independent_stream_idle(s)[sid]["idle"])
    # integer timestamps (the rounded trace): nothing left to round, HTA's categories equal ours
    r = _rounded_like_hta(s)
    ours = analyze(r.write(tmp_path / "int.json")).streams.set_index("stream")
    theirs = hta_idle(r, "int")
    for sid, row in ours.iterrows():
        for cat in ("host_wait", "kernel_wait", "other"):
            got = theirs.loc[sid].get(cat, 0.0)
            assert row[f"idle_{cat}_us"] == pytest.approx(got), (sid, cat)


def test_atomic_path_keeps_old_file_on_failure(tmp_path):
    from mtplab.atomic import atomic_path, atomic_write_text

    p = atomic_write_text(tmp_path / "a.json", "old")
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_text("half")
            assert tmp.parent == p.parent and tmp.suffix == ".json"
            raise RuntimeError("boom")
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["a.json"]
    atomic_write_text(p, "new")
    assert p.read_text() == "new" and len(list(tmp_path.iterdir())) == 1


def test_host_cause_names_the_stage_running_when_the_gap_began(tmp_path):
    """Work issued late: host:<stage> (innermost stage span of the issuing thread at the
    gap's start), host:python (host events but no stage), host:untraced (the thread had no
    recorded event: it ran code the profiler does not see); `other` only for work whose
    launch call is not in the trace."""
    s = Synth()
    s.host("step[decode bs=1]", 0, 300)
    a = s.gpu(s.launch(1), 5, 10)                       # ends at 15
    s.host("draft", 10, 30)
    s.host("draft.step", 12, 20)                        # innermost at 15: draft.step
    b = s.gpu(s.launch(35), 40, 10)                     # issued after the gap began
    s.host("aten::add", 45, 20, cat="cpu_op")           # in the step span, no stage
    c = s.gpu(s.launch(60), 65, 10)
    d = s.gpu(s.launch(100, tid=777), 110, 5)           # a thread with nothing at 75
    e = s.gpu(999, 130, 5)                              # no launch call in the trace
    res = analyze(s.write(tmp_path / "h.json"))
    got = [(r.gap_us, r.cause) for r in res.device_gaps.itertuples()]
    assert got == [(b["ts"] - end(a), "host:draft.step"), (c["ts"] - end(b), "host:python"),
                   (d["ts"] - end(c), "host:untraced"), (e["ts"] - end(d), "other")]
    sm = res.summary
    assert sm["bubble_host_us"] == pytest.approx(got[0][0] + got[1][0] + got[2][0])
    assert sm["bubble_other_us"] == pytest.approx(got[3][0])
    assert sm["bubble_by_cause_us"]["host:draft.step"] == pytest.approx(got[0][0])
    assert sm["bubble_by_cause_us"]["host:untraced"] == pytest.approx(got[2][0])
    assert res.steps["bubble_host_us"].sum() == pytest.approx(sm["bubble_host_us"])


def test_host_cause_keeps_the_priority_of_sync_prep_and_launch(tmp_path):
    s = Synth()
    s.host("step[decode bs=1]", 0, 200)
    s.gpu(s.launch(1), 5, 10)
    s.host("verify", 10, 30)
    s.host("process_result", 14, 3)                     # overlaps the gap: host_prep wins
    s.gpu(s.launch(30), 35, 5)                          # ends at 40
    s.host("verify", 36, 30)                            # busy in verify at 40, but ...
    s.gpu(s.launch(38), 60, 5)                          # ... issued before the gap: launch
    causes = list(analyze(s.write(tmp_path / "p.json")).device_gaps["cause"])
    assert causes == ["host_prep", "launch"]


@pytest.mark.parametrize("planted", [None, "untraced", "unlaunched"])
def test_plain_pytorch_trace_bubble_is_explained(tmp_path, planted):
    """A plain PyTorch program (ProfilerStep#N, aten ops, no mtplab spans): the host-bound
    gaps are host:python, a thread with no recorded event host:untraced; `other` keeps only
    the planted gaps of work with no launch call in the trace, <= 10%."""
    s = plain_pytorch_trace(planted=planted)
    res = analyze(s.write(tmp_path / "plain.json"))
    sm = res.summary
    assert sm["step_source"] == "ProfilerStep#N"
    by = sm["bubble_by_cause_us"]
    assert set(by) <= {"host:python", "host:untraced", "other", "launch"}
    assert by["host:python"] / sm["bubble_us"] > 0.85
    planted_us = 4 * 21.5 if planted else 0.0          # 4 steps x one 21.5 µs gap
    assert by.get("host:untraced", 0.0) == pytest.approx(planted_us * (planted == "untraced"))
    assert sm["bubble_other_us"] == pytest.approx(planted_us * (planted == "unlaunched"))
    assert sm["bubble_other_us"] <= 0.10 * sm["bubble_us"]


def test_step_gaps_are_relative_to_the_step_and_filtered(planted_trace):
    """Notebook 05's table: one step's bubbles, µs from the step's start, above a threshold,
    of the chosen cause groups (`host` takes every host:* label)."""
    _, _, path = planted_trace
    res = analyze(path)
    step = int(res.device_gaps["step"].iloc[-1])
    start = float(res.steps.set_index("step").loc[step, "start_us"])
    all_ = res.device_gaps[res.device_gaps["step"] == step]
    g = res.step_gaps(step)
    assert list(g.columns) == ["at_us", "gap_us", "cause", "before", "after"]
    assert g["at_us"].tolist() == pytest.approx((all_["start_us"] - start).tolist())
    assert (g["at_us"] >= 0).all() and g["at_us"].max() < 1e4
    big = res.step_gaps(step, min_gap_us=g["gap_us"].median())
    assert 0 < len(big) < len(g) or g["gap_us"].nunique() == 1
    host = res.step_gaps(2, causes=["host"])
    assert len(host) and host["cause"].str.startswith("host:").all()


def test_launch_lead_of_the_planted_trace(planted_trace):
    """Step 0's last GPU work ends at 95 µs, step 1's first launch is at 125: -30; step 1
    ends at 198, step 2's first launch at 205: -7; step 3 has no launch call in the trace
    (step 2: no lead) and no next step."""
    s, _, path = planted_trace
    res = analyze(path)
    lead = res.steps["launch_lead_us"].to_numpy()
    np.testing.assert_allclose(lead[:2], [-30.0, -7.0])
    assert np.isnan(lead[2:]).all()
    sm = res.summary
    assert sm["run_ahead_frac"] == 0.0 and sm["run_ahead_steps"] == 2
    assert sm["launch_lead_p50_us"] == pytest.approx(-18.5)


@pytest.mark.parametrize("delay", [0.0, 100.0])
def test_run_ahead_of_a_synthetic_overlap_trace(tmp_path, delay):
    """tests/helpers.overlap_trace: back to back the GPU queue runs ahead (leads 39, 74,
    109 µs); with a 100 µs host delay after every step the host falls behind (-61 µs each)."""
    res = analyze(overlap_trace(tmp_path / f"o{delay:g}.pt.trace.json", delay))
    lead = res.steps["launch_lead_us"].to_numpy()
    want = [39.0, 74.0, 109.0] if delay == 0 else [-61.0, -61.0, -61.0]
    np.testing.assert_allclose(lead[:3], want)
    assert np.isnan(lead[3])
    assert res.summary["run_ahead_frac"] == (1.0 if delay == 0 else 0.0)
    assert res.summary["run_ahead_steps"] == 3


def test_no_run_ahead_without_step_spans(tmp_path):
    s = Synth()
    s.gpu(s.launch(1), 5, 10)
    res = analyze(s.write(tmp_path / "w.pt.trace.json"), window_us=3.0)
    assert np.isnan(res.summary["run_ahead_frac"]) and res.summary["run_ahead_steps"] == 0


def _prepare_then_forward(forward_after_sync: bool) -> tuple[Synth, list[float], list[float]]:
    """mtplab's loop: each step span opens with `prepare`, whose input copy (schedule stream)
    is issued 1 µs in; the forward (one graph replay of 150 µs of GPU work, then the d2h copy)
    is issued when `prepare` ends, and the span ends 10 µs later. `forward_after_sync`:
    `prepare` holds a host sync on the step in flight (the host read of the lengths), so the
    forward is issued 20 µs after the previous step's GPU work ended although the copy went
    out long before; otherwise `prepare` takes 10 µs and the host runs ahead. Returns the
    trace, the forward launch times and the ends of each step's GPU work."""
    s = Synth()
    t, gpu_free, fwd, ends = 0.0, 0.0, [], []
    for k in range(4):
        launch_fwd = ends[-1] + 20 if k and forward_after_sync else t + 10
        s.host("step[decode bs=8]", t, launch_fwd + 10 - t)
        s.host("prepare", t, launch_fwd - t)
        s.gpu(s.launch(t + 1, "cudaMemcpyAsync"), t + 3, 1, stream=5, cat="gpu_memcpy")
        s.host("verify", launch_fwd, 3)
        start = max(launch_fwd + 4, gpu_free)
        s.gpu(s.launch(launch_fwd, "cudaGraphLaunch"), start, 150)
        s.host("d2h", launch_fwd + 4, 2)
        s.gpu(s.launch(launch_fwd + 4), start + 150, 2, stream=9)
        gpu_free = start + 152
        fwd.append(launch_fwd)
        ends.append(gpu_free)
        t = launch_fwd + 11
    return s, fwd, ends


@pytest.mark.parametrize("after_sync", [False, True])
def test_launch_lead_counts_the_forward_launch_not_the_prepare_copies(tmp_path, after_sync):
    """The lead is measured to the next step's forward work (the bubble meter's
    `mark_launch`, just after `prepare`), not to input copies `prepare` issued earlier: with
    the forward issued after a host sync on the step in flight, every lead is -20 µs (the GPU
    waited) although each copy went out before the GPU ran out of work; without the sync the
    forwards run ahead (leads 135, 266, 397 µs: the GPU queue grows by 131 µs a step)."""
    s, fwd, ends = _prepare_then_forward(after_sync)
    res = analyze(s.write(tmp_path / f"p{after_sync}.pt.trace.json"))
    lead = res.steps["launch_lead_us"].to_numpy()
    want = [-20.0] * 3 if after_sync else [135.0, 266.0, 397.0]
    np.testing.assert_allclose([ends[k] - fwd[k + 1] for k in range(3)], want)
    np.testing.assert_allclose(lead[:3], want)
    assert np.isnan(lead[3])
    assert res.summary["run_ahead_frac"] == (0.0 if after_sync else 1.0)


def _zb_overlap_run(launch_us: float, steps: int = 6) -> tuple[Synth, list[float]]:
    """An overlap + zero_bubble decode loop as the host issues it, with per-stage graphs:
    per step span `prepare` (no device work), then three graph replays (`resolve` 20 µs,
    `verify` 300 µs, `draft` 80 µs of GPU work, each replayed kernel under its
    cudaGraphLaunch's correlation), the `d2h` copy kernel (a driver launch, 5 µs), then
    `sync` on the step in flight (until its d2h ends) and `process_result`; 150 µs of host
    time from the sync's return to the next forward launch. Each replay's call takes
    `launch_us` on the host and its kernels start once the call returned and the GPU is free
    (the profiler's cost per replay). Returns the trace and the leads by construction: end of
    step k's d2h - step k+1's first cudaGraphLaunch."""
    s = Synth()
    t, gpu_free, fwd, ends = 0.0, 0.0, [], []
    for k in range(steps):
        start = t
        s.host("prepare", t, 10)
        t += 10
        fwd.append(t)
        for stage, work in (("resolve", 20.0), ("verify", 300.0), ("draft", 80.0)):
            s.host(stage, t, launch_us + 1)
            c = s.launch(t, "cudaGraphLaunch", launch_us)
            begin = max(t + launch_us + 2, gpu_free)
            s.gpu(c, begin, work / 2)
            s.gpu(c, begin + work / 2, work / 2)
            gpu_free = begin + work
            t += launch_us + 1
        s.host("d2h", t, 6)
        c = s.launch(t + 1, "cuLaunchKernelEx", 4)
        s.events[-1]["cat"] = "cuda_driver"
        begin = max(t + 5, gpu_free)
        s.gpu(c, begin, 5, stream=9)
        gpu_free = begin + 5
        ends.append(gpu_free)
        t += 7
        wait_until = max(t, ends[k - 1]) if k else t
        s.host("sync", t, wait_until - t + 2)
        t = wait_until + 2
        s.host("process_result", t, 50)
        s.host("step[decode bs=8]", start, t + 50 - start)
        t += 150 - 2
    return s, [ends[k] - fwd[k + 1] for k in range(steps - 1)]


@pytest.mark.parametrize("launch_us", [5.0, 200.0])
def test_launch_lead_of_a_zero_bubble_overlap_run_matches_the_loop(tmp_path, launch_us):
    """Cheap replays (5 µs): the host loop (about 185 µs) is shorter than the GPU step
    (405 µs), so from the second step on the host waits in `sync`, and every lead is the GPU
    step less the 160 µs from the end of the step in flight to the next forward launch (the
    sync's return, process_result, the next prepare): +245 µs. Replays of 200 µs each (a
    profiler's cost per launch): the host loop (about 770 µs) is longer than the GPU step,
    the GPU runs each graph once its call returns, and the lead is the GPU work left when
    the host issues its last launch (184 µs: the draft graph and the d2h) less the host's
    time from there to the next forward launch (166 µs): near 0 (+18 µs), of either sign as
    those two vary. The analyser's leads are the loop's own in both."""
    s, want = _zb_overlap_run(launch_us)
    res = analyze(s.write(tmp_path / f"zb{launch_us:g}.pt.trace.json"))
    lead = res.steps["launch_lead_us"].to_numpy()
    np.testing.assert_allclose(lead[:-1], want)
    np.testing.assert_allclose(want[1:], 245.0 if launch_us == 5.0 else 18.0)
    assert np.isnan(lead[-1]) and res.summary["run_ahead_frac"] == 1.0
