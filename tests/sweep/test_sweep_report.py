"""Sweep report helpers on a hand-made results table: the end-of-sweep text table, bar order
and legend, heatmap label colours, and where a notebook's out_dir lands."""
from __future__ import annotations

import json
import os

import matplotlib.pyplot as plt
import pandas as pd
import pytest

from mtplab.studies import figures
from mtplab.studies.figures import bars, heatmap, label_color, notebook_out
from mtplab.sweep.results import results_table


def results() -> pd.DataFrame:
    arms = [{"overlap": False, "batch_size": 1}, {"overlap": True, "batch_size": 1},
            {"overlap": False, "batch_size": 4}, {"overlap": True, "batch_size": 4}]
    rows = [{"cell_id": f"c{i}", "status": "ok", "settings_json": json.dumps(a),
             "cfg.overlap": a["overlap"], "batch_size": a["batch_size"], "cfg.page_size": 16,
             "tok_per_s": 100.0 * (i + 1) + 0.123, "accept_len": 2.5,
             "bubble_frac": float("nan") if i == 0 else 0.25 * i}
            for i, a in enumerate(arms)]
    rows.append({"cell_id": "c4", "status": "failed", "settings_json": "{}",
                 "error": "boom", "tok_per_s": float("nan")})
    return pd.DataFrame(rows)


def test_results_table_has_axes_and_metrics():
    text = results_table(results())
    head, *body = text.splitlines()
    assert head.split() == ["cell_id", "status", "overlap", "batch_size", "tok/s", "accept_len",
                            "bubble"]
    assert len(body) == 5
    assert body[1].split() == ["c1", "ok", "True", "1", "200", "2.5", "25.0%"]
    assert body[0].split()[-1] == "-" and body[4].split()[:2] == ["c4", "failed"]
    assert results_table(results().iloc[:0]) == "(no cells)"
    unprofiled = results_table(results().drop(columns="bubble_frac")).splitlines()
    assert unprofiled[0].split()[-1] == "bubble" and unprofiled[2].split()[-1] == "-"


def test_bars_keep_row_order_and_a_compact_legend():
    df = pd.DataFrame({"arm": ["overlap only", "async_d2h", "zero_bubble (all)"],
                       "status": "ok", "v": [1.0, 2.0, 3.0]})
    ax = bars(df, "arm", "v")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["overlap only", "async_d2h",
                                                            "zero_bubble (all)"]
    ax = bars(results(), "batch_size", "tok_per_s", ["cfg.overlap", "cfg.page_size"])
    leg = ax.get_legend()
    assert leg.get_title().get_text() == "overlap, page_size"
    assert [t.get_text() for t in leg.get_texts()] == ["False, 16", "True, 16"]
    plt.close("all")


@pytest.mark.parametrize("rgba, color", [((1.0, 1.0, 0.0, 1.0), "black"), ("#fde725", "black"),
                                         ("#440154", "white"), ((0, 0, 0, 1), "white"),
                                         ("white", "black"), ("#3b528b", "white")])
def test_label_color_by_luminance(rgba, color):
    assert label_color(rgba) == color


def test_heatmap_labels_readable_on_yellow():
    df = pd.DataFrame({"x": [1, 1, 2, 2], "y": [1, 2, 1, 2], "v": [0.0, 1.0, 2.0, 3.0],
                       "status": "ok"})
    ax = heatmap(df, "x", "y", "v")
    colors = {t.get_text(): t.get_color() for t in ax.texts}
    assert colors["3"] == "black" and colors["0"] == "white"     # viridis: yellow top, purple low
    flat = heatmap(df.assign(v=2.58), "x", "y", "v")               # one value: drawn mid-scale
    assert {t.get_color() for t in flat.texts} == {"black"}        # on viridis' mid teal
    plt.close("all")


def test_notebook_out_resolves_from_the_repo_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = notebook_out(f"traces/_probe_{os.getpid()}")       # traces/ is in the repository
    try:
        assert p == figures.REPO_ROOT / "traces" / f"_probe_{os.getpid()}" and p.is_dir()
        assert (figures.REPO_ROOT / "pyproject.toml").is_file()
        assert not (tmp_path / "traces").exists()
    finally:
        p.rmdir()
    assert notebook_out(tmp_path / "abs") == tmp_path / "abs" and (tmp_path / "abs").is_dir()


def test_write_answer_is_strict_json(tmp_path, capsys):
    """A missing value is null (bare NaN is not JSON); numpy scalars are plain numbers."""
    import json

    import numpy as np

    from mtplab.studies.figures import write_answer
    p = write_answer(tmp_path, {"a": float("nan"), "b": np.float64("inf"), "c": np.int64(3),
                                "d": pd.NA, "e": {"x": np.nan}, "f": "ok"})

    def refuse(name):
        raise AssertionError(name)
    assert json.loads(p.read_text(), parse_constant=refuse) == \
        {"a": None, "b": None, "c": 3, "d": None, "e": {"x": None}, "f": "ok"}
    assert "a: None" in capsys.readouterr().out


def test_the_meter_on_cpu_is_named_the_host_clock_meter_everywhere():
    """One bubble story on CPU: the meter stamps the host clock there, and the sweep table,
    the bars, the effect sentences and figure, and the bench header all say so."""
    from mtplab.studies.bench import table
    from mtplab.studies.effects import arm_effects, plot_effects
    from mtplab.sweep.metrics import meter_name
    assert meter_name(["cpu", "cpu"]) == "meter, host clock"
    assert meter_name(["cuda:0"]) == "meter" and meter_name(["cpu", "cuda"]).endswith("CPU cells")
    cpu = results().assign(**{"cfg.device": "cpu"})
    assert results_table(cpu).splitlines()[0].endswith("bubble (meter, host clock)")
    assert "bubble (meter)" in results_table(results().assign(**{"cfg.device": "cuda:0"}))
    assert bars(cpu, "batch_size", "bubble_frac").get_ylabel() == "bubble_frac (meter, host clock)"
    cpu["arm"] = ["off", "ov", "off", "ov", "off"]
    eff = arm_effects(cpu, "arm", [("ov", "off")], value="tok_per_s")
    assert "bubble (meter, host clock)" in eff["sentence"].iloc[0]
    low = pd.DataFrame([{"status": "ok", "arm": a, "cfg.device": "cpu", "decode_tok_per_s": t,
                         "bubble_frac": 0.02, "meter_wall_us_per_step": 1000.0,
                         "bubble_us_per_step": 20.0} for a, t in
                        [("off", 100), ("off", 101), ("ov", 100.5), ("ov", 100)]])
    why = arm_effects(low, "arm", [("ov", "off")])["sentence"].iloc[0]
    assert "step is outside every stage (host clock) only 2.0%" in why
    assert "stage busy per decode step 980 -> 980 us" in why and "device" not in why
    assert (plot_effects(eff).axes[1].get_ylabel()
            == "bubble (meter, host clock) vs baseline (points)")
    doc = {"base": {"device": "cpu"}, "grid": {"repeat": [0]}, "arms": [{"overlap": False}]}
    rec = {"status": "ok", "settings_json": json.dumps({"device": "cpu", "overlap": False,
                                                        "repeat": 0}),
           "cfg.device": "cpu", "decode_tok_per_s": 10.0, "bubble_frac": 0.1}
    assert "bubble % meter, host clock (profiled:" in table(pd.DataFrame([rec]), doc)


def test_notebook_tables_name_the_meter_clock():
    """meter_labels, which the notebooks' tables go through: the meter's columns named with
    its clock, the others kept."""
    from mtplab.studies.figures import meter_labels
    t = pd.DataFrame({"arm": ["a"], "bubble_frac": [0.1], "bubble_us_per_step": [5.0],
                      "bubble_frac_profiled": [float("nan")]})
    assert list(meter_labels(t, ["cpu"]).columns) == [
        "arm", "bubble_frac (meter, host clock)", "bubble_us_per_step (meter, host clock)",
        "bubble_frac_profiled"]
    assert list(meter_labels(t, pd.Series(["cuda:0"])).columns)[1] == "bubble_frac (meter)"
