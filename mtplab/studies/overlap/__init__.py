"""Study `overlap`: what the overlap loop and zero_bubble (and each sub-knob) buy.

Grid: overlap.yaml here. Runner: `mtplab bench --groups overlap --dir D` (the sweep, one process
per cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab report
overlap --from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py).
"""
from functools import partial

from .. import group, report as _report

QUESTION = "overlap"
GROUPS = ('overlap',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
