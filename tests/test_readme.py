"""README stays true: the knobs table lists exactly RunConfig's fields; Quick start has two
fenced commands."""
import re
from dataclasses import fields
from pathlib import Path

from mtplab.config import RunConfig

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_knobs_table_matches_runconfig():
    section = README.split("## Knobs")[1].split("\n## ")[0]
    listed = set()
    for row in section.splitlines():
        if row.startswith("| `"):
            listed |= set(re.findall(r"`([a-z_0-9]+)`", row.split("|")[1]))
    assert listed == {f.name for f in fields(RunConfig)}


def test_quick_start_has_exactly_two_commands():
    blocks = _quick_start_blocks()
    assert len(blocks) == 2
    assert "mtplab demo" in blocks[0] and "pytest" in blocks[1]


def test_no_tracked_file_refers_outside_the_repo():
    """A clone stands alone: no tracked file points at the sibling folder of the checkout."""
    import subprocess
    root = Path(__file__).resolve().parent.parent
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True).stdout
    outside = "../" + "shared"
    bad = [f for f in files.split() if (root / f).is_file()
           and not f.endswith((".gz", ".safetensors", ".png"))
           and outside in (root / f).read_text(errors="ignore")]
    assert not bad, bad


def _quick_start_blocks() -> list[str]:
    section = README.split("## Quick start")[1].split("\n## ")[0]
    return re.findall(r"```bash\n(.*?)```", section, re.S)


def _torch_range() -> str:
    import tomllib
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if d.startswith("torch")).removeprefix("torch")



def test_cpu_torch_line_carries_the_tested_range():
    line = next(ln for ln in _quick_start_blocks()[0].splitlines() if "whl/cpu" in ln)
    assert f'"torch{_torch_range()}"' in line


def test_environment_yml_installs_what_the_test_command_installs():
    """conda users get the README's test extras and torch's CPU build inside the tested range."""
    import yaml
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    extras = re.search(r'pip install -e "\.\[([a-z,]+)\]"', _quick_start_blocks()[1]).group(1)
    assert f"-e .[{extras}]" in pip
    assert f"torch{_torch_range()}" in pip
    assert any("download.pytorch.org/whl/cpu" in p for p in pip)


def test_ci_runs_the_readme_test_command_before_sglang_is_installed():
    """CI fails the way a new user would: the README's command first, on a venv without the
    SGLang reference; the differential tests after installing it."""
    ci = (ROOT / ".ci" / "run").read_text()
    command = _quick_start_blocks()[1].strip()
    assert command in ci
    assert ci.index(command) < ci.index("-r requirements/sglang-ref.txt")
