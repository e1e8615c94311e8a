"""Atomic file writes: a reader sees either the old file or the complete new one, never a part.

Data is written to a temporary file in the destination's folder (same file system), flushed and
fsynced, then moved over the destination with `os.replace`. On any error the temporary file is
removed and the destination is left untouched. The file gets the mode a plain `open()` gives
(0666 less the umask), whatever mode the writer chose (safetensors creates its files 0600).

No write follows a symbolic link out of its folder: an atomic write onto a link replaces the
link itself (`os.replace` renames over the link, never through it), and a file written in
place (appended, truncated: `open_in_place`) is refused when it is a link (LinkedFileError).
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

# the modes of `open_in_place` (binary, or text with an encoding) -> os.open flags
_IN_PLACE = {"a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
             "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
             "r+": os.O_RDWR}


class LinkedFileError(OSError):
    """A file to be written in place is a symbolic link."""


def open_fd_in_place(path: PathLike, flags: int, mode: int = FILE_MODE) -> int:
    """`os.open(path, flags, mode)` for a file written in place, refused with LinkedFileError
    when `path` is a symbolic link: the write would land wherever the link points."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError:
        if os.path.islink(path):
            raise LinkedFileError(f"{path} is a symbolic link (to {os.readlink(path)}); "
                                  "mtplab writes this file in place and never through a link: "
                                  "remove the link or choose another folder.") from None
        raise


def open_in_place(path: PathLike, mode: str = "ab", encoding: Optional[str] = None):
    """`open(path, mode)` for a file written in place (appended "a", truncated "w" or
    rewritten "r+"; binary with a "b", else text), refused as `open_fd_in_place` refuses."""
    flags = _IN_PLACE.get(mode.replace("b", ""))
    if flags is None:
        raise ValueError(f"open_in_place takes the modes {list(_IN_PLACE)} (with 'b' for "
                         f"binary), got {mode!r}.")
    return os.fdopen(open_fd_in_place(path, flags), mode,
                     encoding=None if "b" in mode else (encoding or "utf-8"))


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success it replaces `path`, on failure it is
    removed.

    The temporary name ends with `path`'s suffix (e.g. `.png`, `.svg`), so writers that infer a
    format from the extension work unchanged. Parent folders are created. The body must create
    the file; if it does not, the `FileNotFoundError` propagates and `path` is untouched.
    A symbolic link at `path` is replaced by the new file; what it pointed to is untouched.
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
