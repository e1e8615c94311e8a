"""The out-dir lock: one sweep driver per output folder.

    <out>/.lock    flock(LOCK_EX) held by the driver for the whole sweep; the file holds the
                   holder as JSON {"pid", "host", "started" (UTC ISO time), "token"}

Two drivers on one folder would delete each other's running cells (a cell starts by clearing
its folders) and record finished cells as failed, so the second one is refused at once with
`OutDirLocked`, whose message names the holder. The kernel drops a flock when its holder
dies (kill -9 included), so a stale `.lock` file never blocks a resumed sweep.

Re-entrant inside one process (flock is per open file: a second flock of the same file from
the same process would conflict with itself), so the CLI and `run_sweep` may both hold it.

Cell processes on Dask workers check the lock with `driver_alive`: while the driver that
started them holds it (same token), they run; once it is gone (killed, interrupted) they stop,
so a resumed sweep never shares a cell folder with an orphan of the previous driver.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Iterator

LOCK_NAME = ".lock"

_held: dict[Path, tuple[int, str, int]] = {}      # lock path -> (fd, token, depth)


class OutDirLocked(RuntimeError):
    """Another sweep driver holds the out dir; the message names it in one line."""


@contextlib.contextmanager
def hold_out_dir(out: str | Path) -> Iterator[str]:
    """Hold `<out>/.lock` exclusively; yield this driver's token. Raise OutDirLocked at once
    (no waiting) when another process holds it."""
    path = Path(out).resolve() / LOCK_NAME        # the lock file itself: never a link's target
    if path in _held:
        fd, token, depth = _held[path]
        _held[path] = (fd, token, depth + 1)
        try:
            yield token
        finally:
            fd, token, depth = _held[path]
            _held[path] = (fd, token, depth - 1)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():          # the holder's info would be written where the link points
        raise OutDirLocked(f"{path} is a symbolic link; the sweep writes its lock file in "
                           "place, never through a link: remove the link.")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _describe(path)
        os.close(fd)
        raise OutDirLocked(f"{path.parent} is in use by another mtplab sweep ({holder}); wait "
                           "for it to finish or stop it, or choose another --out.") from None
    token = uuid.uuid4().hex
    info = {"pid": os.getpid(), "host": socket.gethostname(), "token": token,
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    os.fsync(fd)
    _held[path] = (fd, token, 1)
    try:
        yield token
    finally:
        depth = _held[path][2]
        if depth == 1:
            del _held[path]
            os.close(fd)            # releases the flock; the file stays (holder info is stale)
        else:
            _held[path] = (fd, token, depth - 1)


def _describe(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


def driver_alive(out: str | Path, token: str) -> bool:
    """True while the driver whose token is `token` holds `<out>/.lock`. Called from cell
    processes' supervisors on Dask workers (same shared file system)."""
    path = Path(out) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:      # someone holds it: is it our driver?
            try:
                return json.loads(os.pread(fd, 4096, 0) or b"{}").get("token") == token
            except ValueError:       # a new holder is writing its info: not our driver
                return False
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False                 # nobody holds it: the driver is gone
    finally:
        os.close(fd)
