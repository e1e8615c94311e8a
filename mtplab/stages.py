"""The one stage vocabulary (docs/design.md "Stage vocabulary").

These names are used verbatim in code, spans, traces, tables and plots. The analyser
imports this module (it has no engine dependency), so keep it a leaf: no torch import.
"""
from __future__ import annotations

import re

# Host-side stages (run on the scheduler thread). `launch` is a bubble cause (analysis), not a
# stage: no span carries that name.
HOST_STAGES = ("schedule", "prepare", "process_result", "sync")
# Device-side stages, in the order they run inside one spec-v2 decode iteration. A target-only
# decode's forward is `verify` of a one-node tree (SGLang's trivial verify input for S == 0).
DEVICE_STAGES = (
    "resolve", "draft.seed", "draft.step", "draft", "tree", "verify", "accept", "commit",
    "publish", "draft_extend", "stash", "d2h", "prefill",
)
STAGES = HOST_STAGES[:2] + DEVICE_STAGES + HOST_STAGES[2:]
# The drafter's stages: its share of a step's GPU busy time is theirs (instrument/meter.py).
DRAFT_STAGES = ("draft.seed", "draft.step", "draft", "draft_extend")

# Host stages that count as "host preparation" when the analyser assigns a bubble cause.
HOST_PREP_STAGES = ("schedule", "prepare", "process_result")

# A fixed colour per stage so every plot agrees (matplotlib colour strings).
STAGE_COLORS = {
    "schedule": "#8c8c8c", "prepare": "#b3b3b3", "resolve": "#17becf",
    "draft.seed": "#ff7f0e", "draft.step": "#ffbb78", "draft": "#ff9f40",
    "tree": "#bcbd22", "verify": "#1f77b4", "accept": "#2ca02c", "commit": "#98df8a",
    "publish": "#9467bd", "draft_extend": "#c5b0d5", "stash": "#8c564b", "d2h": "#e377c2",
    "process_result": "#7f7f7f", "prefill": "#aec7e8", "sync": "#d62728",
}

STEP_RE = re.compile(r"^step\[(?P<kind>decode|prefill) bs=(?P<bs>\d+)\]$")


def step_name(kind: str, bs: int) -> str:
    """`step[decode bs=B]` / `step[prefill bs=B]`: the span name of one engine iteration."""
    if kind not in ("decode", "prefill"):
        raise ValueError(f"step kind must be 'decode' or 'prefill', got {kind!r}")
    return f"step[{kind} bs={bs}]"
