"""The studies whose reports are not a bench group's table (whatif, health, moe_floor): each
render regenerates its fixture report byte for byte from the fixture's results, and each
results doc is built from what its run writes."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from mtplab.studies import reports as R
from mtplab.studies import study
from mtplab.studies.cli import main_report

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("question", sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()))
def test_the_fixture_report_regenerates_byte_for_byte(question):
    mods = R.reports(question, FIXTURES)
    assert mods, f"no fixture report for {question}"
    for md in mods:
        assert study(question).render(R.load(md)) == md.read_text(), md
    assert R.regenerate(question, study(question).render, FIXTURES, check=True) == []


# -- whatif ----------------------------------------------------------------------------------
def _regime_run(tmp_path: Path, name: str, model: str, layers, bs: int, repeats: dict,
                validation: list[dict], commit: str = "abc1234") -> Path:
    """A regime run's folder as `mtplab bench --groups regime --dir D` leaves it: its
    results.parquet (target-only arms off / on, the repeats each ran) and the validation its
    report wrote (whatif_validation.csv)."""
    d = tmp_path / name / "regime"
    d.mkdir(parents=True)
    recs = []
    for overlap, n in repeats.items():
        for rep in range(n):
            recs.append({"status": "ok", "cfg.model": model, "cfg.layers": layers,
                         "batch_size": bs, "prompt_len_tokens": 512, "repeat": rep,
                         "cfg.draft": "none", "cfg.overlap": overlap, "cfg.zb_async_d2h": True,
                         "cfg.zb_device_seq_lens": False, "cfg.zb_draft_preexec": False,
                         "cfg.fold_seed": False, "host_delay_us": 0.0, "git_commit": commit,
                         "device_name": "NVIDIA H200"})
    pd.DataFrame(recs).to_parquet(d / "results.parquet")
    pd.DataFrame(validation).to_csv(d / "whatif_validation.csv", index=False)
    return d


def _pair(where, arm, base, whatif, predicted, ratio, noise, judged, n=2, n_base=2):
    return {"where": where, "arm": arm, "baseline": base, "whatif": whatif,
            "direction": whatif.replace("=", " "), "predicted": predicted, "ratio": ratio,
            "noise": noise, "error": predicted / ratio - 1, "self_error": 0.01,
            "judged": judged, "n": n, "n_base": n_base, "note": float("nan"),
            "host_speed": 1.0, "error_at_speed": predicted / ratio - 1,
            "judged_at_speed": judged}


def test_a_whatif_report_from_two_regime_runs(tmp_path, capsys):
    big = "model=llama3-8b-like layers=16 bs=8 prompt=512 draft=none"
    tiny = "model=tiny-code bs=1 prompt=512 draft=none"
    a = _regime_run(tmp_path, "l16", "llama3-8b-like", 16, 8, {False: 2, True: 2}, [
        _pair(big, "target on", "target off", "overlap=on", 1.30, 1.25, 0.03, "within 10%"),
        _pair(big, "target off", "target on", "overlap=off", 0.78, 0.80, 0.03, "within 10%")])
    b = _regime_run(tmp_path, "tiny", "tiny-code", None, 1, {False: 2, True: 1}, [
        _pair(tiny, "target on", "target off", "overlap=on", 1.10, 1.50, 0.02,
              "no verdict: one repeat", n=1)])
    root = tmp_path / "results"
    root.mkdir()
    assert main_report(["whatif", "--root", str(root), "--from", str(a), str(b),
                        "--date", "2026-12-04", "--command", "two runs"]) == 0
    md = root / "whatif" / "2026-12-04_h200_abc1234.md"
    text = md.read_text()
    answer = R.answer_line(md)
    assert answer.startswith("2 of 2 predicted ratios within 10%")
    assert "overlap on from a target-only base with overlap off (`target off`): predicted " \
           "1.300x, measured 1.250x ±3.0%, pays (error +4.0%)" in answer
    assert "tiny-code bs1 p512 ran one repeat fewer for 1 of its 2 arms" in answer
    assert "## llama3-8b-like@16 bs8 p512" in text and "## tiny-code bs1 p512" in text
    assert "| target on | target off | overlap=on | overlap on | 1.100 | 1.500x ±2.0%, one " \
           "repeat, no verdict |" in text
    assert "| overlap off | 1 | 1 | 1 | 2.5% | -2.5% |" in text           # the other way
    assert main_report(["whatif", "--root", str(root), "--check"]) == 0
    doc = json.loads(md.with_suffix(".json").read_text())
    assert [r["rung"] for r in doc["rows"]] == ["llama3-8b-like@16 bs8 p512"] * 2 + \
        ["tiny-code bs1 p512"]


def test_a_whatif_report_refuses_runs_of_two_commits(tmp_path, capsys):
    row = _pair("model=tiny-code bs=1 prompt=512 draft=none", "target on", "target off",
                "overlap=on", 1.1, 1.1, 0.02, "within 10%")
    a = _regime_run(tmp_path, "a", "tiny-code", None, 1, {True: 2, False: 2}, [row])
    b = _regime_run(tmp_path, "b", "tiny-code", None, 1, {True: 2, False: 2}, [row],
                    commit="def5678")
    root = tmp_path / "results"
    root.mkdir()
    assert main_report(["whatif", "--root", str(root), "--from", str(a), str(b)]) == 2
    assert "one commit of a clean tree" in capsys.readouterr().err
    (b / "results.parquet").unlink()
    assert main_report(["whatif", "--root", str(root), "--from", str(b)]) == 2
    assert "results.parquet does not exist" in capsys.readouterr().err
    assert not list(root.rglob("*.md"))


def test_a_one_run_question_refuses_two_folders(tmp_path, capsys):
    root = tmp_path / "results"
    root.mkdir()
    assert main_report(["overlap", "--root", str(root), "--from", str(tmp_path),
                        str(tmp_path)]) == 2
    assert "give --from one folder" in capsys.readouterr().err


def test_a_report_written_by_a_benchmark_is_not_taken_from_a_sweep(tmp_path, capsys):
    root = tmp_path / "results"
    root.mkdir()
    assert main_report(["health", "--root", str(root), "--from", str(tmp_path)]) == 2
    assert "python -m benchmarks.bench_health" in capsys.readouterr().err
