"""The moe_floor decode phase's no-PDL arm: the grouped engine with its graphs captured under
kernels/pdl.py `off()`, its steps beside the grouped arm's as a without / with ratio in the
decode section and the answer."""
from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

from mtplab.kernels import pdl
from mtplab.studies import reports as R
from mtplab.studies.moe import moe_floor as F
from mtplab.studies.moe import moe_floor_runner as runner

FIXTURE = Path(__file__).parent / "fixtures" / "moe_floor" / "2026-12-03_h200_abc1234.json"


def test_the_no_pdl_arm_builds_the_grouped_kernels_with_pdl_off(monkeypatch):
    seen = []
    monkeypatch.setattr(runner, "RunConfig", lambda **kw: SimpleNamespace(**kw))
    monkeypatch.setattr(runner, "Engine", lambda cfg: seen.append((cfg.moe_kernels, pdl._off)))
    for arm in F.ARMS:
        runner.build(arm, 2, 1)
    assert seen == [("split", 0), ("grouped", 0), ("grouped", 1)]
    assert pdl._off == 0


def test_the_no_pdl_steps_give_a_ratio_in_the_section_and_the_answer():
    doc = R.load(FIXTURE.with_suffix(".md"))
    assert F.pdl_ratios(doc) == [] and "PDL" not in F.render(doc)
    doc = copy.deepcopy(doc)
    for s in [s for s in doc["decode"]["steps"] if s["kernels"] == "grouped"]:
        doc["decode"]["steps"].append({"kernels": F.NO_PDL_ARM, "bs": s["bs"],
                                       "ms": [x * 1.05 for x in s["ms"]]})
    rows = F.pdl_ratios(doc)
    assert [r["bs"] for r in rows] == doc["batches"]
    assert all(abs(r["ratio"] - 1.05) < 1e-9 for r in rows)
    md = F.render(doc)
    assert "| bs | decode step grouped without / with PDL | n |" in md
    assert "the grouped step without / with programmatic dependent launch" in md
    assert sum(F.NO_PDL_ARM in ln for ln in md.splitlines() if ln.startswith("|")) == \
        len(doc["batches"])
