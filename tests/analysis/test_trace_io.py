"""Trace loading: columns, exact timestamps, gzip, streaming, and one clear error per bad file."""
from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import orjson
import pytest

from mtplab.analysis.trace_io import TraceError, iter_events, load_trace
from test_bubbles import planted


@pytest.fixture(scope="module")
def synth_files(tmp_path_factory):
    s, _ = planted()
    d = tmp_path_factory.mktemp("io")
    return s, s.write(d / "a.pt.trace.json"), s.write(d / "a.pt.trace.json.gz", gz=True)


def _x_events(s):
    return [e for e in s.events if e["ph"] == "X" and e["cat"] != "Trace"]


def test_columns_exact_and_interned(synth_files):
    s, plain, _ = synth_files
    tr = load_trace(plain)
    xs = _x_events(s)
    assert len(tr) == len(xs)
    assert tr.ts.dtype == np.float64 and tr.dur.dtype == np.float64
    assert tr.ts.tolist() == [e["ts"] for e in xs]  # exact, ns fractions kept
    assert tr.dur.tolist() == [e["dur"] for e in xs]
    assert [tr.name_of(i) for i in range(len(tr))] == [e["name"] for e in xs]
    assert set(tr.cats) == {e["cat"] for e in xs}
    assert len(tr.names) < len(xs)  # interned
    k = tr.cat_mask("kernel")
    assert (tr.stream[k] >= 0).all() and (tr.device[k] == 0).all()
    assert (tr.stream[tr.cat_mask("cuda_runtime")] == -1).all()
    # the two graph-replayed kernels share their cudaGraphLaunch's correlation
    g = np.flatnonzero(tr.name_mask(lambda n: n.startswith("graph_k")))
    launch = np.flatnonzero(tr.name_mask(lambda n: n == "cudaGraphLaunch"))
    assert len(set(tr.correlation[g])) == 1 and tr.correlation[g][0] == tr.correlation[launch][0]
    assert tr.metadata["distributedInfo"]["rank"] == 0


def test_gzip_and_streaming_agree(synth_files):
    _, plain, gz = synth_files
    a = load_trace(plain)
    for other in (load_trace(gz), load_trace(gz, streaming=True),
                  load_trace(plain, streaming=True)):
        for col in ("ts", "dur", "pid", "tid", "stream", "device", "correlation"):
            assert np.array_equal(getattr(a, col), getattr(other, col)), col
        assert [a.name_of(i) for i in range(len(a))] == [other.name_of(i) for i in range(len(a))]
    assert sum(1 for _ in iter_events(gz)) == len(orjson.loads(plain.read_bytes())["traceEvents"])


def test_old_kineto_spellings(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 10, "dur": 5,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1,
         "dur": 2, "args": {"correlation": 3}},
        {"ph": "X", "cat": "Memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": "stream 9", "ts": 20,
         "dur": 1},
    ]}
    p = tmp_path / "old.json"
    p.write_bytes(orjson.dumps(doc))
    tr = load_trace(p)
    assert set(tr.cats) == {"kernel", "cuda_runtime", "gpu_memcpy"}
    assert tr.stream.tolist() == [7, -1, 9] and tr.device.tolist() == [0, -1, 0]


BAD = {
    "empty": b"",
    "truncated_json": b'{"traceEvents": [{"ph": "X", "ts": 1',
    "not_json": b"\x89PNG\r\n\x1a\n not a trace",
    "no_trace_events": b'{"schemaVersion": 1, "events": []}',
    "no_timed_events": b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}',
    "item_not_object": b'{"traceEvents": [1, 2, 3]}',
    "bad_ts": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", '
              b'"dur": 1}]}',
    "scalar": b"42",
    "string_ts": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "12.5", '
                 b'"dur": 1}]}',
    "string_device": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                     b'"tid": 7, "ts": 1, "dur": 1, "args": {"device": "0", "stream": 7}}]}',
    "string_stream": b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, '
                     b'"tid": 7, "ts": 1, "dur": 1, "args": {"device": 0, "stream": "7"}}]}',
    "string_correlation": b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "k", "pid": 0, '
                          b'"tid": 7, "ts": 1, "dur": 1, "args": {"correlation": "5"}}]}',
}


# streaming reads items only: a scalar document is not streamed
@pytest.mark.parametrize("kind,streaming", [(k, st) for k in sorted(BAD) for st in (False, True)
                                             if not (st and k == "scalar")])
def test_bad_files_raise_one_clear_trace_error(tmp_path, kind, streaming):
    p = tmp_path / f"{kind}.json"
    p.write_bytes(BAD[kind])
    with pytest.raises(TraceError) as ei:
        load_trace(p, streaming=streaming)
    msg = str(ei.value)
    assert str(p) in msg and "\n" not in msg and msg.endswith(".")


@pytest.mark.parametrize("streaming", [False, True])
def test_bad_gzip(tmp_path, synth_files, streaming):
    _, _, gz = synth_files
    data = gz.read_bytes()
    cases = {"truncated.json.gz": data[: len(data) // 2],
             "corrupt.json.gz": data[:10] + bytes(200) + data[210:],
             "hollow.json.gz": gzip.compress(b"")}
    for name, raw in cases.items():
        p = tmp_path / name
        p.write_bytes(raw)
        with pytest.raises(TraceError, match="re-export|export"):
            load_trace(p, streaming=streaming)


def test_missing_file(tmp_path):
    with pytest.raises(TraceError, match="does not exist"):
        load_trace(tmp_path / "nope.json")
    with pytest.raises(TraceError, match="not a file"):
        load_trace(tmp_path)


def test_nan_literals_accepted(tmp_path):
    p = tmp_path / "nan.json"
    p.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1,'
                  b' "ts": 1.5, "dur": 2, "args": {"x": NaN}}]}')
    assert load_trace(p).ts.tolist() == [1.5]


def _one_kernel(ts, dur=b"2.0", stream=b"7", corr=b"5"):
    return (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, '
            b'"ts": ' + ts + b', "dur": ' + dur + b', "args": {"stream": ' + stream +
            b', "device": 0, "correlation": ' + corr + b'}}]}')


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("field", ["stream", "corr"])
def test_ids_beyond_int64_one_line_naming_the_trace(tmp_path, field, streaming):
    big = str(2 ** 64 + 3).encode()
    p = tmp_path / "big.json"
    p.write_bytes(_one_kernel(b"1.5", **{field: big}))
    with pytest.raises(TraceError) as e:
        load_trace(p, streaming=streaming)
    msg = str(e.value)
    assert str(p) in msg and "beyond int64" in msg and "\n" not in msg


@pytest.mark.parametrize("ts,dur", [(b"NaN", b"2"), (b"1e300", b"2"), (b"1.5", b"Infinity"),
                                    (b"-1e19", b"2"), (b"1.5", b"1e200")])
def test_nan_or_huge_times_one_line_naming_the_trace(tmp_path, ts, dur):
    p = tmp_path / "t.json"
    p.write_bytes(_one_kernel(ts, dur))
    with pytest.raises(TraceError) as e:
        load_trace(p)
    msg = str(e.value)
    assert str(p) in msg and "NaN, infinite or beyond" in msg and "\n" not in msg


@pytest.mark.parametrize("streaming", [False, True])
def test_a_negative_duration_is_refused_in_one_line(tmp_path, streaming):
    """A kernel that ends before it starts would move the bubble; it is not clamped to 0."""
    p = tmp_path / "neg.json"
    p.write_bytes(_one_kernel(b"1.5", b"-3"))
    with pytest.raises(TraceError) as e:
        load_trace(p, streaming=streaming)
    msg = str(e.value)
    assert str(p) in msg and "1 events with a negative duration" in msg and "\n" not in msg


def _bomb(tmp_path, payload: int) -> Path:
    """A valid trace padded with `payload` bytes of whitespace: tiny on disk, large inflated."""
    event = b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}'
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b'{"traceEvents": [' + event + b" " * payload + b"]}", 9))
    return p


def test_a_gzip_bomb_is_refused_naming_the_bound(tmp_path, monkeypatch):
    from mtplab.analysis import trace_io
    monkeypatch.setattr(trace_io, "STREAM_ABOVE_BYTES", 1 << 20)
    monkeypatch.setattr(trace_io, "MAX_TRACE_BYTES", 4 << 20)
    big = _bomb(tmp_path, 2 << 20)           # past the whole-read bound, within the stream's
    assert big.stat().st_size < 64 << 10
    assert len(load_trace(big)) == 1                            # automatic: streamed
    with pytest.raises(TraceError, match=r"decompresses to more than 0.000976562 GiB, beyond "
                                         r"what the whole-document reader holds"):
        load_trace(big, streaming=False)
    bomb = _bomb(tmp_path, 8 << 20)
    for streaming in (None, True):
        with pytest.raises(TraceError, match=r"decompresses to more than 0.00390625 GiB "
                                             r"\(MAX_TRACE_BYTES\).*gzip bomb"):
            load_trace(bomb, streaming=streaming)
