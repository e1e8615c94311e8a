"""One reader of the commit the code runs from: mtplab/provenance.py git_commit (its rule, the
checkout holding the package or else MTP_GIT_COMMIT, is tested in tests/test_config.py)."""
from __future__ import annotations

from pathlib import Path

from mtplab import provenance
from mtplab.models import train

ROOT = Path(__file__).resolve().parents[1]


def test_every_manifest_takes_the_one_git_commit():
    """No other file of the package, the benchmarks or the scripts asks git for HEAD itself
    (models/train.py had a copy that reported an enclosing repository's HEAD for a copied
    tree); the tiny-code manifest takes provenance's."""
    files = [p for d in ("mtplab", "benchmarks", "scripts") for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".py", ".sh") and p != ROOT / "mtplab" / "provenance.py"]
    assert [str(p.relative_to(ROOT)) for p in files if "rev-parse" in p.read_text()] == []
    assert train.git_commit is provenance.git_commit
