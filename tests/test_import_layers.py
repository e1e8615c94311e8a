"""Imports run one way (docs/design.md "Layout"). Every `import` / `from ... import` of an
mtplab module, at module level or inside a function, must follow the allowed edges below;
a new sideways or upward edge fails this test with the file and the line. No module below
the top imports the package root (`mtplab/__init__.py`, which names the top's Engine and
RunConfig); and no chain of imports, module- or function-level, leads from a module back to
itself (`test_no_import_cycle`: the module graph is acyclic, graphlib's topological order).

    leaf      errors  stages  atomic  nogc  lossless  progress  lazy_triton  draft_kinds  fmt
              zero_bubble  version  provenance  health  loop_options
              (import nothing of mtplab; draft_kinds names its kinds' modules, imported when
              a draft is built or counted)
              core (only errors: it re-exports ConfigError)   validate (only errors)
              yamlfile (only errors: the one YAML loader)
              spec_schedule (errors, yamlfile: the schedule knob's forms and checks)
              flags (validate: the command line's argparse types)
              device (+ nogc)  <- kernels  <- models, mem  <- graphs  <- speculative
              sched (core, mem, device, instrument, kernels, loop_options)   never speculative
              or models
              instrument (spans, timeline, session, syncs)   analysis (+ validate, zero_bubble,
              loop_options; never torch)
              config (+ validate, draft_kinds, zero_bubble, version, provenance, spec_schedule;
              models and mem inside its resolution)  <- engine, stats  <- cli, sweep, sglang
    studies   may import any of the above; nothing outside mtplab/studies/ imports it (the
              command line names `mtplab report`'s module as a string): the dependency runs
              one way, and the core runs without the studies wing
"""
from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "mtplab"

LEAVES = {"errors", "stages", "atomic", "nogc", "lossless", "progress", "lazy_triton",
          "draft_kinds", "fmt", "zero_bubble", "version", "provenance", "health",
          "loop_options"}
# component -> the components it may import (itself always allowed)
ALLOWED = {
    "errors": set(), "stages": set(), "atomic": set(), "nogc": set(), "progress": set(),
    "lossless": set(),             # output comparison (spec vs target-only), used by sweep
    "lazy_triton": set(),          # triton imported at a kernel's first use
    "draft_kinds": set(),          # the table of draft kinds (torch-free)
    "fmt": set(),                  # numbers as people read them (tables, headers)
    "zero_bubble": set(),          # the zero-bubble sub-knobs and their owners
    "version": set(),              # __version__ (the package root re-exports it)
    "provenance": set(),           # git_commit: the checkout the code runs from (manifests)
    "health": set(),               # health figures from tables (numpy only): run-ahead, the
                                   #   acceptance alarm, the experts' uniform expectation
    "loop_options": set(),         # the scheduler loop's options and its length-read rule
    "core": {"errors"},
    "validate": {"errors"},
    "yamlfile": {"errors"},        # the one YAML loader (safe, bounded, one-sentence errors)
    "spec_schedule": {"errors", "yamlfile"},   # the batch-aware schedule knob (torch-free)
    "flags": {"validate"},
    "device": {"core", "nogc"},
    "kernels": {"core", "device", "lazy_triton"},
    "analysis": {"stages", "atomic", "nogc", "validate", "flags",   # the CLI's flag checks
                 "zero_bubble", "draft_kinds", "loop_options",  # the what-if's knobs, loop
                 "health"},                                 # run-ahead of a trace
    # instrument -> kernels: the bubble meter launches the stamp kernel (kernels/stamp.py)
    "instrument": {"core", "stages", "atomic", "device", "kernels", "nogc", "health"},
    "mem": {"core", "device"},
    "models": {"core", "errors", "kernels", "atomic", "device", "draft_kinds", "nogc",
               "provenance", "health"},           # train.py's manifest; the experts' expectation
    # graphs -> kernels: a capture hands its stamps to carrying kernels (kernels/stamp.py)
    "graphs": {"core", "device", "nogc", "kernels"},
    "speculative": {"core", "device", "kernels", "mem", "models", "graphs", "instrument",
                    "stages", "draft_kinds"},
    # sched -> kernels: the d2h stage's one self-stamped copy kernel (kernels/stamp.py)
    "sched": {"core", "errors", "device", "mem", "instrument", "stages", "kernels",
              "lazy_triton", "loop_options"},
    "config": {"core", "errors", "validate", "device", "models", "mem", "lazy_triton",
               "draft_kinds", "zero_bubble", "version", "provenance", "spec_schedule"},
}
TOP = {"engine", "stats", "cli", "sweep", "sglang", "studies", "__init__", "__main__"}


def component(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def mtplab_imports(path: Path, pkg: Path = PKG, names: bool = False):
    """(line, imported module as parts) for every import of an mtplab module in `path`, a
    file of the package at `pkg`. `from a import x` gives a, or with `names` a.x for each
    name x (a module or not: the caller resolves); `from . import x` and `from mtplab import
    x` always give the names."""
    tree = ast.parse(path.read_text(), str(path))
    pkg_parts = list(path.relative_to(pkg.parent).with_suffix("").parts[:-1])
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[:len(pkg_parts) - (node.level - 1)]
                mod = base + (node.module.split(".") if node.module else [])
            else:
                mod = (node.module or "").split(".")
            if not mod or mod[0] != "mtplab":
                continue
            if names or not node.module or mod == ["mtplab"]:   # from . import x: x itself
                for a in node.names:
                    yield node.lineno, (mod + [a.name])
            else:
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
            if other == me or me in TOP:
                continue
            if other in TOP or other not in ALLOWED.get(me, set()):
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({me} -> {other})")
    assert not bad, "forbidden import edges:\n" + "\n".join(bad)


def studies_importers(pkg: Path = PKG) -> list[str]:
    """file:line of every import of mtplab.studies by a module outside mtplab/studies/."""
    return [f"{p.relative_to(pkg.parent)}:{line}" for p in sorted(pkg.rglob("*.py"))
            if component(p) != "studies"
            for line, mod in mtplab_imports(p, pkg, names=True)
            if len(mod) > 1 and mod[1] == "studies"]


def test_nothing_outside_the_studies_wing_imports_it():
    assert not studies_importers(), studies_importers()


def test_the_studies_check_sees_a_planted_import(tmp_path):
    f = PKG / "sweep" / "_probe_studies.py"
    f.write_text("def f():\n    from ..studies import results\n    return results\n")
    try:
        assert studies_importers() == ["mtplab/sweep/_probe_studies.py:2"]
    finally:
        f.unlink()


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


def module_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """module -> the mtplab modules it imports (module- and function-level), by dotted name.
    `from a import b` is an edge to a.b where that is a module, else to a; an import of a
    name of the package root is an edge to the root. (Importing a submodule also runs its
    packages' `__init__`: those import nothing but the root's lazily named Engine and
    RunConfig, so these implicit edges are left out.)"""
    files = {}
    for p in sorted(pkg.rglob("*.py")):
        parts = list(p.relative_to(pkg.parent).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {}
    for name, p in files.items():
        deps = set()
        for _, mod in mtplab_imports(p, pkg, names=True):
            # longest prefix that is a module (from a import b: a.b when b is a module)
            target = next((t for t in (".".join(mod[:i]) for i in range(len(mod), 0, -1))
                           if t in files), None)
            if target and target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph (a list of modules, the first repeated last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return list(e.args[1])
    return None


def test_no_import_cycle():
    """Each module can be read knowing only what it imports: a cycle (even through a
    function-level import) means two modules share a fact that belongs in a third."""
    cycle = import_cycle(module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_sees_a_planted_cycle(tmp_path):
    """A function-level import back from a module's import closes a cycle; it is caught."""
    pkg = tmp_path / "mtplab"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "models" / "a.py").write_text("from .b import f\n")
    (pkg / "models" / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "models" / "c.py").write_text("from mtplab.models import a\n")
    graph = module_graph(pkg)
    assert graph["mtplab.models.c"] == {"mtplab.models.a"}
    cycle = import_cycle(graph)
    assert cycle is not None and set(cycle) == {"mtplab.models.a", "mtplab.models.b"}
    (pkg / "models" / "b.py").write_text("def f():\n    return 1\n")
    assert import_cycle(module_graph(pkg)) is None


def test_the_package_root_is_imported_from_the_top_only():
    """`from . import __version__` (or any name of mtplab/__init__.py) below the top is an
    upward edge: the root names Engine and RunConfig. The version lives in the leaf
    version.py."""
    f = PKG / "mem" / "_probe_root.py"
    f.write_text("from .. import __version__\nfrom mtplab import Engine\n")
    try:
        mods = [m for _, m in mtplab_imports(f)]
        assert mods == [["mtplab", "__version__"], ["mtplab", "Engine"]]
        assert not {"__version__", "Engine"} & ALLOWED["mem"]
    finally:
        f.unlink()
