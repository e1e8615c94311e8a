"""Study `drafts`: what each draft (Frozen-KV MTP, EAGLE) buys over target-only.

Grid: drafts.yaml, shape.yaml here. Runner: `mtplab bench --groups drafts --dir D` / `mtplab
bench --groups shape --dir D` (the sweep, one process per cell, arms interleaved over repeats).
Report: `report(D/<group>, ...)` or `mtplab report drafts --from D/<group>`: each arm against
the group's first arm at every grid point (studies/group.py). On CPU, without timing:
acceptance.py (`python -m benchmarks.bench_acceptance`) gives the trained tiny-code drafts'
accept length in and out of their training distribution, head_vocab.py (`python -m
benchmarks.bench_draft_vocab`) what a reduced draft head (hot or centroid vocabulary) costs in
accept length and how many emitted tokens escape the hot set.
"""
from functools import partial

from .. import group, report as _report

QUESTION = "drafts"
GROUPS = ('drafts', 'shape')
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
