"""Study `moe`: what speculation buys on a MoE target.

Grids here: moe.yaml (the `moe` bench group: one drafting arm against target-only on the MoE
and the dense target) and moe_spec.yaml (the MoE speculation study: Frozen-KV MTP and the
gemma4_assistant kind at K = 4 and K = 2 with the field's per-position acceptance, uniform
and zipf routing, bs 1..64; `mtplab bench --groups mtplab/studies/moe/moe_spec.yaml`).
Report: `mtplab report moe --from D/<group>`: a moe_spec run gets the study's report
(moe_spec.py: where speculation stops paying, the curve's shape, the K = 2 / K = 4 crossover,
what zipf changes), any other group each arm against the group's first arm at every grid
point (studies/group.py).
Runners here: moe_spec_runner.py (the speculation study in one process, one engine per model,
routing and arm over every batch size: bench_moe_spec.py), bench_moe.py (experts touched per
step and the floor of those experts) and,
for question `moe_floor` (moe_floor.py), bench_moe_floor.py (the MoE decode step against its
floor, split vs grouped MoE kernels); benchmarks/ holds their entry points.
"""
from functools import partial
from pathlib import Path

from .. import group, report as _report
from . import moe_spec

QUESTION = "moe"
GROUPS = ('moe',)
report = partial(_report, QUESTION)


def results_doc(results, *, sweep_dir: str, **kw) -> dict:
    """The results doc of a run's group folder: the study's for a moe_spec grid."""
    import yaml
    grid = Path(sweep_dir) / "grid.yaml"
    if grid.is_file() and moe_spec.is_spec_grid(yaml.safe_load(grid.read_text()) or {}):
        return moe_spec.results_doc(results, sweep_dir=sweep_dir, **kw)
    return group.results_doc(QUESTION, results, sweep_dir=sweep_dir, **kw)


def render(doc: dict) -> str:
    return moe_spec.render(doc) if doc.get("study") == moe_spec.STUDY else group.render(doc)
