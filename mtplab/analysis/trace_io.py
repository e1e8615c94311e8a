"""Load Kineto (torch.profiler) Chrome traces into columnar numpy arrays.

Understands traces from mtplab, SGLang, vLLM and plain PyTorch programs: they are all Kineto
Chrome traces (`.json` or `.json.gz`, gzip detected from the content). Only complete events
(`ph: "X"`) are kept, minus Kineto's whole-session `cat: "Trace"` span. Timestamps and durations
stay float64 microseconds exactly as written (never rounded). Category and name strings are
interned: `trace.cat[i]` indexes `trace.cats`, `trace.name[i]` indexes `trace.names`.

Integer columns use -1 for "absent": `stream` and `device` are filled for GPU-lane events
(`args.stream` / `args.device`, else the lane's `tid` / `pid`), `correlation` from
`args.correlation` (links a launch call to its kernels; every kernel replayed by one
`cudaGraphLaunch` shares that call's correlation), `external_id` from `args["External id"]`.
Times are JSON numbers and args ids integers, as Kineto writes them; a string there (`"ts":
"12.5"`, `"device": "0"`) is refused, not read as a number (lane names in `tid`/`pid`, such as
old traces' "stream 7", are read for their trailing integer).

Two readers: `load_trace` parses the whole document with orjson (fast; memory about 10x the
JSON size) and fills the columns one field at a time for all events; with `streaming=True`
(automatic above `STREAM_ABOVE_BYTES` on disk) it iterates `traceEvents` items with ijson (C
backend when available) and never holds the whole document. A gzip file inflating past
`STREAM_ABOVE_BYTES` is streamed too, and past `MAX_TRACE_BYTES` refused (a gzip bomb). Both
pause Python's cyclic garbage collector while they read (a parsed trace holds no reference
cycles; the collector's repeated scans of the growing document cost more than the parse
itself) and restore it afterwards.
Every way a file can be unreadable raises `TraceError` with one sentence saying what is wrong
and what to do.
"""
from __future__ import annotations

import gzip
import json
import os
import re
import zlib
from array import array
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, Union

import numpy as np
import orjson

from ..nogc import gc_paused

PathLike = Union[str, "os.PathLike[str]"]

GPU_ACTIVITY_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GPU_LANE_CATS = GPU_ACTIVITY_CATS + ("gpu_user_annotation", "cuda_sync")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")
# Older Kineto spellings, normalised to the current ones.
_CAT_ALIASES = {"memcpy": "gpu_memcpy", "memset": "gpu_memset", "runtime": "cuda_runtime",
                "driver": "cuda_driver", "operator": "cpu_op"}
CONSECUTIVE_KERNEL_DELAY_US = 30.0     # HTA's kernel-wait threshold (bubbles.py; the CLI's default)
DEFAULT_WINDOW_US = 10_000.0          # step windows of a trace without step spans (bubbles.py)
WARMUP_STEPS = 1    # leading steps bubbles.analyze_run leaves out when there are more than 2
MAX_ABS_US = 2.0 ** 63 / 1e3          # |ts|, dur beyond this are not times (int64 ns overflow)
STREAM_ABOVE_BYTES = 1 << 30          # plain JSON larger than this is streamed by default
STREAM_ABOVE_GZ_BYTES = 128 << 20      # gzip files larger than this are streamed by default
# A gzip file is decompressed whole up to STREAM_ABOVE_BYTES (beyond it, the automatic reader
# streams it; an explicit whole read refuses it), and never beyond MAX_TRACE_BYTES: no trace
# is that large, so a small file expanding past it is corrupt or a gzip bomb.
MAX_TRACE_BYTES = 64 << 30
_GZIP_MAGIC = b"\x1f\x8b"
_TRAILING_INT = re.compile(r"(-?\d+)\s*$")


class TraceError(ValueError):
    """A trace file cannot be used; the message is one sentence: what is wrong and what to do."""


@dataclass(frozen=True)
class Trace:
    """Columnar complete events of one trace (one row per `ph: "X"` event, in file order)."""

    path: str
    ts: np.ndarray            # float64 µs
    dur: np.ndarray           # float64 µs (missing → 0)
    cat: np.ndarray           # int32 codes into `cats`
    name: np.ndarray          # int32 codes into `names`
    pid: np.ndarray           # int64
    tid: np.ndarray           # int64
    stream: np.ndarray        # int64, -1 off the GPU lanes
    device: np.ndarray        # int64, -1 off the GPU lanes
    correlation: np.ndarray   # int64, -1 when absent
    external_id: np.ndarray   # int64, -1 when absent
    cats: tuple[str, ...]
    names: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)  # top-level keys except traceEvents

    def __len__(self) -> int:
        return int(self.ts.shape[0])

    @property
    def end(self) -> np.ndarray:
        """ts + dur, float64 µs."""
        return self.ts + self.dur

    def cat_mask(self, *cats: str) -> np.ndarray:
        """Boolean mask of events whose category is one of `cats`."""
        codes = [i for i, c in enumerate(self.cats) if c in cats]
        return np.isin(self.cat, codes)

    def name_mask(self, predicate) -> np.ndarray:
        """Boolean mask of events whose name satisfies `predicate(name) -> bool`."""
        codes = [i for i, n in enumerate(self.names) if predicate(n)]
        return np.isin(self.name, codes)

    def name_of(self, i: int) -> str:
        return self.names[int(self.name[i])]


def load_trace(path: PathLike, *, streaming: bool | None = None) -> Trace:
    """Load a Kineto trace (`.json` / `.json.gz`) into a `Trace`.

    `streaming=None` streams files above `STREAM_ABOVE_BYTES` (`STREAM_ABOVE_GZ_BYTES` for gzip);
    the streaming reader leaves `metadata` empty. Raises `TraceError` on any unusable file.
    """
    p = _check_file(path)
    gz = _is_gzip(p)
    explicit = streaming is not None
    if streaming is None:
        streaming = p.stat().st_size > (STREAM_ABOVE_GZ_BYTES if gz else STREAM_ABOVE_BYTES)
    # The parse allocates one dict per event and no reference cycles: the cyclic GC would only
    # rescan the growing document again and again (most of the parse time), so it is
    # paused while the document exists.
    with gc_paused():
        if streaming:
            return _build(p, iter_events(p), {})
        try:
            doc = _parse_whole(p, gz)
        except _TooLarge:
            if explicit:
                raise TraceError(f"{p} decompresses to more than {_gib(STREAM_ABOVE_BYTES)}, "
                                 "beyond what the whole-document reader holds; read it with "
                                 "streaming=True.") from None
            return _build(p, iter_events(p), {})
        if isinstance(doc, dict):
            events = doc.get("traceEvents")
            if not isinstance(events, list):
                raise TraceError(f"{p} is JSON but not a Kineto/Chrome trace (no 'traceEvents' "
                                 "list); pass a file written by torch.profiler's "
                                 "export_chrome_trace.")
            meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        elif isinstance(doc, list):  # Chrome "JSON Array Format"
            events, meta = doc, {}
        else:
            raise TraceError(f"{p} is JSON but not a Kineto/Chrome trace (top level is "
                             f"{type(doc).__name__}); pass a file written by torch.profiler.")
        del doc
        try:
            return _build(p, events, meta)
        finally:
            del events  # free the document before the GC runs again


def iter_events(path: PathLike) -> Iterator[dict]:
    """Yield the items of `traceEvents` one at a time without loading the whole document.

    Uses ijson (its C backend `yajl2_c` when installed); without ijson it falls back to parsing
    the whole file with orjson. Raises `TraceError` on corrupt or truncated input.
    """
    p = _check_file(path)
    gz = _is_gzip(p)
    try:
        import ijson
    except ImportError:
        try:
            doc = _parse_whole(p, gz)
        except _TooLarge:
            raise TraceError(f"{p} decompresses to more than {_gib(STREAM_ABOVE_BYTES)}, and "
                             "reading it in a stream needs the ijson package; pip install "
                             "ijson.") from None
        events = doc.get("traceEvents") if isinstance(doc, dict) else doc
        yield from events if isinstance(events, list) else ()
        return
    try:
        with (_BoundedGzip(p) if gz else open(p, "rb")) as f:
            yield from ijson.items(f, "traceEvents.item", use_float=True)
    except (ijson.JSONError, ijson.IncompleteJSONError) as e:
        if "integer overflow" in str(e):     # yajl parses integers as int64
            raise TraceError(f"{p} holds an integer beyond int64 (a stream, device, pid, tid, "
                             "correlation or External id); the file is corrupt, re-export the "
                             "trace.") from None
        raise TraceError(f"{p} is not valid JSON (corrupt or truncated: {_short(e)}); "
                         "re-export the trace from the profiler.") from None
    except (EOFError, OSError, zlib.error) as e:
        raise TraceError(f"{p} is not a readable gzip stream (corrupt or truncated: {_short(e)}); "
                         "re-export the trace from the profiler.") from None


# --------------------------------------------------------------------------- internals

class _TooLarge(Exception):
    """A gzip trace decompresses beyond STREAM_ABOVE_BYTES (the whole-document reader's bound)."""


def _gib(n: int) -> str:
    return f"{n / (1 << 30):g} GiB"


class _BoundedGzip(gzip.GzipFile):
    """A gzip file read in a stream that refuses to decompress beyond MAX_TRACE_BYTES."""

    def __init__(self, p: Path):
        super().__init__(p, "rb")
        self._path, self._out = p, 0

    def read(self, size=-1):
        data = super().read(size)
        self._out += len(data)
        if self._out > MAX_TRACE_BYTES:
            raise TraceError(f"{self._path} decompresses to more than "
                             f"{_gib(MAX_TRACE_BYTES)} (MAX_TRACE_BYTES); no trace is that "
                             "large: the file is corrupt or a gzip bomb, re-export the trace.")
        return data


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return s[:120]


def _check_file(path: PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p} does not exist; pass the path of a .json or .json.gz trace.")
    if not p.is_file():
        raise TraceError(f"{p} is not a file; pass the path of a .json or .json.gz trace.")
    if p.stat().st_size == 0:
        raise TraceError(f"{p} is empty (0 bytes); the profiler did not finish writing it, "
                         "re-export the trace.")
    return p


def _is_gzip(p: Path) -> bool:
    with open(p, "rb") as f:
        return f.read(2) == _GZIP_MAGIC


def _parse_whole(p: Path, gz: bool) -> Any:
    if gz:
        try:
            with gzip.open(p, "rb") as f:      # at most one byte past the bound in memory
                raw = f.read(STREAM_ABOVE_BYTES + 1)
        except (EOFError, OSError, zlib.error) as e:
            raise TraceError(f"{p} is not a readable gzip file (corrupt or truncated: "
                             f"{_short(e)}); re-export the trace from the profiler.") from None
        if not raw:
            raise TraceError(f"{p} decompresses to nothing; re-export the trace.")
        if len(raw) > STREAM_ABOVE_BYTES:
            raise _TooLarge
    else:
        raw = p.read_bytes()
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        pos = e.pos
    try:  # the stdlib also accepts NaN / Infinity, which some exporters write
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise TraceError(f"{p} is not valid JSON (corrupt or truncated near byte {pos}); "
                         "re-export the trace from the profiler.") from None


def _as_int(v: Any) -> int:
    """Kineto ids are ints; old traces spell lanes like "stream 7"; anything else is -1."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        m = _TRAILING_INT.search(v)
        if m:
            return int(m.group(1))
    return -1


def _as_float(v: Any, what: str, idx: int, p: Path) -> float:
    """A time as Kineto writes it: a JSON number (a string, even "12.5", is refused: a trace
    whose times are text was not written by a profiler)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    kind = "a string" if isinstance(v, str) else f"{type(v).__name__}"
    raise TraceError(f"{p} event #{idx} has a {what} that is {kind}, not a number ({v!r}); the "
                     "file is not a well-formed Kineto trace, re-export it.")


def _arg_id(v: Any, what: str, idx: int, p: Path) -> int:
    """An id in an event's args (stream, device, correlation, External id): Kineto writes
    integers; absent (None) is -1, anything else (a string, a bool, 1.5) is refused."""
    if v is None:
        return -1
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise TraceError(f"{p} event #{idx} has args.{what} = {v!r} ({type(v).__name__}), not an "
                     "integer id; the file is not a well-formed Kineto trace, re-export it.")


class _NotSimple(Exception):
    """The vectorised reader met something only the per-event reader handles (or reports)."""


_EMPTY: dict = {}
_INT = frozenset({int})
_NUM = frozenset({int, float})


def _ints(vals: Sequence[Any]) -> np.ndarray:
    """int64 column of `vals`, each as `_as_int` reads it (fast when all are plain ints)."""
    if set(map(type, vals)) <= _INT:
        try:
            return np.fromiter(vals, dtype=np.int64, count=len(vals))
        except OverflowError:
            pass
    return np.array([_as_int(v) for v in vals], dtype=np.int64)


def _ids(vals: Sequence[Any]) -> np.ndarray:
    """int64 column of args ids, plain ints only; anything else goes to the per-event reader
    (which reads integral floats and refuses the rest)."""
    if not set(map(type, vals)) <= _INT:
        raise _NotSimple
    return np.fromiter(vals, dtype=np.int64, count=len(vals))


def _floats(vals: Sequence[Any]) -> np.ndarray:
    """float64 column of plain numbers; anything else goes to the per-event reader."""
    if not set(map(type, vals)) <= _NUM:
        raise _NotSimple
    return np.fromiter(vals, dtype=np.float64, count=len(vals))


def _build(p: Path, events: Iterable[Any], meta: dict[str, Any]) -> Trace:
    """Columns of the complete events; column-wise for a parsed list, else one event at a time.

    Both readers give identical results; the column-wise one hands every unusual input
    (non-object items, non-numeric times, non-string names or categories, no timed events) to
    the per-event reader, which decodes it or raises its `TraceError`.
    """
    if isinstance(events, list):
        try:
            return _check_times(_build_columns(p, events, meta))
        except (_NotSimple, OverflowError):  # e.g. an id beyond int64: the loop reports it
            pass
    return _check_times(_build_loop(p, events, meta))


def _check_times(tr: Trace) -> Trace:
    """Every ts and dur is a finite time within ±MAX_ABS_US, and no dur is negative (NaN,
    infinities, absurd values and negative durations would silently corrupt every interval
    computed from them: a kernel that ends before it starts moves the bubble)."""
    bad = ~(np.abs(tr.ts) <= MAX_ABS_US) | ~(tr.dur <= MAX_ABS_US)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise TraceError(f"{tr.path} has {int(bad.sum())} events whose time is NaN, infinite or "
                         f"beyond {MAX_ABS_US:.3g} µs (first: {tr.name_of(i)!r}, ts={tr.ts[i]!r}, "
                         f"dur={tr.dur[i]!r}); the file is corrupt, re-export the trace.")
    neg = tr.dur < 0
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise TraceError(f"{tr.path} has {int(neg.sum())} events with a negative duration "
                         f"(first: {tr.name_of(i)!r}, ts={float(tr.ts[i])!r}, "
                         f"dur={float(tr.dur[i])!r}); the file is corrupt, re-export the trace.")
    return tr


def _build_columns(p: Path, events: list, meta: dict[str, Any]) -> Trace:
    # One pass over the events (each dict is touched once, while it is in cache), then columns.
    # Exact "Trace" spans are skipped here; other spellings of that category are dropped below.
    try:
        rows = [(e.get("cat", ""), e.get("name", ""), e.get("ts"), e.get("dur", 0.0),
                 e.get("pid"), e.get("tid"), (a := e.get("args")),
                 a.get("correlation", -1) if a.__class__ is dict else -1,
                 a.get("External id", -1) if a.__class__ is dict else -1)
                for e in events if e.get("ph") == "X" and e.get("cat") != "Trace"]
    except AttributeError:  # an item that is not an object
        raise _NotSimple from None
    if not rows:
        raise _NotSimple  # the per-event reader says why
    raw_cat, raw_name, ts, dur, pid, tid, args, corr, ext = zip(*rows)
    del rows
    try:
        first_cat = dict.fromkeys(raw_cat)  # distinct raw categories, in order of appearance
    except TypeError:  # unhashable
        raise _NotSimple from None
    if any(type(c) is not str for c in first_cat):
        raise _NotSimple
    norm = {c: _CAT_ALIASES.get(c.lower(), c.lower()) for c in first_cat}
    if "trace" in norm.values():  # Kineto's whole-session span spelled otherwise: drop it
        keep = [norm[c] != "trace" for c in raw_cat]
        raw_cat, raw_name, ts, dur, pid, tid, args, corr, ext = (
            list(compress(col, keep))
            for col in (raw_cat, raw_name, ts, dur, pid, tid, args, corr, ext))
        if not raw_cat:
            raise _NotSimple
        first_cat = dict.fromkeys(raw_cat)
    n = len(raw_cat)
    cat_codes: dict[str, int] = {}
    raw_code = {c: cat_codes.setdefault(norm[c], len(cat_codes)) for c in first_cat}
    cat = np.fromiter(map(raw_code.__getitem__, raw_cat), dtype=np.int32, count=n)
    try:
        name_codes = {k: i for i, k in enumerate(dict.fromkeys(raw_name))}
    except TypeError:
        raise _NotSimple from None
    if any(type(k) is not str for k in name_codes):
        raise _NotSimple
    name = np.fromiter(map(name_codes.__getitem__, raw_name), dtype=np.int32, count=n)
    ts = _floats(ts)
    if None in dur:
        dur = [0.0 if v is None else v for v in dur]
    dur = _floats(dur)
    pid, tid = _ints(pid), _ints(tid)
    if not set(map(type, args)) <= {dict}:  # missing / non-object args (or a dict subclass)
        args = [a if isinstance(a, dict) else _EMPTY for a in args]
        corr = [a.get("correlation", -1) for a in args]
        ext = [a.get("External id", -1) for a in args]
    corr, ext = _ids(corr), _ids(ext)
    lane = np.isin(cat, [code for c, code in cat_codes.items() if c in GPU_LANE_CATS])
    stream = np.full(n, -1, dtype=np.int64)
    device = np.full(n, -1, dtype=np.int64)
    if lane.any():
        lane_args = [args[i] for i in np.flatnonzero(lane).tolist()]
        for col, key, fallback in ((stream, "stream", tid), (device, "device", pid)):
            v = [a.get(key) for a in lane_args]
            missing = None
            if None in v:
                missing = np.fromiter((x is None for x in v), dtype=bool, count=len(v))
                v = [0 if x is None else x for x in v]
            vals = _ids(v)
            if missing is not None:
                vals[missing] = fallback[lane][missing]
            col[lane] = vals
    return Trace(
        path=str(p), ts=ts, dur=dur, cat=cat, name=name, pid=pid, tid=tid, stream=stream,
        device=device, correlation=corr, external_id=ext, cats=tuple(cat_codes),
        names=tuple(name_codes), metadata=meta)


def _build_loop(p: Path, events: Iterable[Any], meta: dict[str, Any]) -> Trace:
    # array.array columns: 8 bytes per value, so streaming a huge trace stays compact
    ts, dur = array("d"), array("d")
    cat, name = array("i"), array("i")
    pid, tid, stream, device, corr, ext = (array("q") for _ in range(6))
    cat_codes: dict[str, int] = {}
    name_codes: dict[str, int] = {}
    gpu_lane = set(GPU_LANE_CATS)
    n_seen = 0
    idx = -1
    try:
        for idx, e in enumerate(events):
            n_seen += 1
            if not isinstance(e, dict):
                raise TraceError(f"{p} traceEvents item #{idx} is not an object; the file is not a "
                                 "Kineto trace, pass one written by torch.profiler.")
            if e.get("ph") != "X":
                continue
            c = str(e.get("cat", "")).lower()
            c = _CAT_ALIASES.get(c, c)
            if c == "trace":
                continue
            args = e.get("args")
            if not isinstance(args, dict):
                args = {}
            ts.append(_as_float(e.get("ts"), "ts", idx, p))
            d = e.get("dur", 0.0)
            dur.append(_as_float(d, "dur", idx, p) if d is not None else 0.0)
            cat.append(cat_codes.setdefault(c, len(cat_codes)))
            n = e.get("name", "")
            name.append(name_codes.setdefault(n if isinstance(n, str) else str(n), len(name_codes)))
            pid.append(_as_int(e.get("pid")))
            tid.append(_as_int(e.get("tid")))
            if c in gpu_lane:
                s = args.get("stream")
                stream.append(_arg_id(s, "stream", idx, p) if s is not None else tid[-1])
                dv = args.get("device")
                device.append(_arg_id(dv, "device", idx, p) if dv is not None else pid[-1])
            else:
                stream.append(-1)
                device.append(-1)
            corr.append(_arg_id(args.get("correlation", -1), "correlation", idx, p))
            ext.append(_arg_id(args.get("External id", -1), "External id", idx, p))
    except OverflowError:  # array('q') refuses it
        raise TraceError(f"{p} event #{idx} holds an integer beyond int64 (a stream, device, "
                         "pid, tid, correlation or External id); the file is corrupt, re-export "
                         "the trace.") from None
    if not ts:
        what = ("no traceEvents at all" if n_seen == 0
                else f"{n_seen} traceEvents but no timed ('X') events")
        raise TraceError(f"{p} holds {what}; with a profiler schedule, export the trace from "
                         "on_trace_ready (exporting after the `with` block gives an empty trace).")
    col = np.frombuffer  # zero-copy views of the array.array columns
    return Trace(
        path=str(p), ts=col(ts, np.float64), dur=col(dur, np.float64), cat=col(cat, np.int32),
        name=col(name, np.int32), pid=col(pid, np.int64), tid=col(tid, np.int64),
        stream=col(stream, np.int64), device=col(device, np.int64),
        correlation=col(corr, np.int64), external_id=col(ext, np.int64),
        cats=tuple(cat_codes), names=tuple(name_codes), metadata=meta)
