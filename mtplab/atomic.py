"""Atomic file writes: a reader sees either the old file or the complete new one, never a part.

Data is written to a temporary file in the destination's folder (same file system), flushed and
fsynced, then moved over the destination with `os.replace`. On any error the temporary file is
removed and the destination is left untouched.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is removed.

    The temporary name ends with `path`'s suffix (e.g. `.png`, `.svg`), so writers that infer a
    format from the extension work unchanged. Parent folders are created. The body must create
    the file; if it does not, the `FileNotFoundError` propagates and `path` is untouched.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A fresh unique name (not mkstemp, whose 0600 mode would survive the rename); the writer
    # creates the file with the usual permissions.
    tmp = dest.with_name(f".{dest.stem}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp{dest.suffix}")
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # FileNotFoundError when the writer wrote nothing
            os.fsync(f.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    """Write `data` to `path` atomically; return the destination path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Write `text` to `path` atomically (encoded with `encoding`); return the destination path."""
    return atomic_write_bytes(path, text.encode(encoding))
