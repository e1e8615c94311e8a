"""Study `spec_schedule` (mtplab/studies/spec_schedule): the ratios over off with their noise
and verdicts, the best setting per batch size, the schedule's gain and the answer are computed
from the results file alone; the report of a CPU smoke run of the group is written by `mtplab
report spec_schedule --from` and regenerates byte for byte; a malformed results file gives one
ConfigError."""
from __future__ import annotations

import json

import pytest
import yaml

from mtplab.errors import ConfigError
from mtplab.studies import reports as R
from mtplab.studies import spec_schedule as study
from mtplab.studies.cli import main_report

GROUP = {"models": ["tiny-code", "llama3-8b-like@32", "gemma4-31b-like"],
         "arms": ["off", "1x1", "3x1"], "batch_sizes": [1, 8, 32], "repeats": 3,
         "accept_rate": 0.8, "min_gain": 0.05, "max_running_requests": 32,
         "surface": {"prompt_len": 128, "output_len": 64, "warmup": 8},
         "workload": {"waves": [32, 16, 8], "refill_at": 2, "prompt_len": 128,
                      "output_len": [8, 160]}}


def _pts(*per_bs):
    return {str(b): list(xs) for b, xs in zip(GROUP["batch_sizes"], per_bs)}


RES = {
    "tiny-code": {
        "device": "NVIDIA H200", "commits": ["abc1234def"],
        "surface": {"off": _pts([100, 101, 99], [800, 808, 792], [3000, 3030, 2970]),
                    "1x1": _pts([150, 151, 149], [810, 815, 805], [2400, 2410, 2390]),
                    "3x1": _pts([200, 202, 198], [1000, 1010, 990], [2700, 2710, 2690])},
        "workload": {"off": [500, 510, 490], "1x1": [600, 610, 590], "3x1": [700, 714, 686]},
        "schedule": "8:3x1,32:off", "schedule_file": "/run/tiny-code.schedule.yaml",
        "gain": {"static_setting": "3x1", "schedule_text": "8:3x1,32:off",
                 "static": [700, 707, 693], "schedule": [770, 777, 763],
                 "ratios": [1.1, 1.099, 1.101]}},
    "llama3-8b-like@32": {         # one repeat, and the budget ended before 3x1
        "device": "NVIDIA H200", "commits": ["abc1234def"],
        "surface": {"off": _pts([10], [80], [300]), "1x1": _pts([12], [70], [310])},
        "workload": {"off": [50], "1x1": [55]}},
}


def doc_of(res=RES) -> dict:
    return study.results_doc(GROUP, res, command="mtplab bench --groups schedule",
                             date="2026-12-04")


def test_ratios_best_setting_gain_and_the_answer(tmp_path):
    doc = doc_of()
    assert (doc["device"], doc["commit"], doc["device_name"]) == ("h200", "abc1234",
                                                                 "NVIDIA H200")
    tiny, llama, gemma = doc["models"]
    rows = {(r["bs"], r["setting"]): r for r in study.surface(doc, tiny)}
    assert rows[(1, "1x1")]["ratio"] == pytest.approx(1.5)
    assert rows[(1, "1x1")]["noise"] == pytest.approx(101 / 99 - 1)      # off's spread
    assert rows[(8, "1x1")]["verdict"] == R.NOISE
    assert rows[(32, "3x1")]["verdict"] == R.COSTS and rows[(8, "3x1")]["verdict"] == R.PAYS
    assert study.best(doc, tiny) == {1: "3x1", 8: "3x1", 32: "off"}
    assert study.best(doc, llama) == {1: "1x1", 8: "off", 32: "1x1"}
    g = study.gain(tiny)
    assert g["ratio"] == pytest.approx(1.1) and g["verdict"] == R.PAYS
    assert g["noise"] == pytest.approx(707 / 693 - 1)                    # static's spread
    assert study.gain(llama) is None
    path = R.write(doc, study.render, tmp_path)
    assert path.name == "2026-12-04_h200_abc1234.md"
    text = path.read_text()
    assert "| bs | off tok/s | 1x1 tok/s (vs off) | 3x1 tok/s (vs off) | best |" in text
    assert "| 1 | 100 | 150 (1.500x ±2.0%, pays) | 200 (2.000x ±2.0%, pays) | 3x1 |" in text
    assert "| 32 | 3,000 | 2,400 (0.800x ±2.0%, costs) | 2,700 (0.900x ±2.0%, costs) | off |" \
        in text
    assert "| workload | 500 (490-510) | 600 (590-610) | 700 (686-714) | 3x1 |" in text
    assert "| 8 | 80 | 70 (0.875x ±2.0%, one repeat, no verdict) | off |" in text
    assert "- gain on the varying workload over the best static setting `3x1`, 3 alternating " \
           "round(s): schedule 770 (763-777) tok/s, static 700 (693-707); per-round ratios " \
           "1.100, 1.099, 1.101; median 1.100x ±2.0%, pays" in text
    assert "## gemma4-31b-like\n\n- not measured" in text
    assert R.answer_line(path) == (
        "tiny-code: over off, pays: 1x1 at bs 1, 3x1 at bs 1-8; costs: 1x1 at bs 32, 3x1 at "
        "bs 32; within the noise: 1x1 at bs 8; best per bs 3x1 (bs 1-8), off (bs 32); the "
        "schedule `8:3x1,32:off` over the best static setting 3x1 on the varying workload "
        "1.100x ±2.0%, pays. llama3-8b-like@32: over off, one repeat, no verdict: 1x1 at bs "
        "1-32; best per bs 1x1 (bs 1, 32), off (bs 8); no schedule (not every setting "
        "measured). gemma4-31b-like: not measured.")


def test_a_schedule_that_is_the_static_setting_says_so():
    """min_gain keeps the best static setting everywhere: one bucket of it; the gain then
    compares two like engines, and the answer says so."""
    tiny = dict(RES["tiny-code"], schedule="32:3x1")
    tiny["gain"] = dict(tiny["gain"], schedule_text="32:3x1", ratios=[1.0, 1.003, 0.999])
    doc = doc_of({"tiny-code": tiny})
    assert study.gain(doc["models"][0])["same"] and not study.gain(RES["tiny-code"])["same"]
    assert "the schedule `32:3x1` is the best static setting 3x1 itself (two such engines on " \
           "the varying workload: 1.000x ±2.0%, within the noise)" in study.answer(doc)
    assert "- the schedule is the best static setting `3x1` itself" in study.render(doc)


def test_spans_name_runs_of_neighbouring_batch_sizes():
    assert study.spans([1, 2, 4, 8, 16, 32], [1, 2, 4, 16]) == "1-4, 16"
    assert study.spans([1, 2, 4], [2]) == "2"


@pytest.mark.parametrize("commits, why", [
    (["abc1234def", "def5678abc"], "'def5678abc'"), (["abc1234def-dirty"], "-dirty'")])
def test_a_report_names_one_commit_of_a_clean_tree(commits, why):
    res = {k: dict(v, commits=commits) for k, v in RES.items()}
    with pytest.raises(ConfigError, match=why):
        doc_of(res)


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("models"), "'models' is missing or not a list"),
    (lambda d: d["group"].pop("batch_sizes"), "group 'batch_sizes' is missing"),
    (lambda d: d["group"].update(arms=["1x1", "3x1"]), "lack 'off'"),
    (lambda d: d["group"]["workload"].pop("waves"), "group 'workload' lacks"),
    (lambda d: d["models"][1].update(surface=[1, 2]), r"models\[1\]: surface is not"),
    (lambda d: d["models"][0]["surface"]["1x1"].pop("8"), r"models\[0\] surface '1x1' bs 8"),
    (lambda d: d["models"][0]["surface"]["3x1"].update({"1": []}), "one per repeat"),
    (lambda d: d["models"][0]["workload"].update(off="fast"), r"models\[0\] workload 'off'"),
    (lambda d: d["models"][0]["gain"].pop("ratios"), r"models\[0\] gain lacks"),
    (lambda d: d["models"][0]["gain"]["static"].pop(), "one value per round"),
])
def test_a_malformed_results_file_gives_one_clear_error(tmp_path, capsys, edit, message):
    root = tmp_path / "results"
    path = R.write(doc_of(), study.render, root)
    doc = json.loads(path.with_suffix(".json").read_text())
    edit(doc)
    with pytest.raises(ConfigError, match=message):
        study.render(doc)
    path.with_suffix(".json").write_text(R.dump(doc))
    assert main_report(["spec_schedule", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mtplab report spec_schedule --from D/schedule" in err[0]


def test_from_takes_one_schedule_folder(tmp_path, capsys):
    root = tmp_path / "results"
    root.mkdir()
    run = tmp_path / "run" / "schedule"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(RES))
    assert main_report(["spec_schedule", "--root", str(root), "--from", str(run)]) == 2
    assert "grid.yaml does not exist" in capsys.readouterr().err
    assert main_report(["spec_schedule", "--root", str(root), "--from", str(run),
                        str(run)]) == 2
    assert "give --from one folder" in capsys.readouterr().err
    (run / "grid.yaml").write_text(yaml.safe_dump(GROUP))
    (run / "results.json").write_text(json.dumps([RES]))
    assert main_report(["spec_schedule", "--root", str(root), "--from", str(run)]) == 2
    assert "results.json is not a mapping" in capsys.readouterr().err
    (run / "results.json").write_text(json.dumps(RES))
    assert main_report(["spec_schedule", "--root", str(root), "--from", str(run),
                        "--date", "2026-12-04"]) == 0
    assert R.load(root / "spec_schedule" / "2026-12-04_h200_abc1234.md") == doc_of()


def test_the_report_of_a_smoke_run_regenerates_byte_for_byte(tmp_path, monkeypatch, capsys):
    """`mtplab bench --groups schedule --smoke` on CPU (two repeats, so every ratio has a
    verdict), its dated report written by `mtplab report spec_schedule --from`: it names what
    ran, regenerates byte for byte, and a changed results file is caught by --check."""
    from mtplab.studies.bench import grid_doc
    from mtplab.studies.spec_schedule.runner import run_group
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def")
    run = tmp_path / "run" / "schedule"
    run_group(grid_doc("schedule"), run, device="cpu", smoke=True, repeats=2)
    root = tmp_path / "results"
    root.mkdir()
    args = ["spec_schedule", "--root", str(root)]
    assert main_report([*args, "--from", str(run), "--date", "2026-12-04",
                        "--command", "mtplab bench --groups schedule --smoke"]) == 0
    path = root / "spec_schedule" / "2026-12-04_cpu_abc1234.md"
    doc = R.load(path)
    assert doc["group"]["arms"] == ["off", "1x1"] and doc["group"]["batch_sizes"] == [1, 2]
    m = doc["models"][0]
    assert m["model"] == "random-tiny" and len(m["gain"]["ratios"]) == 2
    assert all(len(xs) == 2 for pts in m["surface"].values() for xs in pts.values())
    text = path.read_text()
    assert "- command: `mtplab bench --groups schedule --smoke`" in text
    assert f"- schedule: `{m['schedule']}`" in text
    answer = R.answer_line(path)
    assert answer.startswith("random-tiny: over off, ") and "one repeat" not in answer
    # the smoke run's timings decide whether the schedule is the best static setting itself
    same = study.gain(m)["same"]
    assert (f"the schedule `{m['schedule']}` "
            f"{'is the best static setting' if same else 'over the best static setting'}"
            in answer)
    capsys.readouterr()
    assert main_report([*args, "--check"]) == 0, capsys.readouterr().out
    doc["models"][0]["surface"]["off"]["1"] = [1e9, 1e9]
    doc["models"][0]["surface"]["1x1"]["1"] = [1.0, 1.0]
    path.with_suffix(".json").write_text(R.dump(doc))
    assert main_report([*args, "--check"]) == 1
    assert main_report(args) == 0
    assert "costs: 1x1 at bs 1" in R.answer_line(path)
