"""Checks at the door (pure Python, never torch): RunConfig's fields against their declared
types, the arguments of `Engine.generate`, ports and output paths, each failure one sentence
with the fix (the command line's argparse types built on them: mtplab/flags.py).

Integers are `numbers.Integral` but never bool (True is an int in Python, and
`max_running_requests=True` is a mistake, not 1): Python ints and numpy integers pass and are
stored as int. Floats accept any real number but bool, stored as float. A number given as a
string is refused (the CLI parses its flags before they get here). Seeds live in
[0, 2**32): the sampling hash keys on 32 bits of the seed (kernels/sampling.py), so a larger
seed would silently share a stream with a smaller one; torch.manual_seed and numpy accept
the whole range.
"""
from __future__ import annotations

import math
import numbers
import os
import re
import tempfile
import types
import typing
from dataclasses import fields
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any, Optional, Sequence

from .errors import ConfigError

SEED_LIMIT = 2 ** 32          # seeds are in [0, SEED_LIMIT)
NAME_MAX = 255                # bytes in one file name (Linux, macOS and Windows file systems)


# -- types ------------------------------------------------------------------------------------
def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _quoted_fix(name: str, value: str, want: type) -> str:
    """The fix for a number or bool given as a string: the literal, when it parses."""
    s = value.strip().lower()
    if want is bool:
        lit = True if s in ("true", "yes", "on", "1") else False if s in (
            "false", "no", "off", "0") else None
        return (f"use {name}=True or {name}=False" if lit is None
                else f"write {name}={lit!r} without quotes")
    try:
        lit = want(s)
    except ValueError:
        return f"give {name} a {want.__name__}"
    return f"write {name}={lit!r} without quotes"


def check_value(name: str, value: Any, tp: Any) -> Any:
    """`value` checked against the annotation `tp` (Optional/Union, bool, int, float, str,
    tuple, list, dict, Literal or any class); returns it normalised (numpy ints -> int,
    ints -> float for float fields, lists -> tuples for tuple fields). Raises ConfigError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        for member in members:
            try:
                return check_value(name, value, member)
            except ConfigError:
                continue
        if len(members) == 1:                 # Optional[X]: X's message, "or None"
            check_value(name, value, members[0])
        raise ConfigError(f"{name}={value!r} has the wrong type; give one of "
                          f"{[getattr(m, '__name__', str(m)) for m in members]}.")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{name}={value!r} is not allowed; use one of {list(args)}.")
        return value
    base = origin or tp
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            raise ConfigError(f"{name} is a boolean but got the string {value!r} (any "
                              f"non-empty string is truthy); {_quoted_fix(name, value, bool)}.")
        raise ConfigError(f"{name} must be True or False, got {value!r} "
                          f"({type(value).__name__}).")
    if base is int:
        if is_int(value):
            return int(value)
        if isinstance(value, str):
            raise ConfigError(f"{name} is an integer but got the string {value!r}; "
                              f"{_quoted_fix(name, value, int)}.")
        what = "a boolean" if isinstance(value, bool) else f"{value!r} ({type(value).__name__})"
        fix = (f"write {name}={int(value)}" if isinstance(value, float) and value.is_integer()
               else "give a whole number")
        raise ConfigError(f"{name} must be an integer, got {what}; {fix}.")
    if base is float:
        if is_real(value):
            return float(value)
        if isinstance(value, str):
            raise ConfigError(f"{name} is a number but got the string {value!r}; "
                              f"{_quoted_fix(name, value, float)}.")
        raise ConfigError(f"{name} must be a number, got {value!r} ({type(value).__name__}).")
    if base is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{name} must be a string, got {value!r} ({type(value).__name__}); "
                          f"quote it, e.g. {name}={str(value)!r}.")
    if base in (tuple, list):
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
            raise ConfigError(f"{name} must be a sequence such as (0.8, 0.6), got {value!r} "
                              f"({type(value).__name__}).")
        return base(value)
    if isinstance(base, type) and not isinstance(value, base):
        raise ConfigError(f"{name} must be a {base.__name__}, got {value!r} "
                          f"({type(value).__name__}).")
    return value


def check_fields(obj) -> None:
    """Every dataclass field of `obj` against its declared annotation, normalised in place
    (frozen dataclasses too)."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        object.__setattr__(obj, f.name, check_value(f.name, getattr(obj, f.name), hints[f.name]))


def check_finite(obj, names: Sequence[str]) -> None:
    """Float fields that must be finite numbers (a YAML `.nan` or `.inf` is not a setting)."""
    for name in names:
        v = getattr(obj, name)
        if is_real(v) and not math.isfinite(v):
            raise ConfigError(f"{name} must be a finite number, got {v!r}.")


def check_min(obj, minimum: dict) -> None:
    """{field: smallest allowed value}; None (an unset Optional) passes."""
    for name, lo in minimum.items():
        v = getattr(obj, name)
        if v is not None and v < lo:
            need = "a positive integer" if lo == 1 else f"at least {lo}"
            raise ConfigError(f"{name} must be {need}, got {v!r}.")


def check_seed(name: str, seed, count: int = 1) -> None:
    """seed .. seed + count - 1 must lie in [0, 2**32) (one seed per request)."""
    if not is_int(seed):
        raise ValueError(f"{name} must be an integer in [0, 2**32), got {seed!r} "
                         f"({type(seed).__name__}).")
    if not 0 <= seed <= SEED_LIMIT - count:
        extra = f" (request i uses {name} + i, for {count} requests)" if count > 1 else ""
        raise ValueError(f"{name} {seed} is out of range: seeds must lie in [0, 2**32)"
                         f"{extra}; use a seed in [0, {SEED_LIMIT - count}].")


DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(device: str) -> None:
    if not DEVICE_RE.fullmatch(device):
        raise ConfigError(f"device={device!r} is not a device; use 'auto', 'cpu', 'cuda' or "
                          "'cuda:N'.")


def check_run_name(run_name: Optional[str]) -> None:
    """A run folder is one plain name under trace_dir: no path, no '..', nothing absolute."""
    if run_name is None:
        return
    bad = (not run_name.strip() or run_name in (".", "..") or "/" in run_name
           or "\\" in run_name or "\0" in run_name or PurePosixPath(run_name).is_absolute()
           or PureWindowsPath(run_name).drive)
    if bad:
        raise ConfigError(f"run_name={run_name!r} must be a plain folder name under trace_dir "
                          "(no '/', '\\', '..' or absolute path); set trace_dir for the "
                          "location.")
    if len(os.fsencode(run_name)) > NAME_MAX:
        raise ConfigError(f"run_name {run_name[:40]!r}... has {len(os.fsencode(run_name))} bytes "
                          f"and a folder name holds at most {NAME_MAX}; pass a shorter name.")


# -- Engine.generate ---------------------------------------------------------------------------
def _token_ids(what: str, ids, vocab_size: int) -> list[int]:
    """A sequence of token ids -> list[int]. numpy/torch arrays pass through tolist()."""
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):
        ids = ids.tolist()
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise ValueError(f"{what} must be a list of token ids, got {type(ids).__name__}.")
    out = []
    for t in ids:
        if not is_int(t):
            raise ValueError(f"{what} holds {t!r} ({type(t).__name__}); token ids are "
                             "integers (int or a numpy integer), not floats, bools or strings.")
        if not 0 <= t < vocab_size:
            raise ValueError(f"{what} holds token id {int(t)}, outside the vocabulary "
                             f"[0, {vocab_size}); token ids must lie in [0, {vocab_size}).")
        out.append(int(t))
    return out


def check_generate_args(prompts, max_new_tokens, temperature, top_p, seed, stop_ids,
                        ignore_eos, progress, *, vocab_size: int,
                        default_seed: int) -> tuple[list, list[int]]:
    """Everything `Engine.generate` takes, before any request is made or admitted. Request i
    samples with seed + i (seed None: the config seed). Token ids: ints or numpy integers
    (arrays via tolist()); never bools, floats (even 5.0) or strings. Returns (prompts: each
    a str or list[int], stop ids: list[int])."""
    if isinstance(prompts, (str, bytes)):
        raise ValueError("generate takes a list of prompts; wrap a single string in [ ].")
    if not isinstance(prompts, Sequence):
        raise ValueError(f"generate takes a list of prompts (strings or token-id lists), got "
                         f"{type(prompts).__name__}.")
    out = [p if isinstance(p, str) else _token_ids(f"prompt {i}", p, vocab_size)
           for i, p in enumerate(prompts)]
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}.")
    if not is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got "
                         f"{temperature!r}.")
    if not is_real(top_p) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must be a number in (0, 1], got {top_p!r}.")
    check_seed("seed" if seed is not None else "the config seed",
               default_seed if seed is None else seed, max(1, len(prompts)))
    if isinstance(stop_ids, (set, frozenset)):       # an unordered collection of stops is fine
        stop_ids = sorted(stop_ids, key=repr)
    stops = [] if stop_ids is None else _token_ids("stop_ids", stop_ids, vocab_size)
    for name, v in (("ignore_eos", ignore_eos), ("progress", progress)):
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be True or False, got {v!r}.")
    return out, stops


# -- paths and ports (the command line's flags use these: mtplab/flags.py) -------------------
def check_port(port) -> int:
    if not is_int(port) or not 1 <= port <= 65535:
        raise ConfigError(f"port {port!r} is not a TCP port; use a number in 1..65535.")
    return int(port)


def _exists(q: Path) -> bool:
    try:
        return q.exists()
    except OSError:            # a name too long, a permission: answered by the checks below
        return False


def _nearest_existing(path: Path) -> Path:
    for q in (path, *path.parents):
        if _exists(q):
            return q
    return Path(".")


def _short(p: Path) -> str:
    s = str(p)
    return s if len(s) <= 60 else s[:57] + "..."


def _check_names(p: Path, what: str) -> None:
    """Every part of `p` short enough for the file system (NAME_MAX, PATH_MAX)."""
    q = _nearest_existing(p)
    try:
        name_max = os.pathconf(q if q.is_dir() else q.parent, "PC_NAME_MAX")
        path_max = os.pathconf(q if q.is_dir() else q.parent, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = NAME_MAX, 4096
    long = [part for part in p.parts if len(os.fsencode(part)) > name_max]
    if long:
        raise ConfigError(f"{what} {_short(p)}: the name {_short(Path(long[0][:40]))}... has "
                          f"{len(os.fsencode(long[0]))} bytes and this file system allows "
                          f"{name_max}; pass a shorter name.")
    if len(os.fsencode(str(p.absolute()))) >= path_max:
        raise ConfigError(f"{what} {_short(p)}: the path is longer than this file system's "
                          f"{path_max} bytes; pass a shorter path.")


def _check_creatable(folder: Path, what: str, p: Path) -> None:
    """Something can be made in the existing `folder` (a folder made and removed at once):
    permissions, a read-only mount, /proc or /sys, all answered before any work starts."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".mtplab-probe-", dir=folder))
    except OSError as e:
        raise ConfigError(f"{what} {p}: nothing can be written in {folder} "
                          f"({e.strerror or e}); pass another path.") from None


def check_out_dir(path, what: str = "the output folder") -> Path:
    """A folder a command may write into (made later, by the writer): it is a folder or does
    not exist yet, no part of it is a file, every name fits the file system, and the nearest
    existing folder takes new entries. The one check of every output folder: the command
    line's flags (flags.out_dir), the engine's run folder, save_target."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(f"{what} is {path!r}; pass a folder path.")
    p = Path(path)
    _check_names(p, what)
    q = _nearest_existing(p)
    if not q.is_dir():
        raise ConfigError(f"{what} {p}: {q} is a file, not a folder; pass a folder path.")
    _check_creatable(q, what, p)
    return p


def check_out_file(path, what: str = "the output file") -> Path:
    """A file a command may write (atomically, replacing it): not a folder, every name fits
    the file system, in an existing folder that takes new entries (no folder is made for it)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(f"{what} is {path!r}; pass a file name.")
    p = Path(path)
    _check_names(p, what)
    if p.is_dir():
        raise ConfigError(f"{what} {p} is a folder; pass a file name.")
    parent = p.parent
    if not parent.is_dir():
        q = _nearest_existing(parent)
        why = f"{q} is a file" if _exists(q) and not q.is_dir() else f"{parent} does not exist"
        raise ConfigError(f"{what} {p}: {why}; pass a path in an existing folder.")
    _check_creatable(parent, what, p)
    return p
