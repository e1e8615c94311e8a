"""Study `deterministic` (mtplab/studies/deterministic): the ratios deterministic / default with
their noise and verdicts, the divergence counts and the answer are computed from the results
file alone; the report regenerates byte for byte through `mtplab report deterministic`; a
malformed results file gives one ConfigError."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtplab.errors import ConfigError
from mtplab.studies import deterministic as study
from mtplab.studies import reports as R
from mtplab.studies.cli import main_report

FIXTURES = Path(__file__).parent / "fixtures"


def arm(bs, name, det, tps, dec=None):
    return {"bs": bs, "arm": name, "deterministic": det, "tok_per_s": tps,
            "decode_tok_per_s": dec or tps}


def doc_of(throughput, divergence) -> dict:
    return study.results_doc(throughput=throughput, divergence=divergence, date="2026-12-04",
                             device="h200", device_name="NVIDIA H200", commit="abc1234",
                             command="python -m benchmarks.bench_deterministic",
                             model="tiny-code", new_tokens=192, repeats=3)


def cell(det, name, bs, k, first=()):
    return {"deterministic": det, "arm": name, "bs": bs, "diverging": k, "requests": bs,
            "first": list(first)}


def test_ratios_noise_verdicts_and_the_answer(tmp_path):
    """Target-only: 0.8x with 5% spread on one side (costs, noise 5%); frozen: 0.99x within
    2% (within the noise); eagle with one repeat a side (no verdict); divergence counted per
    mode, the deterministic mode's zero said as such."""
    doc = doc_of([arm(1, "target-only", False, [1000.0, 1050.0, 1020.0]),
                  arm(1, "target-only", True, [816.0, 800.0, 810.0]),
                  arm(1, "frozen_kv_mtp", False, [2000.0, 2010.0, 1990.0]),
                  arm(1, "frozen_kv_mtp", True, [1980.0, 1990.0, 1985.0]),
                  arm(32, "eagle", False, [3000.0]), arm(32, "eagle", True, [2000.0])],
                 [cell(False, "frozen", 8, 3, (40, 17, 90)), cell(False, "frozen", 1, 0),
                  cell(True, "frozen", 8, 0), cell(True, "frozen", 1, 0)])
    rs = {(r["arm"], r["figure"]): r for r in study.ratios(doc)}
    t = rs[("target-only", "decode_tok_per_s")]
    assert t["ratio"] == pytest.approx(810 / 1020) and t["noise"] == pytest.approx(0.05)
    assert t["verdict"] == R.COSTS
    assert rs[("frozen_kv_mtp", "tok_per_s")]["verdict"] == R.NOISE
    assert rs[("eagle", "tok_per_s")]["verdict"] == R.ONE_REPEAT
    path = R.write(doc, study.render, tmp_path)
    text = path.read_text()
    assert "| 1 | target-only | decode | 1020 | 810 | 0.794x ±5.0%, costs | 3 / 3 |" in text
    assert "| default | frozen | 0/1 [] | 3/8 [17, 40, 90] |" in text
    assert "| deterministic | frozen | 0/1 [] | 0/8 [] |" in text
    assert R.answer_line(path) == (
        "decode tok/s deterministic / default 0.794x ±5.0%, costs (target-only, bs 1), "
        "0.993x ±2.0%, within the noise (frozen_kv_mtp, bs 1), 0.667x ±2.0%, one repeat, no "
        "verdict (eagle, bs 32); default bf16 spec output diverges from target-only in 3 of 9 "
        "requests (3/8 frozen bs 8); deterministic spec output diverges from target-only in "
        "0 of 9 requests.")


def test_the_report_regenerates_byte_for_byte_through_mtplab_report(tmp_path, capsys):
    root = tmp_path / "results"
    shutil.copytree(FIXTURES / "deterministic", root / "deterministic")
    args = ["deterministic", "--root", str(root)]
    assert main_report(args) == 0                     # the index, once
    capsys.readouterr()
    assert main_report([*args, "--check"]) == 0, capsys.readouterr().out
    jp = R.newest("deterministic", root).with_suffix(".json")
    doc = json.loads(jp.read_text())
    doc["divergence"][-1]["diverging"] = 5
    jp.write_text(R.dump(doc))
    assert main_report([*args, "--check"]) == 1
    assert main_report(args) == 0
    assert "deterministic spec output diverges from target-only in 5 of 123" in \
        R.answer_line(jp.with_suffix(".md"))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.pop("throughput"), "'throughput' is missing or not a list"),
    (lambda d: d["throughput"][2].pop("decode_tok_per_s"),
     r"throughput\[2\] lacks \['decode_tok_per_s'\]"),
    (lambda d: d["throughput"][0].update(tok_per_s=[]), r"throughput\[0\]: .* one value per"),
    (lambda d: d["divergence"][1].pop("first"), r"divergence\[1\] lacks \['first'\]"),
])
def test_a_malformed_results_file_gives_one_clear_error(tmp_path, capsys, edit, message):
    root = tmp_path / "results"
    shutil.copytree(FIXTURES / "deterministic", root / "deterministic")
    jp = R.newest("deterministic", root).with_suffix(".json")
    doc = json.loads(jp.read_text())
    edit(doc)
    with pytest.raises(ConfigError, match=message):
        study.render(doc)
    jp.write_text(R.dump(doc))
    assert main_report(["deterministic", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "python -m benchmarks.bench_deterministic --out-dir DIR" in err[0]


def test_the_runner_writes_the_report_of_what_it_measured(tmp_path, monkeypatch, capsys):
    """bench_deterministic --out-dir on CPU, its two measurements replaced by planted records
    (the engines' runs are GPU work): the report lands in DIR/deterministic/ under the
    commit's stamp, names the command, and regenerates; a tree with uncommitted changes is
    refused before anything runs."""
    from mtplab.studies.deterministic import deterministic_bench as bench

    def throughput(a, prompts, data):
        for det, x in ((False, 100.0), (True, 80.0)):
            data.append(arm(1, "target-only", det, [x, x], [x, x]))
        return ["| throughput rows |"]

    def divergence_table(a, prompts, data):
        data.append(cell(False, "frozen", 8, 2, (5, 9)))
        return ["| divergence rows |"]
    monkeypatch.setattr(bench, "throughput", throughput)
    monkeypatch.setattr(bench, "divergence_table", divergence_table)
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234-dirty")
    assert bench.main(["--model", "random-tiny", "--out-dir", str(tmp_path)]) == 2
    assert "clean tree" in capsys.readouterr().err and not list(tmp_path.iterdir())
    monkeypatch.setenv("MTP_GIT_COMMIT", "abc1234def")
    assert bench.main(["--model", "random-tiny", "--repeats", "2",
                       "--out-dir", str(tmp_path)]) == 0
    path = R.newest("deterministic", tmp_path)
    assert path.name.endswith("_cpu_abc1234.md")
    doc = R.load(path)
    assert doc["command"] == ("python -m benchmarks.bench_deterministic --model random-tiny "
                              "--repeats 2 --out-dir " + str(tmp_path))
    assert doc["workload"] == {"model": "random-tiny", "new_tokens": 192, "repeats": 2}
    assert "0.800x ±2.0%, costs (target-only, bs 1)" in R.answer_line(path)
    assert R.regenerate("deterministic", study.render, tmp_path, check=True) == []
