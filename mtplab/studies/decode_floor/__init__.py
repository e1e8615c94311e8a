"""Study `decode_floor`: how close a decode step is to its HBM floor (fused kernels, CUDA graphs).

Grid: graphs.yaml here. Runner: `mtplab bench --groups graphs --dir D` (the sweep, one process
per cell, arms interleaved over repeats). Report: `report(D/<group>, ...)` or `mtplab report
decode_floor --from D/<group>`: each arm against the group's first arm at every grid point
(studies/group.py). benchmarks/bench_kernels.py (kernel_figures.py here) measures the floor
ratios, kernels per layer and fusion; the dense floor from 64 tokens to 32k, with where each
microsecond goes, is question `long_context`'s dense-floor report.
nonfinite.py (`python -m benchmarks.bench_nonfinite`) sets the non-finite check's own time
beside the decode step it runs in.
"""
from functools import partial

from .. import group, report as _report

QUESTION = "decode_floor"
GROUPS = ('graphs',)
render = group.render
results_doc = partial(group.results_doc, QUESTION)
report = partial(_report, QUESTION)
