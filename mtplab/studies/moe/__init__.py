"""Study `moe`: what speculation buys on a MoE target.

Grid: moe.yaml here. Runner: `mtplab bench --groups moe --dir D` (the sweep, one process per
cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab report moe
--from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py). benchmarks/bench_moe.py measures the experts touched per step and the floor
of those experts. Question `moe_floor` (moe_floor.py here): the MoE decode step against its floor,
split vs grouped MoE kernels (benchmarks/bench_moe_floor.py writes its reports).
"""
from functools import partial

from .. import group, report as _report

QUESTION = "moe"
GROUPS = ('moe',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
