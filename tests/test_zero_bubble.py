"""The zero-bubble sub-knobs are listed once (mtplab/zero_bubble.py ZB_SUBKNOBS): config, the
engine's options, the what-if predictor and its sweep check, the regime map and notebook 04
take names, owners and defaults from that table; no code names the sub-knobs as a list."""
from __future__ import annotations

import re
from pathlib import Path

from mtplab import RunConfig
from mtplab.analysis import whatif
from mtplab.sweep import regime, whatif_check
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
