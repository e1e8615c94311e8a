"""The zero-bubble sub-knobs, listed once: each a RunConfig field that removes one host sync
or wait from the decode path, and the part of the engine that acts on it.

    sub-knob             what it removes                        owner: field it sets
    zb_async_d2h         the blocking `.tolist()` of results    loop: LoopOptions.async_d2h
                         (pinned copies on the copy stream)           (sched/scheduler.py)
    zb_device_seq_lens   the host's read of the lengths         loop: LoopOptions.device_seq_lens
    zb_draft_preexec     the draft between publish and the      worker: SpecParams.draft_preexec
                         next tree (it runs after commit)             (speculative/worker.py)

`zero_bubble=True` turns every one on; a sub-knob left None takes `auto` with zero_bubble
off (RunConfig resolves it). A worker sub-knob needs a draft. RunConfig, the engine (which
builds LoopOptions and SpecParams from `options`), the what-if predictor and its check
against sweeps (sweep/whatif_check.py), the regime map's effects (sweep/regime.py), the
SGLang adapter, notebook 04 and the README read this table. A new sub-knob is its row here,
its RunConfig field (config.py), its field and mechanism in its owner, and its README knob
row; the what-if predictor refuses it by name until `_knob` (analysis/whatif.py) models it,
and the regime group measures it once its arms (bench_grids/regime.yaml) set it.

A leaf: imports nothing (the analysis package reads it without torch).
"""
from __future__ import annotations

from typing import NamedTuple


class SubKnob(NamedTuple):
    owner: str          # "loop" (LoopOptions) or "worker" (SpecParams): the field without zb_
    auto: bool          # its value when left None and zero_bubble is off
    short: str          # its name in a row's knob label (sweep/whatif_check.py)


ZB_SUBKNOBS: dict[str, SubKnob] = {
    # async d2h is what the overlap loop is built on, as in SGLang: on unless turned off
    "zb_async_d2h": SubKnob("loop", True, "async"),
    "zb_device_seq_lens": SubKnob("loop", False, "dsl"),
    "zb_draft_preexec": SubKnob("worker", False, "pre"),
}


def options(values: dict, owner: str) -> dict:
    """The resolved sub-knobs of `owner` as its field names: {"async_d2h": True, ...} from
    {"zb_async_d2h": True, ...} (a RunConfig's `asdict`, or any mapping of the names)."""
    return {name.removeprefix("zb_"): values[name] for name, k in ZB_SUBKNOBS.items()
            if k.owner == owner}
