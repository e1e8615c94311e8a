"""Study `page_topk`: how KV page size and tree width (topk) trade off.

Grid: page_topk.yaml here. Runner: `mtplab bench --groups page_topk --dir D` (the sweep, one
process per cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab
report page_topk --from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py).
"""
from functools import partial

from .. import group, report as _report

QUESTION = "page_topk"
GROUPS = ('page_topk',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
