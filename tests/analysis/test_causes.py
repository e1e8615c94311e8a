"""The bubble causes are defined once (mtplab/analysis/causes.py): every table, figure, help
text and notebook takes names, order and colours from that table."""
from __future__ import annotations

import re
from pathlib import Path

from mtplab.analysis import bubbles, plots
from mtplab.analysis.causes import CAUSE_COLORS, CAUSE_TABLE, CAUSES, cause_group

ROOT = Path(__file__).resolve().parents[2]
# a written-out list of the causes: sync, host_prep, launch, [host,] other in one line
LISTED = re.compile(r"sync\w*\W+\w*host_prep\w*\W+\w*launch\w*\W+(\w*host\w*\W+)?\w*other")


def test_no_copy_of_the_cause_list_outside_the_table():
    files = [p for d in ("mtplab", "benchmarks", "scripts", "notebooks") for p in
             sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".sh", ".ipynb")]
    copies = [f"{p.relative_to(ROOT)}:{i}" for p in files if p.name != "causes.py"
              for i, line in enumerate(p.read_text().splitlines(), 1) if LISTED.search(line)]
    assert copies == []


def test_tables_and_figures_derive_from_the_table():
    assert CAUSES == tuple(c.name for c in CAUSE_TABLE) and len(set(CAUSES)) == len(CAUSES)
    cols = [c for c in bubbles.STEP_COLUMNS if re.fullmatch(r"bubble_\w+_us", c)]
    assert cols == [f"bubble_{c}_us" for c in CAUSES]
    assert plots.CAUSE_COLORS is CAUSE_COLORS and set(CAUSE_COLORS) == set(CAUSES)
    assert cause_group("host:untraced") == "host" and cause_group("other") == "other"


def test_analyze_help_names_every_cause(capsys):
    from mtplab.analysis.cli import main_analyze
    assert main_analyze(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert all(f"{c.name} ({c.help})" in text for c in CAUSE_TABLE)


def test_bench_table_splits_by_every_cause():
    from mtplab.studies import bench
    src = Path(bench.__file__).read_text()
    assert "'/'.join(CAUSES)" in src and "for c in CAUSES" in src


def test_cause_split_is_what_mtplab_analyze_prints(capsys):
    """Notebook 05's answer and `mtplab analyze` group causes through one function: on the
    shipped H100 example the split (and so the main cause, sync) is the printed causes line."""
    from mtplab.analysis.bubbles import analyze_run
    from mtplab.analysis.causes import cause_split, main_cause
    from mtplab.analysis.cli import main_analyze
    from mtplab.analysis.example import EXAMPLE_TRACE
    assert main_analyze(["--example"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("causes"))
    printed = {c: float(v) for c, v in re.findall(r"(\w+) ([\d.]+) ms", line)}
    split = cause_split(analyze_run(EXAMPLE_TRACE).summary)
    assert list(printed) == list(split) == list(CAUSES)
    assert printed == {c: round(us / 1e3, 3) for c, us in split.items()}
    assert main_cause(analyze_run(EXAMPLE_TRACE).summary) == "sync"
