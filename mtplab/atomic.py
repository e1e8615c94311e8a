"""Atomic file writes: a reader sees either the old file or the complete new one, never a part.

Data is written to a temporary file in the destination's folder (same file system), flushed and
fsynced, then moved over the destination with `os.replace`. On any error the temporary file is
removed and the destination is left untouched. The file gets the mode a plain `open()` gives
(0666 less the umask), whatever mode the writer chose (safetensors creates its files 0600).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]


def _umask() -> int:
    mask = os.umask(0o022)             # reading the umask means setting it: put it back
    os.umask(mask)
    return mask


FILE_MODE = 0o666 & ~_umask()          # what open(path, "w") would create


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is
    removed.

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
            os.fchmod(f.fileno(), FILE_MODE)
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


def strict_json(obj: Any, plain: Optional[Callable[[Any], Any]] = None) -> Any:
    """`obj` as strict JSON takes it: NaN and infinities are None (null), recursively through
    dicts (keys as strings), lists and tuples; `plain(v)` first turns other scalars (numpy,
    pandas) into Python ones."""
    if plain is not None:
        obj = plain(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): strict_json(v, plain) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v, plain) for v in obj]
    return obj


def atomic_write_json(path: PathLike, obj: Any,
                      plain: Optional[Callable[[Any], Any]] = None) -> Path:
    """Write `strict_json(obj, plain)` to `path` atomically, indented (anything else JSON
    cannot hold as its str())."""
    text = json.dumps(strict_json(obj, plain), indent=1, allow_nan=False, default=str)
    return atomic_write_text(path, text + "\n")
