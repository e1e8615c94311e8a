"""Study `long_context`: how close a long-context step is to its HBM floor; where speculation pays.

Grid: context.yaml here. Runner: `mtplab bench --groups context --dir D` (the sweep, one process
per cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab report
long_context --from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py). Notebook 07_long_context runs the same grid;
benchmarks/bench_long_context.py and bench_attention.py answer the targets and the attention
kernel alone.
"""
from functools import partial

from .. import group, report as _report

QUESTION = "long_context"
GROUPS = ('context',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
