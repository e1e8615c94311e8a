"""Plot smoke tests: files exist, lanes are discoverable from the returned figure."""
from __future__ import annotations

import pandas as pd
import pytest

from mtplab.analysis.bubbles import analyze
from mtplab.analysis.plots import (plot_bubble_fraction, plot_event_timeline, plot_gap_lengths,
                                    plot_step_times, plot_timeline)
from test_bubbles import planted
from tests.helpers import event_timeline_frame


@pytest.fixture(scope="module")
def trace_and_result(tmp_path_factory):
    s, _ = planted()
    path = s.write(tmp_path_factory.mktemp("plots") / "t.pt.trace.json")
    return path, analyze(path)


def _lanes(fig):
    return [t.get_text() for t in fig.axes[0].get_yticklabels()]


def test_timeline_png_lanes_and_gaps(trace_and_result, tmp_path):
    path, res = trace_and_result
    out = tmp_path / "timeline.png"
    fig = plot_timeline(path, res, path=out)
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
    assert _lanes(fig) == ["host 4242", "stream 7", "stream 13", "stream 20"]
    assert not list(tmp_path.glob(".*tmp*"))  # no temp file left behind
    labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert {"draft", "verify", "bubble", "kernel"} <= labels


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
    plot_step_times(res.steps, path=tmp_path / "steps.png")
    plot_gap_lengths(res.gaps, path=tmp_path / "gaps.svg")
    assert {p.name for p in tmp_path.iterdir()} == {"frac.png", "steps.png", "gaps.svg"}


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
