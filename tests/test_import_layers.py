"""Imports run one way (docs/design.md "Layout"). Every `import` / `from ... import` of an
mtplab module, at module level or inside a function, must follow the allowed edges below;
a new sideways or upward edge fails this test with the file and the line.

    leaf      errors  stages  atomic  nogc  lossless  progress  lazy_triton  draft_kinds  fmt
              zero_bubble
              (import nothing of mtplab; draft_kinds names its kinds' modules, imported when
              a draft is built or counted)
              core (only errors: it re-exports ConfigError)   validate (only errors)
              flags (validate: the command line's argparse types)
              device  <- kernels  <- models, mem  <- graphs  <- speculative
              sched (core, mem, device, instrument, kernels)   never speculative or models
              instrument (spans, timeline, session, syncs)   analysis (+ validate, never torch)
              config (+ validate, draft_kinds, zero_bubble)  <- engine, stats  <- cli, bench,
              sweep, sglang
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mtplab"

LEAVES = {"errors", "stages", "atomic", "nogc", "lossless", "progress", "lazy_triton",
          "draft_kinds", "fmt", "zero_bubble"}
# component -> the components it may import (itself always allowed)
ALLOWED = {
    "errors": set(), "stages": set(), "atomic": set(), "nogc": set(), "progress": set(),
    "lossless": set(),             # output comparison (spec vs target-only), used by sweep
    "lazy_triton": set(),          # triton imported at a kernel's first use
    "draft_kinds": set(),          # the table of draft kinds (torch-free)
    "fmt": set(),                  # numbers as people read them (tables, headers)
    "zero_bubble": set(),          # the zero-bubble sub-knobs and their owners
    "core": {"errors"},
    "validate": {"errors"},
    "flags": {"validate"},
    "device": {"core"},
    "kernels": {"core", "device", "lazy_triton"},
    "analysis": {"stages", "atomic", "nogc", "validate", "flags",   # the CLI's flag checks
                 "zero_bubble"},                                     # the what-if's knobs
    # instrument -> kernels: the bubble meter launches the stamp kernel (kernels/stamp.py)
    "instrument": {"core", "stages", "atomic", "device", "kernels", "nogc"},
    "mem": {"core", "device"},
    "models": {"core", "errors", "kernels", "atomic", "device", "draft_kinds", "nogc"},
    # graphs -> kernels: a capture hands its stamps to carrying kernels (kernels/stamp.py)
    "graphs": {"core", "device", "nogc", "kernels"},
    "speculative": {"core", "device", "kernels", "mem", "models", "graphs", "instrument",
                    "stages", "draft_kinds"},
    # sched -> kernels: the d2h stage's one self-stamped copy kernel (kernels/stamp.py)
    "sched": {"core", "errors", "device", "mem", "instrument", "stages", "kernels",
              "lazy_triton"},
    "config": {"core", "errors", "validate", "device", "models", "mem", "lazy_triton",
               "draft_kinds", "zero_bubble"},
}
TOP = {"engine", "stats", "cli", "bench", "sweep", "sglang", "__init__", "__main__"}


def component(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def mtplab_imports(path: Path):
    """(line, imported component) for every import of an mtplab module in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    pkg_parts = list(path.relative_to(PKG.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[:len(pkg_parts) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
                if not node.module:       # from . import x
                    for a in node.names:
                        yield node.lineno, (mod + [a.name])
                    continue
            else:
                mod = (node.module or "").split(".")
            if mod and mod[0] == "mtplab":
                yield node.lineno, mod
        elif isinstance(node, ast.Import):
            for a in node.names:
                mod = a.name.split(".")
                if mod[0] == "mtplab":
                    yield node.lineno, mod


def test_imports_follow_the_layer_edges():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        me = component(path)
        for line, mod in mtplab_imports(path):
            if len(mod) < 2:
                continue
            other = mod[1]
            if other == me or me in TOP or other == "__version__":
                continue
            if other in TOP or other not in ALLOWED.get(me, set()):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({me} -> {other})")
    assert not bad, "forbidden import edges:\n" + "\n".join(bad)


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_leaves_import_nothing_of_mtplab(leaf):
    assert [m for _, m in mtplab_imports(PKG / f"{leaf}.py")] == []


def test_analysis_never_imports_torch():
    for path in (PKG / "analysis").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] == "torch"], path


def test_the_checker_sees_a_forbidden_edge(tmp_path):
    """The walker resolves relative imports: a sideways edge in sched is caught."""
    f = PKG / "sched" / "_probe_forbidden.py"
    f.write_text("from ..speculative.worker import SpecWorker\n")
    try:
        mods = [m for _, m in mtplab_imports(f)]
        assert mods == [["mtplab", "speculative", "worker"]]
        assert "speculative" not in ALLOWED["sched"]
    finally:
        f.unlink()


def test_sglang_adapter_never_imports_the_engine():
    """mtplab.sglang drives an external server: config, core, errors, atomic and the analyser,
    plus the model presets' shapes (`mtplab sglang models`; RunConfig already resolves them)."""
    allowed = {"config", "core", "errors", "atomic", "analysis", "sglang", "models", "validate",
               "draft_kinds", "flags", "zero_bubble"}
    bad = [f"{p.relative_to(PKG.parent)}:{line} -> {mod[1]}"
           for p in sorted((PKG / "sglang").rglob("*.py"))
           for line, mod in mtplab_imports(p) if len(mod) > 1 and mod[1] not in allowed]
    assert not bad, bad
