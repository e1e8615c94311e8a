"""Study `fold_seed`: what folding the Frozen-KV seed step into the draft graph buys.

Grid: fold_seed.yaml here. Runner: `mtplab bench --groups fold_seed --dir D` (the sweep, one
process per cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab
report fold_seed --from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py).
"""
from functools import partial

from .. import group, report as _report

QUESTION = "fold_seed"
GROUPS = ('fold_seed',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
