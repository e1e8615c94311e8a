"""A file name names one module: no two modules of the package share a file name (a folder's
entry points `__init__.py`, `cli.py` and `runner.py` excepted), a module named after a stage
is that stage's file in docs/design.md's "Stage → file map", and every file that map names
exists."""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

from mtplab.stages import STAGES

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mtplab"
ENTRY_POINTS = {"__init__.py", "cli.py", "runner.py"}


def test_no_two_modules_share_a_file_name():
    by_name = defaultdict(list)
    for path in sorted(PKG.rglob("*.py")):
        if path.name not in ENTRY_POINTS:
            by_name[path.name].append(str(path.relative_to(PKG)))
    assert {n: p for n, p in by_name.items() if len(p) > 1} == {}


def stage_map() -> dict[str, str]:
    """stage -> its row's file column, from the design doc's stage table."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text[text.index("### Stage → file map"):]
    rows = {}
    for line in table.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3:
            for stage in re.findall(r"`([\w.]+)`", cells[0]):
                rows[stage] = cells[1]
    return rows


def test_a_module_named_after_a_stage_is_that_stages_file():
    rows = stage_map()
    assert set(STAGES) <= set(rows), set(STAGES) - set(rows)
    wrong = [str(p.relative_to(PKG)) for p in sorted(PKG.rglob("*.py"))
             if p.stem in STAGES and f"`{p.relative_to(PKG)}`" not in rows[p.stem]]
    assert wrong == []


def test_every_file_the_stage_map_names_exists():
    named = {f for files in stage_map().values() for f in re.findall(r"`([\w/]+\.py)`", files)}
    assert named and sorted(f for f in named if not (PKG / f).is_file()) == []

