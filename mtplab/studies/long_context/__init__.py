"""Study `long_context`: how close a long-context step is to its HBM floor; where speculation pays.

Two kinds of dated report share the question's folder, told apart by the results file's
`kind`:
- the dense-floor report (kind "dense_floor", studies/long_context/floor_report.py): written
  by `python -m benchmarks.bench_long_context --out-dir DIR` (floor_runner.py here): floor /
  step from 64-token prompts to 32k, spec step / target step at 8k and 32k, and for a missed
  target where each microsecond of the step goes;
- a sweep group's report (studies/group.py): grid context.yaml here, run by `mtplab bench
  --groups context --dir D` (one process per cell, arms interleaved over repeats), written by
  `report(D/<group>, ...)` or `mtplab report long_context --from D/<group>`: each arm against
  the group's first arm at every grid point.
`render` renders either from its results. Notebook 07_long_context runs the same grid;
benchmarks/bench_attention.py (attention_figures.py here) times the attention kernel alone,
and benchmarks/bench_spec_batch.py writes question `long_context_spec` (spec_batch.py here).
"""
from functools import partial

from .. import group, report as _report
from . import floor_report

QUESTION = "long_context"
GROUPS = ('context',)
WRITER = floor_report.WRITER
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)


def render(doc: dict) -> str:
    """The report of a results file: the dense-floor report or a sweep group's."""
    if doc.get("kind") == floor_report.KIND:
        return floor_report.render(doc)
    return group.render(doc)
