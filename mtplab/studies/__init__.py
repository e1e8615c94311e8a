"""The studies wing: one folder per question mtplab answers about speed, each holding the
question's grid, its runner and `render` / `report`, which write its dated report from the
study's own results file (studies/reports.py: the naming rule, the verdicts, the index).

The dependency is one-way: a study imports the engine, the sweep and the analyser; nothing
outside `mtplab/studies/` imports a study (tests/test_import_layers.py), except the command
line's `mtplab report` entry, which names its module as a string. The core runs, and its tests
pass, without this folder.

QUESTIONS names every question the index (docs/results/README.md) has a row for, with what it
asks; STUDIES the questions whose reports a study renders (`mtplab report QUESTION`), each
with the module holding its `render`.
A folder of docs/results/ holding dated reports of a question not listed here still gets its
row (a report written by another generator, following the naming rule).
"""
from __future__ import annotations

from importlib import import_module
from pathlib import Path

QUESTIONS = {
    "regime": "what overlap, zero_bubble, fold_seed and each draft buy, host-bound to "
              "GPU-bound",
    "overlap": "what the overlap loop and zero_bubble (and each sub-knob) buy",
    "fold_seed": "what folding the Frozen-KV seed step into the draft graph buys",
    "page_topk": "how KV page size and tree width (topk) trade off",
    "drafts": "what each draft (Frozen-KV MTP, EAGLE) buys over target-only",
    "host_path": "where a decode step's host time goes",
    "decode_floor": "how close a decode step is to its HBM floor (fused kernels, CUDA graphs)",
    "long_context": "how close a long-context step is to its HBM floor; where speculation pays",
    "long_context_spec": "from which batch size speculation stops paying at 8k and 32k",
    "moe": "what speculation buys on a MoE target",
    "moe_floor": "how close an MoE decode step is to its HBM floor, split vs grouped MoE "
                 "kernels",
    "spec_schedule": "which draft setting pays at which batch size",
    "meter_trust": "whether the bubble meter can be trusted, and what it costs",
    "whatif": "whether the what-if predictor gets the measured ratios right",
    "analyser": "how fast the trace analyser is, and whether its causes hold on any trace",
    "peers": "mtplab beside SGLang and transformers on the same workload",
    "deterministic": "what batch invariance costs; how often bf16 diverges",
    "health": "whether the engine's figures are sound on a device",
}
STUDIES = {q: f"mtplab.studies.{q}" for q in (
    "regime", "drafts", "overlap", "fold_seed", "page_topk", "decode_floor", "long_context",
    "host_path", "moe", "whatif", "health", "meter_trust", "deterministic", "analyser",
    "peers", "spec_schedule")} | {"moe_floor": "mtplab.studies.moe.moe_floor",
                                "long_context_spec": "mtplab.studies.long_context.spec_batch"}


def study(question: str):
    """The study module of a question (render, TITLE, ...)."""
    from ..errors import ConfigError
    if question not in STUDIES:
        raise ConfigError(f"no study renders {question!r}: use one of {sorted(STUDIES)}.")
    return import_module(STUDIES[question])


def report(question: str, sweep_dir, *, command: str, date: str, device=None, root=None,
           note: str = ""):
    """Write the dated report of `question` from a run's folder (its results.parquet; a list
    of one folder, as `mtplab report --from` gives it, is that folder): the results file and
    the Markdown beside it, under `root` (default docs/results). Returns the report's path."""
    import pandas as pd

    from ..errors import ConfigError
    from ..sweep.results import RESULTS_PARQUET
    from . import reports
    if not isinstance(sweep_dir, (str, Path)):
        if len(sweep_dir) != 1:
            raise ConfigError(f"a {question} report is written from one run's folder: give "
                              "--from one folder.")
        sweep_dir = sweep_dir[0]
    table = Path(sweep_dir) / RESULTS_PARQUET
    if not table.is_file():
        raise ConfigError(f"{table} does not exist: a report is written from a run's folder.")
    mod = study(question)
    doc = mod.results_doc(pd.read_parquet(table), sweep_dir=str(sweep_dir), command=command,
                          date=date, device=device, note=note)
    return reports.write(doc, mod.render, root)
