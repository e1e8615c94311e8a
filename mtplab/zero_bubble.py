"""The zero-bubble knobs, declared once: `zero_bubble` and its sub-knobs, each a RunConfig
field (RunConfig inherits ZeroBubbleKnobs) that removes one host sync or wait from the decode
path, with the part of the engine that acts on it.

    sub-knob             what it removes                        owner: field it sets
    zb_async_d2h         the blocking `.tolist()` of results    loop: LoopOptions.async_d2h
                         (pinned copies on the copy stream)           (sched/scheduler.py)
    zb_device_seq_lens   the host's read of the lengths (a      loop: LoopOptions.device_seq_lens
                         speculative decode under overlap)
    zb_draft_preexec     the draft between publish and the      worker: SpecParams.draft_preexec
                         next tree (it runs after commit)             (speculative/worker.py)

`zero_bubble=True` turns every one on; a sub-knob left None takes `auto` with zero_bubble
off (RunConfig resolves it). A worker sub-knob needs a draft. ZB_SUBKNOBS, the table of
sub-knobs, is read off the fields: RunConfig's validation and help, the engine (which builds
LoopOptions and SpecParams from `options`), the what-if predictor and its check against
sweeps (studies/whatif/check.py), the regime map's effects and its leave-one-out arms
(studies/regime/ladder.py), the SGLang adapter and notebook 04 read it. A new sub-knob is its field
here, its field and mechanism in its owner, and its README knob row; the what-if predictor
refuses it by name until `_knob` (analysis/whatif.py) models it.

A leaf: imports nothing of mtplab (the analysis package reads it without torch).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import NamedTuple, Optional


class SubKnob(NamedTuple):
    owner: str          # "loop" (LoopOptions) or "worker" (SpecParams): the field without zb_
    auto: bool          # its value when left None and zero_bubble is off
    short: str          # its name in a row's knob label (studies/whatif/check.py)


def sub_knob(owner: str, auto: bool, short: str, help: str):
    """A sub-knob's field: None until RunConfig resolves it; its SubKnob and its one-line
    meaning (`mtplab run --help`) as metadata."""
    return field(default=None, metadata={"help": help, "sub_knob": SubKnob(owner, auto, short)})


@dataclass
class ZeroBubbleKnobs:
    """RunConfig's zero-bubble fields (RunConfig inherits them: they lead its field order)."""
    zero_bubble: bool = field(default=False, metadata={"help": "turn on every zb_* sub-knob"})
    # async d2h is what the overlap loop is built on, as in SGLang: on unless turned off
    zb_async_d2h: Optional[bool] = sub_knob("loop", True, "async", "results copied to pinned "
                                            "memory asynchronously (None: True)")
    zb_device_seq_lens: Optional[bool] = sub_knob("loop", False, "dsl", "no host read of "
                                                  "seq_lens on the speculative decode path "
                                                  "(None: = zero_bubble)")
    zb_draft_preexec: Optional[bool] = sub_knob("worker", False, "pre", "draft k+1 runs right "
                                                "after commit k (None: = zero_bubble)")


ZB_SUBKNOBS: dict[str, SubKnob] = {f.name: f.metadata["sub_knob"]
                                   for f in fields(ZeroBubbleKnobs) if "sub_knob" in f.metadata}


def options(values: dict, owner: str) -> dict:
    """The resolved sub-knobs of `owner` as its field names: {"async_d2h": True, ...} from
    {"zb_async_d2h": True, ...} (a RunConfig's `asdict`, or any mapping of the names)."""
    return {name.removeprefix("zb_"): values[name] for name, k in ZB_SUBKNOBS.items()
            if k.owner == owner}


def leave_one_out() -> list[dict]:
    """Per sub-knob (table order), the settings of zero_bubble less that one: it off, every
    other on (spelled out: zero_bubble=True with one turned off is refused)."""
    return [{name: name != off for name in ZB_SUBKNOBS} for off in ZB_SUBKNOBS]
