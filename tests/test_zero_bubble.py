"""The zero-bubble sub-knobs are listed once (mtplab/zero_bubble.py ZB_SUBKNOBS): config, the
engine's options, the what-if predictor and its sweep check, the regime map and notebook 04
take names, owners and defaults from that table; no code names the sub-knobs as a list."""
from __future__ import annotations

import re
from pathlib import Path

from mtplab import RunConfig
from mtplab.analysis import whatif
from mtplab.studies.regime import ladder as regime
from mtplab.studies.whatif import check as whatif_check
from mtplab.zero_bubble import ZB_SUBKNOBS

ROOT = Path(__file__).resolve().parents[1]


def test_no_copy_of_the_sub_knob_list_outside_the_table():
    """A line of code naming two sub-knobs is a copy of the list (one naming one sub-knob is
    that knob's own business: its field, its mechanism, a test arm)."""
    names = re.compile("|".join(ZB_SUBKNOBS))
    files = [p for d in ("mtplab", "benchmarks", "scripts") for p in sorted((ROOT / d).rglob("*"))
             if p.suffix in (".py", ".sh") and p.name != "zero_bubble.py"]
    copies = [f"{p.relative_to(ROOT)}:{i}" for p in files
              for i, line in enumerate(p.read_text().splitlines(), 1)
              if len(set(names.findall(line))) > 1]
    assert copies == []


def test_readers_derive_from_the_table():
    subs = tuple(ZB_SUBKNOBS)
    assert regime.SUBS == subs
    assert [e[0] for e in regime.EFFECTS if e[0].startswith("zb_")] == [
        f"{k} (frozen)" for k in subs]
    assert [c for c in whatif_check.KNOB_COLUMNS if c.startswith("cfg.zb_")] == [
        f"cfg.{k}" for k in subs]
    assert set(subs) <= set(whatif_check.ARM_SETTINGS) and set(subs) <= set(whatif.KNOBS)
    assert whatif.knob_whatifs({k: (False, True) for k in subs}) == ",".join(
        f"{k}=on" for k in subs)
    cfg = RunConfig(draft="frozen_kv_mtp", zero_bubble=True)
    assert {**cfg.zb_options("loop"), **cfg.zb_options("worker")} == {
        k.removeprefix("zb_"): True for k in subs}


def test_the_regime_group_leaves_each_sub_knob_out():
    """regime.yaml's `zero_bubble: each_off` arm stands for one arm per sub-knob (that one
    off, the others on): the arms the regime map's leave-one-out effects compare."""
    from mtplab.studies.bench import grid_doc
    for doc in (grid_doc("regime"), {**grid_doc("regime"), **grid_doc("regime")["quick"]}):
        labels = [regime.arm_label({f"cfg.{k}": v for k, v in a.items()}) for a in doc["arms"]]
        assert [x for x in labels if "zb-" in x] == [f"frozen_kv_mtp zb-{k}" for k in ZB_SUBKNOBS]
        assert all(a.get("zero_bubble") != "each_off" for a in doc["arms"])


PROBE_FIELD = ('    zb_probe: Optional[bool] = sub_knob("loop", False, "probe", "a test-only '
               'sub-knob (None: = zero_bubble)")\n')
PROBE_OPTION = "    probe: bool = False\n"
# Run in a copy of the package that has the two lines above: what reads the sub-knob table.
PROBE_CHECK = r'''
import json, sys
from dataclasses import fields
from pathlib import Path

import mtplab
assert mtplab.__file__.startswith(sys.argv[1]), mtplab.__file__
from mtplab import Engine, RunConfig, cli
from mtplab.analysis import whatif
from mtplab.studies.bench import grid_doc
from mtplab.errors import ConfigError
from mtplab.sglang.args import refuse_unsupported
from mtplab.studies.regime import ladder as regime
from mtplab.studies.whatif import check as whatif_check
from mtplab.zero_bubble import ZB_SUBKNOBS

assert list(ZB_SUBKNOBS)[-1] == "zb_probe"
# config: resolution, validation, help
assert RunConfig().zb_probe is False and RunConfig(zero_bubble=True).zb_probe is True
try:
    RunConfig(zero_bubble=True, zb_probe=False)
    raise AssertionError("zero_bubble=True with zb_probe=False was accepted")
except ConfigError as e:
    assert "zb_probe" in str(e)
try:
    cli.main(["run", "--help"])
except SystemExit:
    pass
# the engine's loop options
eng = Engine(RunConfig(overlap=True, zero_bubble=True, max_running_requests=2))
assert eng.scheduler.loop.probe is True
assert len(eng.generate([[1, 5, 6]], 4, ignore_eos=True)[0]) == 4
eng.check_invariants()
# the what-if predictor takes its name and refuses to guess its effect
assert whatif.parse_whatif("zb_probe=on")
m = whatif.StepModel(host={}, launches=(whatif.Launch("verify", 5.0, "forward",
                                                      (("verify", 100.0),)),),
                     loop=whatif.Loop(overlap=True))
for what in ("zb_probe=on", "zero_bubble=on"):
    try:
        whatif.apply(m, what)
        raise AssertionError(what)
    except whatif.WhatIfError as e:
        assert "zb_probe" in str(e) and "_knob" in str(e), e
assert whatif.knob_whatifs({"zb_probe": (False, True)}) == "zb_probe=on"
# its sweep check, the regime map (effect, arms, labels), the SGLang adapter
assert "cfg.zb_probe" in whatif_check.KNOB_COLUMNS and "zb_probe" in whatif_check.ARM_SETTINGS
assert whatif_check.SHORT["cfg.zb_probe"] == "probe"
assert ("zb_probe (frozen)", "frozen_kv_mtp zb", "frozen_kv_mtp zb-zb_probe") in regime.EFFECTS
labels = [regime.arm_label({f"cfg.{k}": v for k, v in a.items()})
          for a in grid_doc("regime")["arms"]]
assert "frozen_kv_mtp zb-zb_probe" in labels
try:
    refuse_unsupported(RunConfig(zb_probe=True), None)
    raise AssertionError("SGLang took zb_probe")
except ConfigError as e:
    assert "zb_probe" in str(e)
# notebook 04's arms: overlap only, each sub-knob on its own, all
cells = ["".join(c["source"]) for c in json.loads(Path(sys.argv[2]).read_text())["cells"]
         if c["cell_type"] == "code"]
ns = {"ZB_SUBKNOBS": ZB_SUBKNOBS}
exec(cells[0], ns)
arms_cell = next(c for c in cells if "arms = (" in c)
exec(arms_cell.split("df = run_arms")[0], ns)
assert {**ns["OFF"], "zb_probe": True} in ns["arms"] and ns["OFF"]["zb_probe"] is False
# the third edit: the README's knobs table has no row for it
print(json.dumps(sorted(f.name for f in fields(RunConfig))))
'''


def test_a_new_sub_knob_is_one_field_and_its_owner(tmp_path):
    """A copy of the package plus a test-only loop sub-knob, `zb_probe`: one field in
    ZeroBubbleKnobs (zero_bubble.py) and its owner's field in LoopOptions (loop_options.py;
    its mechanism, a branch in the loop, is left out). Nothing else is edited, and it reaches
    RunConfig's resolution, validation and help, the engine's loop options, the what-if
    predictor (which refuses it by name: `_knob` has no model of it), its sweep check, the
    regime map's effect and leave-one-out arm, the SGLang adapter and notebook 04's arms. The
    README's knobs row is the third edit (tests/test_readme.py requires it): the copy's
    RunConfig has exactly that one field more."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from dataclasses import fields

    from tests.test_readme import README

    pkg = tmp_path / "mtplab"
    shutil.copytree(ROOT / "mtplab", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for path, anchor, line in ((pkg / "zero_bubble.py", "\n\nZB_SUBKNOBS", PROBE_FIELD),
                               (pkg / "loop_options.py", "    debug_syncs: bool",
                                PROBE_OPTION)):
        text = path.read_text()
        assert text.count(anchor) == 1, (path, anchor)
        at = text.index(anchor)
        path.write_text(text[:at] + line + text[at:])
    out = subprocess.run([sys.executable, "-c", PROBE_CHECK, str(tmp_path),
                          str(ROOT / "notebooks" / "04_zero_bubble.ipynb")],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    names = set(json.loads(out.stdout.splitlines()[-1]))
    assert names - {f.name for f in fields(RunConfig)} == {"zb_probe"}
    assert "`zb_probe`" not in README
