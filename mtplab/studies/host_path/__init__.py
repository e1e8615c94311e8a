"""Study `host_path`: where a decode step's host time goes.

Grid: host.yaml here. Runner: `mtplab bench --groups host --dir D` (the sweep, one process per
cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab report
host_path --from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py). host_bench.py (`python -m benchmarks.bench_host`) runs every loop mode and
graph granularity interleaved in one process (the host-stage table: `mtplab bench --groups
host`); ab.py (`python -m benchmarks.bench_ab [--group host]`) sets the working tree's decode
tok/s or host µs beside an older commit's, each tree's sweeps alternating.
"""
from functools import partial

from .. import group, report as _report

QUESTION = "host_path"
GROUPS = ('host',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
