"""A run folder's files, read once each with one sentence for anything unreadable: the what-if
predictor's loader (whatif.load_run) reads a run folder only through these.

    man = json_object(d / "manifest.json", "the run's manifest")
    df = table(d / "host_steps.parquet", HOST_STEP_COLUMNS, "the host-step table")

A file that is missing, empty, truncated, not JSON / parquet, a JSON value other than an
object, a table without the columns its reader needs or with a non-numeric or non-finite
number in them raises RunFolderError naming the file, what is wrong and how to get a good
one (record the run again).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

RECORD = ("record the run again with mtplab run --step-profile true --out DIR (or a sweep "
          "cell with step_profile: true)")


class RunFolderError(ValueError):
    """A run folder's file that cannot be read as what it should be (one sentence)."""


def json_object(path: Path, what: str) -> dict:
    """The JSON object in `path`."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RunFolderError(f"{path} ({what}) is not text; {RECORD}.") from None
    except OSError as e:
        raise RunFolderError(f"{path} ({what}) cannot be read ({e.strerror or e}); "
                             f"{RECORD}.") from None
    if not text.strip():
        raise RunFolderError(f"{path} ({what}) is empty; {RECORD}.")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise RunFolderError(f"{path} ({what}) is not valid JSON ({e}); {RECORD}.") from None
    if not isinstance(doc, dict):
        raise RunFolderError(f"{path} ({what}) holds a JSON {_json_kind(doc)}, not an object; "
                             f"{RECORD}.")
    return doc


def _json_kind(v) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), "number")


def table(path: Path, columns: Sequence[str], what: str, *,
          numeric: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """The parquet table in `path`, with `columns` present and the `numeric` ones (None:
    every column) finite numbers (`step` an integer)."""
    try:
        size = path.stat().st_size
    except OSError as e:
        raise RunFolderError(f"{path} ({what}) cannot be read ({e.strerror or e}); "
                             f"{RECORD}.") from None
    if size == 0:
        raise RunFolderError(f"{path} ({what}) is empty; {RECORD}.")
    try:
        df = pd.read_parquet(path)
    except Exception as e:        # pyarrow's errors for a truncated or foreign file vary
        raise RunFolderError(f"{path} ({what}) is not a readable parquet table "
                             f"({type(e).__name__}); {RECORD}.") from None
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise RunFolderError(f"{path} lacks column{'s' * (len(missing) > 1)} "
                             f"{', '.join(missing)}, so it is not {what} (it has "
                             f"{', '.join(map(str, list(df.columns)[:6]))}); {RECORD}.")
    for c in (df.columns if numeric is None else numeric):
        v = pd.to_numeric(df[c], errors="coerce")
        bad = v.isna() | ~v.map(lambda x: math.isfinite(x) if x == x else False)
        if bad.any():
            raise RunFolderError(f"{path} ({what}): column {c} holds a value that is not a "
                                 f"finite number ({df[c][bad].iloc[0]!r}); {RECORD}.")
        df[c] = v.astype(float) if c != "step" else v.astype("int64")
    return df
