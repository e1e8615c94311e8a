"""README stays true: the knobs table lists exactly RunConfig's fields; Quick start has two
fenced commands."""
import re
from dataclasses import fields
from pathlib import Path

from mtplab.config import RunConfig

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_knobs_table_matches_runconfig():
    section = README.split("## Knobs")[1].split("\n## ")[0]
    listed = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            listed |= set(re.findall(r"`([a-z_0-9]+)`", row.split("|")[1]))
    assert listed == {f.name for f in fields(RunConfig)}


def test_quick_start_has_exactly_two_commands():
    section = README.split("## Quick start")[1].split("\n## ")[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    assert "mtplab demo" in blocks[0] and "pytest" in blocks[1]


def test_no_tracked_file_refers_outside_the_repo():
    """A clone stands alone: no tracked file points at the sibling folder of the checkout."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True).stdout
    outside = "../" + "shared"
    bad = [f for f in files.split() if (root / f).is_file() and not f.endswith((".gz", ".safetensors", ".png"))
           and outside in (root / f).read_text(errors="ignore")]
    assert not bad, bad
