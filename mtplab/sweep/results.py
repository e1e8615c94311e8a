"""The results table of a sweep: `results.jsonl` (the journal) and `results.parquet`.

    results.jsonl    one JSON line per finished or dropped cell, appended by the driver only
                     (write, flush, fsync before the next cell is recorded); the last record of
                     a cell id wins
    results.parquet  the last record of every cell id, rewritten atomically after each record

A driver killed inside a write leaves a torn last line. `set_aside_torn_tail` runs when a
driver opens the journal (under the out-dir lock, before its first append): a complete record
that only lacks its newline gets it; anything else moves to `results.jsonl.torn-<UTC time>` with
a warning, so the next append starts on a fresh line and no record is glued onto garbage.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import pandas as pd

from ..atomic import atomic_path, atomic_write_bytes, open_in_place
from ..fmt import readable
from .metrics import meter_name

RESULTS_JSONL = "results.jsonl"
RESULTS_PARQUET = "results.parquet"

logger = logging.getLogger("mtplab.sweep")


def set_aside_torn_tail(path: Path) -> Path | None:
    """Make `path` end on a whole line; return where a torn last line was moved (or None)."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return None
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        whole = isinstance(json.loads(tail), dict)
    except ValueError:
        whole = False
    if whole:                                   # killed between the record and its newline
        with open_in_place(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        return None
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    dest = atomic_write_bytes(path.with_name(f"{path.name}.torn-{stamp}"), tail)
    with open_in_place(path, "rb+") as f:
        f.truncate(cut)
        os.fsync(f.fileno())
    logger.warning("%s ended in a torn line (%d bytes, a write cut short by a kill); set aside "
                   "in %s, the cell it belonged to runs again.", path, len(tail), dest)
    return dest


def append_record(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON line and make it durable (flush + fsync) before returning."""
    line = json.dumps(row, default=str)
    with open_in_place(path, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class BadJournal(ValueError):
    """results.jsonl holds a line that is not a cell record; the message names the line."""


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of results.jsonl (a torn last line, from a crash, is ignored). Any other
    line that is not a cell record (a JSON object with `cell_id` and `status`) raises
    BadJournal: it was not written by a sweep, and guessing would skip or re-run cells."""
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BadJournal(f"{path} is not a text file (byte {e.object[e.start]:#04x} at offset "
                         f"{e.start} is not UTF-8), so it is no sweep's journal; move it "
                         "away, or use another out folder.") from None
    lines = text.splitlines()
    if lines and not text.endswith("\n"):
        lines.pop()                             # the torn tail: set_aside_torn_tail's
    out = []
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            rec = None
        if not (isinstance(rec, dict) and isinstance(rec.get("cell_id"), str)
                and isinstance(rec.get("status"), str)):
            raise BadJournal(f"{path} line {i} is not a cell record (a JSON object with "
                             f"cell_id and status): {ln[:80]!r}; remove that line, or use "
                             "another out folder.")
        out.append(rec)
    return out


def last_records(jsonl: Path) -> dict[str, dict[str, Any]]:
    """cell id -> its last record, in first-seen order of the ids."""
    return {r["cell_id"]: r for r in read_records(jsonl)}


def collect(jsonl: Path) -> pd.DataFrame:
    """The last record of every cell id, in first-seen order, one row each."""
    return pd.DataFrame(list(last_records(jsonl).values()))


def write_parquet(jsonl: Path, path: Path) -> pd.DataFrame:
    df = _arrow_safe(collect(jsonl))
    with atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    return df


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Columns mixing value types (e.g. a dropped cell's invalid setting) become strings."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {type(v) for v in df[c] if v is not None and not _is_nan(v)}
            if len(kinds) > 1 and not kinds <= {int, float}:
                df[c] = df[c].map(lambda v: v if v is None else str(v))
    return df


# -- the table `mtplab sweep` ends with --------------------------------------------------------
# Settings that say where a cell wrote, or a test hook: never an axis of a figure or table.
NOT_AXES = ("cfg.trace_dir", "cfg.run_name", "fail")
# Columns of the table `mtplab sweep` prints at the end, after the cell's axes.
TABLE_METRICS = ("tok_per_s", "accept_len", "bubble_frac")


def varying(df: pd.DataFrame) -> list[str]:
    """Columns of the settings the grid varied (as written in it) among ok rows: `cfg.<k>`
    for RunConfig fields, the workload field, else `param.<k>`; derived values (e.g.
    max_total_tokens following batch_size) are not settings."""
    ok = df[df["status"] == "ok"]
    written = pd.DataFrame([json.loads(s) for s in ok["settings_json"]])
    keys = [k for k in written.columns if written[k].astype(str).nunique() > 1]
    cols = [f"cfg.{k}" if f"cfg.{k}" in ok.columns else k if k in ok.columns else f"param.{k}"
            for k in keys]
    return [c for c in cols if c in ok.columns and c not in NOT_AXES]


def text(v) -> str:
    """A setting as written: 16 rather than 16.0 (a column holding NaN of a failed cell is
    float), '-' for a missing value."""
    if isinstance(v, float):
        return "-" if math.isnan(v) else str(int(v)) if v.is_integer() else f"{v:g}"
    return str(v)


def results_table(df: pd.DataFrame, metrics: Sequence[str] = TABLE_METRICS) -> str:
    """The compact text table of a sweep: one row per cell (cell id, status, the varying
    settings, tok/s, accept_len, bubble fraction); `-` where a value is missing (a failed
    cell, no draft, no profile, no GPU)."""
    if df.empty:
        return "(no cells)"
    axes = varying(df) if (df["status"] == "ok").any() else []
    df = df.assign(**{m: float("nan") for m in metrics if m not in df.columns})
    t = df[["cell_id", "status", *axes, *metrics]].copy()
    cols = list(t.columns)
    t[axes] = t[axes].map(text)
    t.columns = [c.removeprefix("cfg.").removeprefix("param.") for c in cols]
    if "bubble_frac" in t:
        t["bubble_frac"] = [f"{v:.1%}" if v == v and v is not None else "-"
                            for v in t["bubble_frac"]]
    for m in ("tok_per_s", "accept_len"):
        if m in t:
            t[m] = [readable(v) for v in t[m]]
    bubble = f"bubble ({meter_name(df['cfg.device'])})" if "cfg.device" in df else "bubble"
    return t.rename(columns={"tok_per_s": "tok/s", "bubble_frac": bubble}).to_string(
        index=False, na_rep="-")
