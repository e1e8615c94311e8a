"""Every notebook checks its parameters in the cell right after the parameters cell
(mtplab/studies/notebook_params.py): the defaults pass, and a wrong type, a value out of range or an
unknown model is one ConfigError naming the parameter, before anything runs. The cells are
executed here as papermill would: the parameters, the injected values, the check."""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

from mtplab.errors import ConfigError
from mtplab.studies.notebook_params import PARAMS, check_param

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _cells(path: Path) -> tuple[str, str]:
    """(the parameters cell, the cell right after it)."""
    nb = nbformat.read(path, as_version=4)
    i = next(k for k, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", []))
    return nb.cells[i].source, nb.cells[i + 1].source


def _run(path: Path, injected: dict) -> None:
    params, check = _cells(path)
    ns: dict = {}
    exec(params, ns)
    ns.update(injected)                  # papermill's injected-parameters cell
    exec(check, ns)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_parameter_is_checked_right_after_the_parameters(path):
    params, check = _cells(path)
    assert "check_params(globals())" in check
    names = {n.targets[0].id for n in ast.parse(params).body if isinstance(n, ast.Assign)}
    assert names - set(PARAMS) == set()          # no parameter without its row
    _run(path, {})                               # the defaults pass


BAD = [   # (notebook, parameter, value, the sentence's words)
    ("04", "batch_size", -1, "batch_size must be at least 1, got -1"),
    ("04", "repeats", "3", "repeats is an integer but got the string '3'"),
    ("04", "device", "tpu", "device='tpu' is not a device"),
    ("06", "model", "bogus", "model: unknown model 'bogus'"),
    ("07", "cpu_contexts", "32", "cpu_contexts must be a list such as [1, 4], got '32'"),
    ("07", "cpu_contexts", [32, "160"], "cpu_contexts[1] is an integer but got the string"),
    ("07", "cpu_model", "bogus", "cpu_model: unknown model 'bogus'"),
    ("07", "batch_sizes", [], "batch_sizes is empty"),
    ("08", "cpu_rungs", [["random-tiny", 0]], "cpu_rungs[0] batch size must be at least 1"),
    ("08", "cpu_rungs", [["bogus", 1]], "cpu_rungs[0] model: unknown model 'bogus'"),
    ("08", "cpu_rungs", ["random-tiny", 1], "cpu_rungs[0]='random-tiny' is not a (model, batch"),
    ("08", "ladder", "fast", "ladder='fast' is not one of ['quick', 'full']"),
    ("08", "budget_s", -5, "budget_s must be a positive finite number"),
    ("03", "drafts", ["eagle", "medusa"], "drafts[1]='medusa' is not one of"),
    ("02", "cuda_graphs", [1], "cuda_graphs[0] must be True or False"),
    ("01", "simulate_accept_len", 0.5, "simulate_accept_len must be at least 1"),
    ("05", "min_gap_us", -1.0, "min_gap_us must be at least 0"),
    ("00", "out_dir", " ", "out_dir is empty"),
]


@pytest.mark.parametrize("nb,name,value,message", BAD,
                         ids=[f"{n}-{p}-{v!r}"[:40] for n, p, v, _ in BAD])
def test_a_bad_parameter_is_refused_naming_it(nb, name, value, message):
    path = next(p for p in NOTEBOOKS if p.stem.startswith(nb))
    with pytest.raises(ConfigError) as e:
        _run(path, {name: value})
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_check_param_normalises():
    assert check_param("cell_timeout_s", 600) == 600.0 and check_param("layers", None) is None
