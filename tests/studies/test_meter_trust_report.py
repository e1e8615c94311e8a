"""Study `meter_trust` (mtplab/studies/meter_trust): its report is computed from the results
file alone (figures, noise, PASS/MISS, the answer), regenerates byte for byte through
`mtplab report meter_trust`, refuses a malformed results file with one ConfigError, and the
parts' CPU paths fill the results the report reads."""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mtplab.errors import ConfigError
from mtplab.studies import meter_trust as study
from mtplab.studies import reports as R
from mtplab.studies.cli import main_report

FIXTURES = Path(__file__).parent / "fixtures"


def doc_of(parts: dict) -> dict:
    return study.results_doc(parts, date="2026-12-04", device="h200", device_name="NVIDIA H200",
                             commit="abc1234", command="python -m benchmarks.bench_meter")


def planted(rises: dict, mode: str = "off") -> dict:
    """One planted record: d (ms) -> the rise of each pair (µs)."""
    return {"regime": "host-bound", "mode": mode, "model": "tiny-code",
            "draft": "frozen_kv_mtp", "bs": 1, "tokens": 192, "base_us": [30.0, 31.0],
            "wall_us": [900.0, 910.0],
            "delays": [{"d_ms": d, "rise_us": r, "host_us": [d * 1e3] * len(r)}
                       for d, r in rises.items()]}


def overhead(bs: int, slow: float, reps: int = 9) -> dict:
    """One overhead record, two engines per arm, the meter arm `slow` slower every repeat."""
    machine = 3000 * np.exp(np.random.default_rng(bs).normal(0, 0.02, reps))
    rates = {f"{a} {i}": [float(x) for x in machine * (1 - slow if a == "on" else 1)]
             for a in ("off", "on") for i in range(2)}
    return {"bs": bs, "tokens": 128, "per_arm": 2, "eager_per_step": 0.3, "rates": rates}


def rows_of(text: str) -> dict[str, list[str]]:
    """The Figures table: figure -> its cells (value, noise, target, verdict)."""
    table = text.split("## Figures", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 6 and cells[0] != "part":
            out[cells[1]] = cells[2:]
    return out


def test_render_reads_targets_verdicts_noise_and_the_answer(tmp_path):
    """Planted rises (the median of the pairs against d ± max(5%, 10 µs)), the overhead
    (1 - median of the per-repeat ratios, its bootstrap interval, against 1%), meter vs
    profiler (2 points) and a stated figure: each with its noise and verdict, and the answer
    line counts the checks and names the one missed."""
    doc = doc_of({
        "planted": [planted({0.2: [195.0, 204.0, 209.0], 1.0: [1080.0, 1070.0, 1090.0]}),
                    planted({0.2: [60.0, 70.0, 80.0]}, mode="on+zb")],
        "overhead": [overhead(1, 0.005), overhead(32, 0.02)],
        "profiler": [{"regime": "backlogged", "meter_frac": 0.40, "profiler_frac": 0.415,
                      "steps": 11, "aligned": True}],
    })
    text = study.render(doc)
    rows = rows_of(text)
    off = "planted delay {} µs, host-bound, overlap off: the meter's rise"
    assert rows[off.format(200)] == ["204.0 µs", "rise IQR [200, 206] µs over 3 pairs",
                                     "200 ± 10 µs", "PASS"]
    assert rows[off.format(1000)] == ["1080.0 µs", "rise IQR [1075, 1085] µs over 3 pairs",
                                      "1000 ± 50 µs", "MISS"]
    hidden = rows["planted delay 200 µs, host-bound, overlap + zero_bubble: hidden"]
    assert hidden[0] == "130.0 µs (65.0%)" and hidden[2:] == ["-", "stated"]
    bs1 = rows["meter overhead, decode tok/s, bs 1 (2 engines per arm)"]
    assert bs1[0] == "0.50%" and bs1[1] == "95% interval [0.50, 0.50] over 9 repeats"
    assert bs1[2:] == ["≤ 1%", "PASS"]
    assert rows["meter overhead, decode tok/s, bs 32 (2 engines per arm)"][3] == "MISS"
    assert rows["meter vs profiler, backlogged: profiler - meter bubble (40.0% vs 41.5%)"] == [
        "+1.5 points", "one profiled run of 11 steps", "≤ 2 points", "PASS"]
    assert R.answer_line(R.write(doc, study.render, tmp_path)) == (
        "3 of 5 checks pass; the meter reads a planted host delay back within its target in 1 "
        "of 2 (overlap off); profiler - meter bubble with the GPU backlogged +1.5 points; the "
        "meter costs 0.50% [0.50, 0.50] at bs 1 and 2.00% [2.00, 2.00] at bs 32 of decode "
        "tok/s (target ≤ 1%); missed: planted delay 1000 µs, host-bound, overlap off: the "
        "meter's rise, meter overhead, decode tok/s, bs 32 (2 engines per arm); not run: "
        "resolution, host_wake, stamp_cost, planted_profiler, split.")


def test_the_report_regenerates_byte_for_byte_through_mtplab_report(tmp_path, capsys):
    """The fixture folder copied: `mtplab report meter_trust` writes the index once, then
    `--check` finds nothing to change; a figure edited in the results file is caught and
    written again."""
    root = tmp_path / "results"
    shutil.copytree(FIXTURES / "meter_trust", root / "meter_trust")
    args = ["meter_trust", "--root", str(root)]
    assert main_report(args) == 0
    capsys.readouterr()
    assert main_report([*args, "--check"]) == 0, capsys.readouterr().out
    jp = R.newest("meter_trust", root).with_suffix(".json")
    doc = json.loads(jp.read_text())
    doc["parts"]["profiler"][0]["profiler_frac"] = 0.9
    jp.write_text(R.dump(doc))
    assert main_report([*args, "--check"]) == 1
    assert jp.with_suffix(".md").name in capsys.readouterr().out
    assert main_report(args) == 0
    row = rows_of(jp.with_suffix(".md").read_text())[
        "meter vs profiler, backlogged: profiler - meter bubble (41.2% vs 90.0%)"]
    assert row == ["+48.8 points", "one profiled run of 11 steps", "≤ 2 points", "MISS"]
    assert main_report([*args, "--check"]) == 0


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("parts"), "'parts' is missing"),
    (lambda d: d["parts"].update(bogus=[]), "unknown parts ['bogus']"),
    (lambda d: d["parts"]["overhead"][0].pop("rates"), "part 'overhead', record 0, lacks "
                                                        "['rates']"),
    (lambda d: d["parts"]["planted"][0]["delays"][1].pop("rise_us"),
     "part 'planted', record 0, delay 1, lacks ['rise_us']"),
    (lambda d: d["parts"]["resolution"].pop("ticks"), "part 'resolution', record 0, lacks"),
])
def test_a_malformed_results_file_gives_one_clear_error(tmp_path, capsys, edit, message):
    root = tmp_path / "results"
    shutil.copytree(FIXTURES / "meter_trust", root / "meter_trust")
    jp = R.newest("meter_trust", root).with_suffix(".json")
    doc = json.loads(jp.read_text())
    bad = copy.deepcopy(doc)
    edit(bad)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        study.render(bad)
    jp.write_text(R.dump(bad))
    assert main_report(["meter_trust", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mtplab report: error: a meter_trust results")
    assert "python -m benchmarks.bench_meter --out-dir DIR" in err[0]


def test_the_cpu_parts_fill_the_results_the_report_reads(tmp_path):
    """host-wake and overhead on CPU (their CPU paths): the records they leave make a report
    whose overhead figure is the row the part printed, and that regenerates."""
    from mtplab.studies.meter_trust.meter_host_wake import host_wake
    from mtplab.studies.meter_trust.meter_overhead import overhead as run_overhead
    rows, data = [], {}
    host_wake(rows, reps=2, device="cpu", data=data)
    run_overhead(rows, reps=3, tokens=16, sizes=(1,), per_arm=1, seconds=None, data=data)
    assert sorted(data) == ["host_wake", "overhead"]
    assert {len(r["us"]) for r in data["host_wake"]} == {2}
    assert sorted(data["overhead"][0]["rates"]) == ["off 0", "on 0"]
    path = R.write(doc_of(data), study.render, tmp_path / "results")
    printed = next(ln for ln in rows if ln.startswith("| 1 |")).strip("|").split("|")
    got = rows_of(path.read_text())["meter overhead, decode tok/s, bs 1 (1 engines per arm)"]
    assert float(got[0].rstrip("%")) == pytest.approx(float(printed[4].split("%")[0]),
                                                      abs=0.011)
    assert "## Host work right after a wait" in path.read_text()
    assert R.regenerate("meter_trust", study.render, tmp_path / "results", check=True) == []


def test_pool_and_out_dir_are_refused_together(capsys):
    from mtplab.studies.meter_trust.meter_bench import main
    with pytest.raises(SystemExit):
        main(["--pool", "a.npz", "--out-dir", "x"])
    assert "give one of them" in capsys.readouterr().err


def test_the_runner_writes_the_report_of_what_it_ran(tmp_path, monkeypatch):
    """bench_meter --only host-wake --out-dir on CPU (the device calls stood in for: the part
    runs its CPU path): the report lands in DIR/meter_trust/ under the commit's stamp, names
    the command and the parts not run, and regenerates."""
    import torch

    from mtplab.studies.meter_trust import meter_bench
    from mtplab.studies.meter_trust.meter_host_wake import host_wake
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(meter_bench, "host_wake",
                        lambda rows, data: host_wake(rows, reps=2, device="cpu", data=data))
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def")
    out = tmp_path / "bench_meter.md"
    assert meter_bench.main(["--only", "host-wake", "--out", str(out),
                             "--out-dir", str(tmp_path)]) == 0
    path = R.newest("meter_trust", tmp_path)
    assert path.name.endswith("_h200_abc1234.md")
    assert R.load(path)["command"].endswith(f"--out-dir {tmp_path}")
    assert R.answer_line(path) == (
        "no figure with a target was measured; not run: resolution, stamp_cost, planted, "
        "planted_profiler, profiler, overhead, split.")
    assert "Host work right after a wait" in out.read_text()
    assert R.regenerate("meter_trust", study.render, tmp_path, check=True) == []
