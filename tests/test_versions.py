"""The versions under test are the tested ones: each package with a bounded range in
pyproject.toml is installed inside that range, and docs/install.md's CPU column names its
major.minor version."""
from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")         # Python >= 3.11

ROOT = Path(__file__).resolve().parents[1]


def bounded_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    reqs += [r for extra in project["optional-dependencies"].values() for r in extra]
    out = {}
    for r in map(Requirement, reqs):
        if any(s.operator in ("<", "<=", "==") for s in r.specifier):
            out[r.name] = r
    return out


def cpu_column() -> dict[str, str]:
    """package -> the CPU column's cell of docs/install.md's tested-versions table."""
    table = (ROOT / "docs" / "install.md").read_text().split("## Tested versions")[1]
    rows = [ln.split("|")[1:-1] for ln in table.splitlines() if ln.startswith("| ")]
    return {cells[0].split()[0].strip("`"): cells[2] for cells in rows[1:]}


def test_torch_triton_and_transformers_have_tested_ranges():
    assert {"torch", "triton", "transformers", "sglang"} <= set(bounded_requirements())


@pytest.mark.parametrize("name", sorted(bounded_requirements()))
def test_installed_version_is_inside_the_range_and_in_the_docs(name):
    try:
        have = version(name)
    except PackageNotFoundError:
        pytest.skip(f"{name} is not installed here")
    req = bounded_requirements()[name]
    assert req.specifier.contains(have, prereleases=True), \
        f"{name} {have} is outside pyproject.toml's tested range {req.specifier}"
    major_minor = ".".join(re.split(r"[.+]", have)[:2])
    assert major_minor in cpu_column()[name], \
        f"docs/install.md's CPU column does not name {name} {major_minor}"


def test_every_extra_the_tests_install_has_a_tested_versions_row():
    """The packages the README's test command installs ([dev,distributed]) beyond the test
    tools each have a row naming the version tested."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    names = {Requirement(r).name for r in extras["distributed"]}
    assert names <= set(cpu_column()), names - set(cpu_column())
