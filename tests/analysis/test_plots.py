"""Plots: what each figure draws (lanes, bars, histogram counts, legends, read off the
returned figure) and that the file written holds a drawing."""
from __future__ import annotations

import pandas as pd
import pytest

from matplotlib.colors import to_hex, to_rgb

from mtplab.analysis.bubbles import analyze
from mtplab.analysis.causes import CAUSE_COLORS, CAUSES, cause_group
from mtplab.analysis.lanes import stream_labels
from mtplab.analysis.plots import (plot_bubble_fraction, plot_event_timeline, plot_gap_lengths,
                                    plot_step_times, plot_timeline, timeline_choices)
from mtplab.analysis.trace_io import load_trace
from test_bubbles import planted
from tests.helpers import Synth, assert_drawn_png, assert_drawn_svg, event_timeline_frame


@pytest.fixture(scope="module")
def trace_and_result(tmp_path_factory):
    s, _ = planted()
    path = s.write(tmp_path_factory.mktemp("plots") / "t.pt.trace.json")
    return path, analyze(path)



@pytest.fixture(autouse=True)
def _close_figures():
    """Each test's figures are closed after it (pyplot keeps every figure it opened)."""
    yield
    import matplotlib.pyplot as plt
    plt.close("all")

def _lanes(fig):
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_timeline_png_lanes_and_gaps(trace_and_result, tmp_path):
    path, res = trace_and_result
    out = tmp_path / "timeline.png"
    fig = plot_timeline(path, res, path=out)
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert_drawn_png(out)
    # mtplab's streams keep their names (from the stage spans on them); 13 has none: named
    # from its kernels (no GEMM anywhere, the only other kernel stream)
    assert _lanes(fig) == ["host", "forward (stream 7)", "side (stream 13)", "copy (stream 20)"]
    assert not list(tmp_path.glob(".*tmp*"))  # no temp file left behind
    labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"draft", "verify", "kernel"} <= labels


def test_timeline_gaps_are_coloured_by_cause_with_a_legend(trace_and_result):
    """Each device bubble is drawn in its cause's colour (causes.py), each cause drawn is in
    the legend; no one-colour hatch."""
    path, res = trace_and_result
    ax = plot_timeline(path, res).axes[0]
    drawn = list(dict.fromkeys(cause_group(res.device_gaps["cause"])))
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(),
                                              ax.get_legend().legend_handles)}
    assert {f"bubble: {c}" for c in drawn} == {k for k in legend if k.startswith("bubble")}
    assert len(drawn) >= 4
    for c in drawn:
        assert to_rgb(legend[f"bubble: {c}"].get_facecolor()) == to_rgb(CAUSE_COLORS[c])
    bands = [b for b in ax.collections if b.get_zorder() == 0.5]
    assert sorted(to_hex(b.get_facecolor()[0], keep_alpha=False) for b in bands) == \
        sorted(CAUSE_COLORS[c] for c in drawn)
    assert not any(b.get_hatch() for b in ax.collections)


def test_foreign_streams_are_named_from_their_kernels(tmp_path):
    """A program that is not mtplab: the GEMM stream is compute, memcpy-only copy, NCCL
    kernels nccl, other kernels side; two launching threads: the busier one is `host`."""
    s = Synth()
    s.host("ProfilerStep#0", 0, 200)
    s.gpu(s.launch(1), 5, 10, name="sm90_xmma_gemm_bf16bf16_bf16f32")
    s.gpu(s.launch(2), 20, 10, stream=9, name="void at::native::vectorized_elementwise_kernel")
    s.gpu(s.launch(3, "cudaMemcpyAsync"), 35, 5, stream=11, cat="gpu_memcpy")
    s.gpu(s.launch(4, tid=99), 45, 10, stream=13, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    s.gpu(s.launch(5), 60, 10, name="nvjet_tst_128x64_64x8_1x2_h_bz_TNT")
    res = analyze(s.write(tmp_path / "f.json"))
    fig = plot_timeline(tmp_path / "f.json", res)
    assert _lanes(fig) == ["host", "host thread 99", "compute (stream 7)", "side (stream 9)",
                           "copy (stream 11)", "nccl (stream 13)"]
    only_side = Synth()
    only_side.host("ProfilerStep#0", 0, 100)
    only_side.gpu(only_side.launch(1), 5, 10, stream=3, name="elementwise")
    only_side.gpu(only_side.launch(2), 20, 30, stream=4, name="reduce")
    tr = load_trace(only_side.write(tmp_path / "g.json"))
    assert stream_labels(tr, 0) == {3: "side (stream 3)", 4: "compute (stream 4)"}


def test_timeline_step_window_svg(trace_and_result, tmp_path):
    path, res = trace_and_result
    out = tmp_path / "w.svg"
    fig = plot_timeline(path, res, steps=(1, 2), path=out)
    assert out.read_text().lstrip().startswith("<?xml")
    st = res.steps.set_index("step")
    width = st.loc[2, "start_us"] + st.loc[2, "dur_us"] - st.loc[1, "start_us"]
    assert fig.axes[0].get_xlim() == pytest.approx((0.0, width))
    with pytest.raises(ValueError, match="no analysed step"):
        plot_timeline(path, res, steps=(7, 9))
    with pytest.raises(ValueError, match=r"\.png, \.svg or \.pdf"):
        plot_timeline(path, res, path=tmp_path / "x.bmp")


def test_bubble_fraction_and_histograms(trace_and_result, tmp_path):
    _, res = trace_and_result
    df = pd.concat([res.steps.assign(config="overlap"),
                    res.steps.assign(config="no-overlap", bubble_frac=0.9)])
    fig = plot_bubble_fraction(df, by="config", path=tmp_path / "frac.png")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["overlap", "no-overlap"]
    assert [p.get_height() for p in ax.patches] == pytest.approx(
        [res.steps["bubble_frac"].mean(), 0.9])
    with pytest.raises(ValueError, match="not in the table"):
        plot_bubble_fraction(df, by="topk")
    ax = plot_step_times(res.steps, path=tmp_path / "steps.png").axes[0]
    assert sum(p.get_height() for p in ax.patches) == len(res.steps)      # every step binned
    assert "dur_us" in ax.get_xlabel() and ax.get_ylabel() == "steps"
    ax = plot_gap_lengths(res.gaps, path=tmp_path / "gaps.svg").axes[0]
    device = res.gaps[res.gaps["scope"] == "device"] if "scope" in res.gaps else res.gaps
    assert sum(p.get_height() for p in ax.patches) == len(device) > 0    # stacked by cause
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(CAUSES)
    assert {p.name for p in tmp_path.iterdir()} == {"frac.png", "steps.png", "gaps.svg"}
    for name in ("frac.png", "steps.png"):
        assert_drawn_png(tmp_path / name)
    assert_drawn_svg(tmp_path / "gaps.svg")


def test_event_timeline_title_step_marks_and_present_stages(tmp_path):
    fig = plot_event_timeline(event_timeline_frame(), steps=(1, 3), title="demo",
                              path=tmp_path / "e.png")
    ax = fig.axes[0]
    assert _lanes(fig) == ["host", "copy", "forward"]
    assert ax.get_title() == "demo: steps 1–3 of 4 (dotted lines: step starts)"
    assert [t.get_text().strip() for t in ax.texts] == ["1", "2", "3"]     # step numbers
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["schedule", "verify", "d2h"]
    assert ax.get_xlabel() == "ms (host clock) from the start of step 1"  # a 2.9 ms window
    assert ax.get_xlim() == pytest.approx((0.0, 2.9))
    fig = plot_event_timeline(event_timeline_frame().query("stage != 'verify'"), steps=(0, 0))
    assert "verify" not in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert fig.axes[0].get_xlabel().startswith("µs")
    fig = plot_event_timeline(event_timeline_frame(), steps=(0, 0), unit="ms")
    assert fig.axes[0].get_xlim() == pytest.approx((0.0, 0.9))


def test_timeline_filters_lanes_stages_and_bubbles(trace_and_result):
    """Notebook 05's widgets: lanes, stages, the bubbles' causes and a length threshold act
    on the figure; the options come from timeline_choices."""
    path, res = trace_and_result
    tr = load_trace(path)
    lanes, stages = timeline_choices(tr, res)
    assert lanes == ["host", "forward (stream 7)", "side (stream 13)", "copy (stream 20)"]
    assert {"draft", "verify", "d2h"} <= set(stages)
    ax = plot_timeline(tr, res, lanes=["host", "forward (stream 7)"], stages=["verify"],
                       causes=["sync"], min_gap_us=5.0).axes[0]
    assert _lanes(ax.figure) == ["host", "forward (stream 7)"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "verify" in legend and "draft" not in legend
    assert [x for x in legend if x.startswith("bubble")] == ["bubble: sync"]
    assert ax.get_xlabel().endswith("bubbles drawn: >= 5 µs, causes sync")


def test_timeline_marks_each_steps_launch_lead(trace_and_result):
    """The planted trace's leads are -30 and -7 µs (test_bubbles): two red bars, labelled
    with their values, spanning from the next step's first launch to the step's GPU end."""
    from mtplab.analysis.plots import LEAD_COLORS

    path, res = trace_and_result
    ax = plot_timeline(path, res).axes[0]
    texts = {t.get_text() for t in ax.texts}
    assert {"-30 µs", "-7 µs"} <= texts
    red = [ln for ln in ax.lines if to_hex(ln.get_color()) == LEAD_COLORS["<= 0 (GPU waited)"]]
    t0 = float(res.steps["start_us"].iloc[0])
    ends = (res.steps["start_us"] + res.steps["dur_us"] - t0).tolist()
    spans = sorted(x for ln in red for x in sorted(ln.get_xdata()))
    assert spans == pytest.approx([ends[0], ends[0] + 30, ends[1], ends[1] + 7])
    labels = {t.get_text() for t in ax.get_legend().get_texts()}
    assert "launch lead <= 0 (GPU waited)" in labels and "launch lead > 0 (ahead)" not in labels


def _cpu_run_trace(tmp_path, n_steps: int = 4, step_us: float = 2e6):
    """A CPU run's trace: mtplab step spans seconds long, every stage span on the host."""
    from mtplab.stages import STAGE_COLORS
    s = Synth()
    stages = list(STAGE_COLORS)
    for k in range(n_steps):
        t = k * step_us
        s.host("step[decode bs=2]", t, step_us - 10)
        for j, stage in enumerate(stages):
            s.host(stage, t + j * step_us / len(stages), step_us / len(stages) - 20)
            s.host("aten::mm", t + j * step_us / len(stages) + 5, 100, cat="cpu_op")
    return s.write(tmp_path / "cpu_run.json")


def test_cpu_run_timeline_axis_in_seconds_and_legend_fits(tmp_path):
    """Seconds-long CPU steps: the x axis reads in s as plain numbers (no 1eN multiplier),
    and the legend of every stage is no taller than the plot (more columns instead)."""
    ax = plot_timeline(_cpu_run_trace(tmp_path)).axes[0]
    fig = ax.figure
    fig.canvas.draw()
    assert ax.get_xlabel().startswith("s from the start of step")
    assert ax.xaxis.get_offset_text().get_text() == ""
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks[:3] == ["0", "1", "2"]
    leg = ax.get_legend()
    assert len(leg.get_texts()) >= 10
    assert leg.get_window_extent().height <= ax.get_window_extent().height


def test_event_timeline_legend_fits_a_one_lane_plot():
    from mtplab.stages import STAGE_COLORS
    rows = [(0, s, "host", 100.0 * i, 100.0 * i + 90) for i, s in enumerate(STAGE_COLORS)]
    df = pd.DataFrame(rows, columns=["step", "stage", "stream", "host_start_us", "host_end_us"])
    ax = plot_event_timeline(df.assign(gpu_start_us=float("nan"), gpu_end_us=float("nan"))).axes[0]
    ax.figure.canvas.draw()
    assert ax.get_legend().get_window_extent().height <= ax.get_window_extent().height
