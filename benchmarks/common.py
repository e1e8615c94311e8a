"""Shared tail of the benchmark scripts."""
from __future__ import annotations

from typing import Optional

from mtplab.atomic import atomic_write_text


def emit(table: str, out: Optional[str]) -> None:
    """Print the markdown table and, given `out`, write it there atomically."""
    print(table)
    if out:
        atomic_write_text(out, table + "\n")
