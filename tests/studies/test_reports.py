"""Dated reports (mtplab/studies/reports.py): every report regenerates byte for byte from the
results beside it, the index and the README's headline are what the newest reports give, every
figure they quote is in the newest report of its question, and each report names a commit
this checkout holds."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from mtplab.errors import ConfigError
from mtplab.studies import QUESTIONS, regime
from mtplab.studies import reports as R
from mtplab.studies.cli import main_report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
FIGURE = re.compile(r"\d+\.\d+x|±\d+\.\d+%|\bx \d+\.\d+")


def test_every_report_and_the_index_and_headline_regenerate_byte_for_byte(capsys):
    assert main_report(["all", "--check"]) == 0, capsys.readouterr().out


def test_a_result_changed_by_hand_is_caught(tmp_path, capsys):
    """A ratio edited in a results file: --check names the report (exit 1) and writes
    nothing; without --check the report is written again from it."""
    root = tmp_path / "results"
    shutil.copytree(RESULTS, root)
    readme = tmp_path / "README.md"
    shutil.copy(README, readme)
    jp = R.newest("regime", root).with_suffix(".json")
    doc = json.loads(jp.read_text())
    doc["rows"][0]["ratio"] = 9.876
    jp.write_text(R.dump(doc))
    args = ["regime", "--root", str(root), "--readme", str(readme)]
    assert main_report([*args, "--check"]) == 1
    assert jp.with_suffix(".md").name in capsys.readouterr().out
    assert "9.876" not in jp.with_suffix(".md").read_text()
    assert main_report(args) == 0
    assert "9.876" in jp.with_suffix(".md").read_text()
    assert main_report([*args, "--check"]) == 0


def test_each_folder_holds_reports_with_their_results_and_at_most_a_legacy_file():
    for d in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        for f in sorted(d.iterdir()):
            if f.name == R.LEGACY:
                continue
            assert R.NAME.match(f.stem) and f.suffix in (".md", ".json"), f
            assert f.with_suffix(".json").is_file() and f.with_suffix(".md").is_file(), f
            doc = R.load(f)
            assert doc["question"] == d.name, f


def test_legacy_files_say_they_are_historical_and_are_not_indexed():
    index = (RESULTS / R.INDEX).read_text()
    assert R.LEGACY not in index.split("\n| question")[1]
    for f in RESULTS.glob(f"*/{R.LEGACY}"):
        assert "historical" in f.read_text().split("\n\n")[1].lower(), f


def _commits_known() -> bool:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _commits_known(), reason="not a git checkout")
def test_each_report_names_a_commit_this_checkout_holds():
    for md in RESULTS.glob("*/*.md"):
        if md.name == R.LEGACY:
            continue
        commit = R.Stamp.of(md).commit
        r = subprocess.run(["git", "merge-base", "--is-ancestor", commit, "HEAD"], cwd=ROOT,
                           capture_output=True)
        assert r.returncode == 0, f"{md}: commit {commit} is not an ancestor of HEAD"


def test_the_readme_headline_is_the_newest_regime_reports_table():
    newest = R.newest("regime")
    body = R.block(README.read_text())
    assert body, "README has no headline block"
    link = newest.relative_to(ROOT).as_posix()
    assert body == regime.readme_block(R.load(newest), link).rstrip()
    assert regime.headline_table(R.load(newest)) in newest.read_text()


def test_the_headline_is_short_and_holds_no_history():
    text = README.read_text()
    section = text.split("## Headline\n")[1].split("\n## ")[0].strip("\n")
    assert len(section.splitlines()) <= 25
    assert len(re.findall(r"`[0-9a-f]{7,40}`", section)) == 1       # the one commit measured


def test_the_glossary_defines_every_term_the_headline_uses():
    glossary = README.read_text().split("## Glossary")[1].split("\n## ")[0]
    terms = {row.split("|")[1].strip() for row in glossary.splitlines() if row.startswith("| ")}
    assert {"rung", "arm", "x", "meter", "noise", "verdict"} <= terms


def _figures_and_link(text: str) -> tuple[set[str], str]:
    links = re.findall(r"\]\(([^)]+\.md)\)", text)
    return set(FIGURE.findall(text)), links[0] if links else ""


def test_every_figure_the_readme_quotes_is_in_the_newest_regime_report():
    figures, link = _figures_and_link(R.block(README.read_text()))
    report = (ROOT / link).resolve()
    assert report == R.newest("regime").resolve()
    assert figures
    text = report.read_text()
    missing = sorted(f for f in figures if f not in text)
    assert not missing, f"README quotes {missing}, not in {report.name}"


def test_every_figure_the_index_quotes_is_in_the_newest_report_of_its_question():
    rows = [r for r in (RESULTS / R.INDEX).read_text().splitlines()
            if r.startswith("| `")]
    assert {r.split("`")[1] for r in rows} >= set(QUESTIONS)
    for row in rows:
        q = row.split("`")[1]
        figures, link = _figures_and_link(row)
        newest = R.newest(q)
        if newest is None:
            assert not link and not figures, row
            continue
        assert (RESULTS / link).resolve() == newest.resolve(), row
        text = newest.read_text()
        assert not sorted(f for f in figures if f not in text), row


def test_verdicts_are_the_sweeps_rule_in_the_reports_words():
    """results.verdict agrees with studies/effects.py arm_effects on the same rows."""
    from mtplab.studies.effects import NO_VERDICT, arm_effects
    words = {"faster": R.PAYS, "slower": R.COSTS, "nothing": R.NOISE, NO_VERDICT: R.ONE_REPEAT}
    recs = []
    for point, (a, b) in enumerate([(1.0, 1.5), (1.0, 1.01), (1.0, 0.7), (1.0, 1.5)]):
        reps = 1 if point == 3 else 2
        for rep in range(reps):
            wob = 1 + 0.01 * rep
            recs += [{"p": point, "arm": "base", "decode_tok_per_s": 100 * a * wob},
                     {"p": point, "arm": "new", "decode_tok_per_s": 100 * b * wob}]
    eff = arm_effects(pd.DataFrame(recs), "arm", [("new", "base")], by=["p"])
    assert len(eff) == 4
    for r in eff.to_dict("records"):
        assert R.verdict(r["ratio"], r["noise"], r["n"], r["n_base"]) == words[r["verdict"]]


def test_a_stamp_names_date_device_and_commit():
    s = R.Stamp.of(Path("x/2026-11-28_h200_11ac223.md"))
    assert (s.date, s.device, s.commit) == ("2026-11-28", "h200", "11ac223")
    with pytest.raises(ConfigError, match="YYYY-MM-DD"):
        R.Stamp("28.11.2026", "h200", "11ac223")
    assert R.device_slug("NVIDIA H200") == "h200"
    assert R.device_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert R.device_slug("") == "cpu"


def _sweep(tmp_path: Path, commit: str = "abc1234") -> Path:
    """A regime sweep's results: two rungs, target-only and Frozen-KV arms (zb), two
    repeats; speculation buys 2.0x at the host-bound rung and costs (0.5x) at the other."""
    recs = []
    for layers, gpu, host, spec in ((4, 100.0, 400.0, 2.0), (16, 4000.0, 500.0, 0.5)):
        for rep, wob in ((0, 1.0), (1, 1.01)):
            base = {"status": "ok", "cfg.model": "llama3-8b-like", "cfg.layers": layers,
                    "batch_size": 8, "prompt_len_tokens": 512, "repeat": rep,
                    "cfg.device": "cuda", "meter_wall_us_per_step": gpu + 50.0,
                    "bubble_us_per_step": 50.0, "bubble_frac": 0.1,
                    "host_busy_p50_us_per_step": host, "git_commit": commit,
                    "device_name": "NVIDIA H200", "cell_id": f"c{layers}{rep}"}
            for draft, ratio in (("none", 1.0), ("frozen_kv_mtp", spec)):
                recs.append({**base, "cfg.draft": draft, "cfg.overlap": True,
                             "cfg.zb_async_d2h": True, "cfg.zb_device_seq_lens": True,
                             "cfg.zb_draft_preexec": draft != "none",
                             "cfg.fold_seed": draft != "none", "host_delay_us": 0.0,
                             "meter_tok_per_s": 1000.0 * ratio * wob,
                             "cell_id": f"c{layers}{rep}{draft}"})
    df = pd.DataFrame(recs)
    d = tmp_path / "sweep"
    d.mkdir()
    df.to_parquet(d / "results.parquet")
    return d


def test_a_new_report_from_a_sweep_then_regenerates(tmp_path, capsys):
    sweep = _sweep(tmp_path)
    root, readme = tmp_path / "results", tmp_path / "README.md"
    root.mkdir()
    readme.write_text(f"# x\n\n## Headline\n\n{R.HEADLINE_BEGIN}\n{R.HEADLINE_END}\n\n## Next\n")
    args = ["regime", "--root", str(root), "--readme", str(readme)]
    assert main_report([*args, "--from", str(sweep), "--date", "2026-12-01",
                        "--command", "mtplab bench --groups regime --quick"]) == 0
    md = root / "regime" / "2026-12-01_h200_abc1234.md"
    text = md.read_text()
    assert "- command: `mtplab bench --groups regime --quick`" in text
    assert "2.000x ±2.0%, pays" in text and "0.500x ±2.0%, costs" in text
    assert "2.000x ±2.0%, pays" in R.block(readme.read_text())
    assert "## Next" in readme.read_text()
    assert "[2026-12-01_h200_abc1234.md](regime/2026-12-01_h200_abc1234.md)" in \
        (root / R.INDEX).read_text()
    assert main_report([*args, "--check"]) == 0


def test_a_sweep_from_a_dirty_tree_is_refused(tmp_path, capsys):
    sweep = _sweep(tmp_path, commit="abc1234-dirty")
    root = tmp_path / "results"
    root.mkdir()
    assert main_report(["regime", "--root", str(root), "--from", str(sweep)]) == 2
    assert "one commit of a clean tree" in capsys.readouterr().err
    assert not list(root.rglob("*.md"))


def _group_run(tmp_path: Path) -> Path:
    """A bench group's folder as `mtplab bench --dir D` leaves it: grid.yaml and
    results.parquet; overlap on buys 1.5x at bs 1 and nothing at bs 8 (two repeats)."""
    import yaml

    from mtplab.sweep import grid_from_dict
    doc = {"base": {"model": "random-tiny"}, "grid": {"repeat": [0, 1], "batch_size": [1, 8]},
           "arms": [{"overlap": False}, {"overlap": True}]}
    d = tmp_path / "bench" / "overlap"
    d.mkdir(parents=True)
    (d / "grid.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    recs = []
    for s in grid_from_dict(doc).points():
        gain = 1.5 if s["overlap"] and s["batch_size"] == 1 else 1.0
        recs.append({"cell_id": str(len(recs)), "status": "ok", "error": "",
                     "settings_json": json.dumps(s, sort_keys=True, default=str),
                     "repeat": s["repeat"], "batch_size": s["batch_size"],
                     "decode_tok_per_s": 100.0 * gain * (1 + 0.01 * s["repeat"]),
                     "bubble_frac": 0.2, "git_commit": "abc1234", "device_name": "NVIDIA H100"})
    pd.DataFrame(recs).to_parquet(d / "results.parquet")
    return d


def test_a_bench_group_report_from_its_folder(tmp_path, capsys):
    run = _group_run(tmp_path)
    root = tmp_path / "results"
    root.mkdir()
    assert main_report(["overlap", "--root", str(root), "--from", str(run),
                        "--date", "2026-12-02"]) == 0
    md = root / "overlap" / "2026-12-02_h100_abc1234.md"
    text = md.read_text()
    assert "- command: `mtplab bench --groups overlap`" in text
    assert "| bs 1 | overlap=True | 1.500x ±2.0%, pays |" in text
    assert "| bs 8 | overlap=True | 1.000x ±2.0%, within the noise |" in text
    assert R.answer_line(md).startswith("overlap=True vs overlap=False: 1.000x ±2.0%")
    assert main_report(["overlap", "--root", str(root), "--check"]) == 0
