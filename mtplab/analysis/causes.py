"""The bubble causes, defined once: name, colour, help line and definition.

The analyser (`bubbles.py`) gives every device bubble exactly one cause, the first of
`CAUSES` that applies; the steps table's `bubble_<cause>_us` columns, the sweep's
`bubble_<cause>_frac` columns, `mtplab bench`'s cause split, `mtplab analyze --help`, the
plots' gap colours and legends and notebook 05 all read this table, in this order.

`host` is a group: a bubble's own label is `host:<stage>` (the stage the issuing thread was
in), `host:python` (host events, none a stage) or `host:untraced` (no host event at all);
`cause_group` maps a label to its group; `cause_split` sums a summary by group.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    name: str          # the group name: a column suffix (bubble_<name>_us) and a label prefix
    color: str         # matplotlib colour of its gaps and bars in every figure
    help: str          # a few words: legends, --help, table headers
    definition: str    # when a bubble gets this cause (first one that applies wins)


CAUSE_TABLE = (
    Cause("sync", "#d62728", "host blocked in a synchronize",
          "the host is blocked while the device is idle: a synchronize call "
          "(cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize and their "
          "driver/HIP forms, blocking cudaMemcpy), an `aten::item` / `aten::_local_scalar_dense`, "
          "or a host `sync` span overlaps the bubble (cudaStreamWaitEvent is a device-side "
          "wait, not a host block)"),
    Cause("host_prep", "#7f7f7f", "host in schedule/prepare/process_result",
          "the host is inside a `schedule` / `prepare` / `process_result` span or an SGLang "
          "`scheduler.*` span during the bubble"),
    Cause("launch", "#ff9896", "work already issued: driver/queue latency",
          "the launch call (by correlation) of the work that ends the bubble started no later "
          "than the bubble began: the work was already issued, the delay is driver / queue "
          "latency (a gap inside one graph replay lands here)"),
    Cause("host", "#ff7f0e", "work issued late by the host",
          "the work that ends the bubble was issued late: its launch call started after the "
          "bubble began. `host:<stage>` when the issuing thread was inside a stage-named span "
          "at the bubble's start (the innermost: `host:draft`, `host:verify`, ...), "
          "`host:python` when it was inside host events none of which names a stage (aten ops, "
          "a ProfilerStep#N span: a plain PyTorch program), `host:untraced` when it had no "
          "recorded event at all (it ran code the profiler does not record: Python between "
          "ops without with_stack, a lock, a sleep)"),
    Cause("other", "#1f77b4", "no launch call in the trace",
          "none of these: the work that ends the bubble has no launch call in the trace (its "
          "launch fell before the profiler started or outside a cut trace, CUPTI dropped the "
          "runtime record, or another process issued it), so nothing on the host can be said "
          "to have delayed it"),
)

CAUSES = tuple(c.name for c in CAUSE_TABLE)
SYNC, HOST_PREP, LAUNCH, HOST, OTHER = CAUSES      # the table's names, in priority order
CAUSE_COLORS = {c.name: c.color for c in CAUSE_TABLE}
HOST_PYTHON = "python"       # host:python
HOST_UNTRACED = "untraced"   # host:untraced


def host_label(what: str) -> str:
    """The label of a `host` bubble: `host:<stage>`, `host:python`, `host:untraced`."""
    return f"{HOST}:{what}"


def cause_group(cause):
    """The CAUSES entry of a cause label (`host:draft` -> `host`); a str or a pandas Series."""
    if isinstance(cause, str):
        return cause.split(":", 1)[0]
    return cause.map({c: c.split(":", 1)[0] for c in cause.unique()})  # few distinct values


def cause_help() -> str:
    """'sync (host blocked in a synchronize), host_prep (...), ...': one line for --help."""
    return ", ".join(f"{c.name} ({c.help})" for c in CAUSE_TABLE)


def cause_split(summary: dict) -> dict[str, float]:
    """Bubble µs per cause group, in `CAUSES` order, from an analysis summary: the `causes`
    line of `mtplab analyze` and the answer of notebook 05 (one grouping for both)."""
    return {c: float(summary[f"bubble_{c}_us"]) for c in CAUSES}


def main_cause(summary: dict) -> str | None:
    """The cause group holding the most bubble time (None without any bubble)."""
    split = cause_split(summary)
    top = max(split, key=split.__getitem__)
    return top if split[top] > 0 else None
