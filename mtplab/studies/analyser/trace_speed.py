"""Trace analyser speed: mtplab (`load_trace` + `analyze`) vs HTA (traceinsight) on one trace.
The runner of the study `analyser` (its `render` writes the report from what this measures).

Builds a deterministic (seeded) Kineto-shaped trace of a spec-decode serving loop in a temporary
folder — or takes one with `--trace` — then times, in one process, interleaved (A B A B ...),
the median of `--repeats` runs of each arm:

    mtplab          load_trace(path) + analyze(trace)      (orjson reader)
    mtplab stream   load_trace(path, streaming=True) + analyze   (ijson reader; --streaming)
    HTA             TraceAnalysis(trace_dir=...) + get_idle_time_breakdown(visualize=False)
    orjson only     orjson.loads(path.read_bytes()), with the cyclic GC paused (the parse floor,
                    as load_trace runs it) and with it on (as plain code runs it)

Both analysers report per-stream idle time with HTA's categories (host_wait / kernel_wait /
other). The second table compares the idle totals for the same streams: mtplab (exact float µs),
an independent exact sum of HTA's definition (`ts - previous end` per stream, no rounding), and
HTA (which rounds ts up and ends down, so every gap grows by up to 2 µs).

HTA is built with `include_last_profiler_step=True` so that it keeps the kernels of the last
ProfilerStep and both tools see the same kernels; its parse and its analysis are both timed.
HTA tags every event with its ProfilerStep by a loop over all ProfilerStep spans (cost
events x spans): with one span per engine step (`--profiler-step-every 1`, what mtplab's
ProfilerSession writes) that dominates; `--profiler-step-every 100` shows HTA's linear cost,
the conservative comparison. (HTA 0.6.1 with pandas 3 also fails outright when the correlation
ids fit int16 but the row count does not; the synthetic correlations start at 150000.)

    python -m benchmarks.bench_analyzer --profiler-step-every 100 --streaming   # 81 MB trace
    python -m benchmarks.bench_analyzer --steps 400 --repeats 3 --out /tmp/bench_analyzer.md
    python -m benchmarks.bench_analyzer --trace run/rank0.pt.trace.json
    python -m benchmarks.bench_analyzer --profiler-step-every 100 --streaming --out-dir docs/results

`--out-dir DIR` writes the dated report of question `analyser` and its results file (the
seconds of every repeat of every arm, the per-stream idle totals), rendered by
mtplab/studies/analyser `render`:

    DIR/analyser/<YYYY-MM-DD>_cpu_<commit>.{json,md}

The commit is MTP_GIT_COMMIT where set, else this checkout's HEAD; a tree with uncommitted
changes is refused before anything runs (a report names one commit). Without `--out-dir` the
tables are printed (and written to `--out`).

From process start (`--cli`): each arm is a fresh Python process, timed from its start to its
exit (interpreter start, imports, parse, analysis, output), interleaved, wall and CPU seconds:

    mtplab          python -m mtplab.cli analyze TRACE --json > /dev/null
    HTA             python -c "TraceAnalysis(...).get_idle_time_breakdown(...)"
target: HTA / mtplab >= 4x on a ~60 MB JSON real trace of a transformers program
(benchmarks/record_plain_trace.py records one on a GPU). Without one, `--replicate REAL.json[.gz]
--target-mb 60` builds one by replicating a real trace's events end to end (time, correlation,
External id and flow ids shifted per copy); the output says so.

    python -m benchmarks.bench_analyzer --cli --trace plain.pt.trace.json --repeats 5
    python -m benchmarks.bench_analyzer --cli \\
        --replicate tests/data/gpu_frozen_overlap.pt.trace.json.gz
"""
from __future__ import annotations

import argparse
import gc
import logging
import os
import platform
import random
import shlex
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import orjson

from mtplab.analysis.bubbles import analyze
from mtplab.analysis.trace_io import load_trace

from .. import analyser as S
from .. import reports as R

BASE_US = 4463232744698.193   # a real Kineto-sized µs origin with a sub-µs fraction
HOST_PID = 3812
SCHED_TID = 3812
PIN_TID = 3907                # a second host thread (pin-memory / sampler work)
DEV = 0
S_MAIN, S_DRAFT, S_COPY = 7, 20, 24

_GEMM = ("void cutlass::Kernel2<"
         "cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>"
         "(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8::Params)")
_KERNELS = (
    _GEMM,
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_"
     "execute_segment_k_off_kernel__5x_cublas"),
    ("void at::native::vectorized_elementwise_kernel<4, "
     "at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >"
     "(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
     "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
     "at::native::ArgMaxOps<c10::BFloat16>, unsigned int, long, 4> >"
     "(at::native::ReduceOp<c10::BFloat16, "
     "at::native::ArgMaxOps<c10::BFloat16>, unsigned int, long, 4>)"),
    ("void at::native::unrolled_elementwise_kernel<"
     "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
     "::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const"
     "::{lambda(c10::BFloat16)#1}, "
     "at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, "
     "TrivialOffsetCalculator<1, "
     "unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >"),
    "_fwd_kernel_tree_attention_0d1d2d3d4d5d6d7d8d9d10d11d12d13d14d15",
    "triton_poi_fused_add_mul_rsqrt_pow_mean_0",
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
     "at::native::index_kernel_impl<at::native::OpaqueType<2> >(at::TensorIteratorBase&, "
     "c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, char const*, long)#1}>>"),
)
_OPS = (("aten::linear", "aten::addmm"), ("aten::add", None), ("aten::softmax", "aten::_softmax"),
        ("aten::argmax", None), ("aten::copy_", None), ("aten::index", None),
        ("aten::mul", None), ("aten::rsqrt", None))
_SHAPES = ([[8, 256], [256, 256], [256]], [[8, 256], [8, 256], []], [[8, 4, 32000], [], []],
           [[8, 32000], [], []], [[8, 1], [8, 1], []])


class TraceBuilder:
    """A seeded Kineto trace of a spec-decode loop: ~180 events, ~54 KB of JSON per engine step."""

    def __init__(self, seed: int = 0, profiler_step_every: int = 1):
        self.rng = random.Random(seed)
        self.every = profiler_step_every
        self.ev: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0,
             "args": {"name": "python3"}},
            {"ph": "M", "name": "process_name", "pid": DEV, "tid": 0, "args": {"name": "python3"}},
            {"ph": "M", "name": "process_labels", "pid": DEV, "tid": 0,
             "args": {"labels": "GPU 0"}},
            *({"ph": "M", "name": "thread_name", "pid": DEV, "tid": s,
               "args": {"name": f"stream {s}"}}
              for s in (S_MAIN, S_DRAFT, S_COPY)),
            {"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": SCHED_TID,
             "args": {"name": "thread 3812 (python3)"}},
        ]
        # > int16: HTA (pandas 3) fails when correlations fit int16 but rows do not
        self.corr = 150_000
        self.ext = 500
        self.ev_idx = 0
        self.free = {S_MAIN: 0.0, S_DRAFT: 0.0, S_COPY: 0.0}  # when each stream is next free
        self.t_end = 0.0

    # -- primitives (x: µs since BASE_US) -----------------------------------------------------
    @staticmethod
    def _t(x: float) -> float:
        return round(BASE_US + x, 3)

    def _x(self, cat: str, name: str, x: float, dur: float, pid: int, tid: int, args: dict) -> dict:
        e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self._t(x),
             "dur": round(dur, 3), "args": args}
        self.ev.append(e)
        return e

    def span(self, name: str, x: float, dur: float, tid: int = SCHED_TID) -> None:
        self.ext += 1
        self.ev_idx += 1
        self._x("user_annotation", name, x, dur, HOST_PID, tid,
                {"External id": self.ext, "Record function id": 0, "Ev Idx": self.ev_idx})

    def cpu_op(self, name: str, x: float, dur: float, tid: int = SCHED_TID) -> int:
        self.ext += 1
        self.ev_idx += 1
        dims = self.rng.choice(_SHAPES)
        self._x("cpu_op", name, x, dur, HOST_PID, tid, {
            "External id": self.ext, "Record function id": 0, "Sequence number": self.ev_idx,
            "Fwd thread id": 0, "Ev Idx": self.ev_idx, "Input Dims": dims,
            "Input type": ["c10::BFloat16" if d else "Scalar" for d in dims],
            "Input Strides": [[d[-1], 1] if len(d) == 2 else [] for d in dims],
            "Concrete Inputs": ["" for _ in dims]})
        return self.ext

    def runtime(self, name: str, x: float, dur: float, ext: int, correlated: bool = True) -> int:
        args = {"External id": ext, "cbid": 211 if name == "cudaLaunchKernel" else 311}
        if correlated:
            self.corr += 1
            args["correlation"] = self.corr
        self._x("cuda_runtime", name, x, dur, HOST_PID, SCHED_TID, args)
        return self.corr

    def gpu(self, corr: int, ext: int, launch_x: float, dur: float, stream: int,
            cat: str = "kernel", name: str | None = None, not_before: float = 0.0,
            flow: bool = True) -> tuple[float, float]:
        """Place one activity on `stream` after its launch (+ driver latency).

        Returns (start, end)."""
        r = self.rng
        gap = r.choice((0.6, 0.9, 1.3, 2.2)) if r.random() < 0.85 else r.uniform(3.0, 60.0)
        x = max(launch_x + r.uniform(4.0, 9.0), self.free[stream] + gap, not_before)
        x = round(x, 3)
        args = {"External id": ext, "queued": 0, "device": DEV, "context": 1, "stream": stream,
                "correlation": corr}
        if cat == "kernel":
            args.update({"registers per thread": r.choice((32, 64, 128)), "shared memory": 0,
                         "blocks per SM": 0.5, "warps per SM": 2.0,
                         "grid": [r.choice((8, 32, 132)), 1, 1],
                         "block": [128, 1, 1], "est. achieved occupancy %": 6})
            name = name or r.choice(_KERNELS)
        else:
            args.update({"bytes": 256, "memory bandwidth (GB/s)": 0.9})
        self._x(cat, name, x, dur, DEV, stream, args)
        if flow:
            self.ev.append({"ph": "s", "id": corr, "pid": HOST_PID, "tid": SCHED_TID,
                            "ts": self._t(launch_x), "cat": "ac2g", "name": "ac2g"})
            self.ev.append({"ph": "f", "id": corr, "pid": DEV, "tid": stream, "ts": self._t(x),
                            "cat": "ac2g", "name": "ac2g", "bp": "e"})
        self.free[stream] = x + dur
        return x, x + dur

    def gpu_ann(self, name: str, stream: int, lo: float, hi: float) -> None:
        self.ext += 1
        self._x("gpu_user_annotation", name, lo, hi - lo, DEV, stream, {"External id": self.ext})

    def eager(self, stage: str, x: float, n: int, stream: int, not_before: float = 0.0) -> float:
        """Host `stage` span with n eager ops (cpu_op > launch > kernel); returns host end."""
        r, x0, lo, hi = self.rng, x, np.inf, -np.inf
        for i in range(n):
            op, inner = r.choice(_OPS)
            d_launch = r.uniform(3.0, 6.0)
            d_op = d_launch + r.uniform(4.0, 12.0)
            ext = self.cpu_op(op, x, d_op)
            if inner:
                self.cpu_op(inner, x + 1.0, d_op - 2.0)
            lx = x + d_op - d_launch - 0.5
            c = self.runtime("cudaLaunchKernel", lx, d_launch, ext)
            s, e = self.gpu(c, ext, lx, r.uniform(2.0, 25.0), stream,
                            not_before=not_before if i == 0 else 0.0)
            lo, hi = min(lo, s), max(hi, e)
            x += d_op + r.uniform(0.5, 3.0)
        self.span(stage, x0 - 0.5, x - x0 + 1.0)
        self.gpu_ann(stage, stream, lo, hi)
        return x

    # -- one engine iteration -----------------------------------------------------------------
    def step(self, k: int, x: float, bs: int = 8) -> float:
        r = self.rng
        prefill = k % 97 == 0
        kind = "prefill" if prefill else "decode"
        x0 = x
        # schedule + prepare (host only), an HtoD copy of the batch inputs
        xs = x + 2.0
        for op in ("aten::empty", "aten::zeros", "aten::copy_"):
            d = r.uniform(2.0, 9.0)
            self.cpu_op(op, xs, d)
            xs += d + 1.0
        self.span("schedule", x + 1.0, xs - x)
        xp = xs + 1.0
        for _ in range(2):
            ext = self.cpu_op("aten::to", xp, 14.0)
            self.cpu_op("aten::copy_", xp + 1.0, 12.0)
            c = self.runtime("cudaMemcpyAsync", xp + 3.0, 8.0, ext)
            self.gpu(c, ext, xp + 3.0, r.uniform(1.0, 3.0), S_MAIN, cat="gpu_memcpy",
                     name="Memcpy HtoD (Pinned -> Device)")
            xp += 16.0
        self.span("prepare", xs + 0.5, xp - xs)
        # draft: eager on the draft stream, after the main stream's previous verify
        xd = self.eager("draft", xp + 1.0, 4 if prefill else 12, S_DRAFT,
                        not_before=self.free[S_MAIN])
        # verify: one CUDA graph replay on the main stream (kernels share the correlation)
        ext = self.cpu_op("CUDAGraph::replay", xd + 1.0, 14.0)
        c = self.runtime("cudaGraphLaunch", xd + 3.0, 10.0, ext)
        lo = None
        for i in range(20 if prefill else 40):
            s, e = self.gpu(c, ext, xd + 3.0, r.uniform(3.0, 40.0 if prefill else 12.0), S_MAIN,
                            not_before=self.free[S_DRAFT] if i == 0 else 0.0, flow=i == 0)
            lo = s if lo is None else lo
        self.span("verify", xd + 0.5, 16.0)
        self.gpu_ann("verify", S_MAIN, lo, e)
        # accept: eager on the main stream
        xa = self.eager("accept", xd + 18.0, 6, S_MAIN)
        # d2h: event wait + async copy of the accepted tokens on the copy stream
        ext = self.cpu_op("aten::copy_", xa + 1.0, 12.0)
        self.runtime("cudaEventRecord", xa + 2.0, 2.0, ext, correlated=False)
        self.runtime("cudaStreamWaitEvent", xa + 5.0, 2.0, ext, correlated=False)
        c = self.runtime("cudaMemcpyAsync", xa + 8.0, 4.0, ext)
        s, e = self.gpu(c, ext, xa + 8.0, r.uniform(1.5, 3.0), S_COPY, cat="gpu_memcpy",
                        name="Memcpy DtoH (Device -> Pinned)", not_before=self.free[S_MAIN])
        self.span("d2h", xa + 0.5, 13.0)
        self.gpu_ann("d2h", S_COPY, s, e)
        # process_result: .item() blocks in cudaStreamSynchronize until the copy lands
        xr = xa + 15.0
        ext = self.cpu_op("aten::item", xr, max(e, xr + 8.0) - xr + 6.0)
        self.cpu_op("aten::_local_scalar_dense", xr + 1.0, max(e, xr + 8.0) - xr + 4.0)
        self.runtime("cudaStreamSynchronize", xr + 2.0, max(e, xr + 8.0) - xr, ext,
                     correlated=False)
        xq = max(e, xr + 8.0) + 8.0
        for op in ("aten::tolist", "aten::slice", "aten::cat"):
            d = r.uniform(3.0, 15.0)
            self.cpu_op(op, xq, d)
            xq += d + 1.0
        if r.random() < 0.05:  # an occasional long host stall (Python GC, logging, ...)
            xq += r.uniform(200.0, 1500.0)
        self.span("process_result", xr - 0.5, xq - xr + 1.0)
        if k % 4 == 0:  # the pin-memory thread copies logits now and then
            self.cpu_op("aten::pin_memory", x0 + 10.0, 30.0, tid=PIN_TID)
        self.span(f"step[{kind} bs={bs}]", x0 + 1.0, xq - x0)
        return xq + 3.0

    def build(self, steps: int) -> dict:
        x = 50.0
        for k in range(steps):
            if k % self.every == 0:
                x_group = x
            x = self.step(k, x)
            if k % self.every == self.every - 1 or k == steps - 1:  # torch.profiler's step span
                self.span(f"ProfilerStep#{k // self.every}", x_group - 1.0, x - x_group)
        self.ev.insert(0, {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)",
                           "pid": "Spans", "tid": "PyTorch Profiler", "ts": self._t(0.0),
                           "dur": round(x + 1000.0, 3), "args": {"Op count": 0}})
        return {"schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                                      "totalGlobalMem": 85045477376, "computeMajor": 9,
                                      "computeMinor": 0, "numSms": 132}],
                "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
                "cuda_runtime_version": 12080, "with_flops": False, "record_shapes": True,
                "with_stack": False, "profile_memory": False, "with_modules": False,
                "trace_id": "0A1B2C3D4E5F", "displayTimeUnit": "ms",
                "baseTimeNanoseconds": 1700000000000000000,
                "traceEvents": self.ev}


def write_trace(folder: Path, steps: int, seed: int, profiler_step_every: int = 1) -> Path:
    doc = TraceBuilder(seed, profiler_step_every).build(steps)
    path = folder / "rank0.pt.trace.json"
    # one line, like orjson writers; Kineto writes one event a line
    path.write_bytes(orjson.dumps(doc))
    return path


# --------------------------------------------------------------------------- timing arms

def replicate_trace(src: Path, folder: Path, target_mb: float) -> tuple[Path, int]:
    """A ~target_mb JSON trace made of copies of a real trace laid end to end: every copy's
    timestamps move by the trace's span (+1 ms), its correlation / External id / flow ids by
    a constant beyond the original's range. Returns (path, copies)."""
    import gzip
    raw = src.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    ev = doc["traceEvents"]
    timed = [e for e in ev if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in timed)
    span = max(e["ts"] + (e.get("dur") or 0) for e in timed) - t0 + 1000.0
    one = len(orjson.dumps(ev)) / 1e6
    copies = max(1, round(target_mb / one))
    out = [e for e in ev if e.get("ph") == "M" or e.get("cat") == "Trace"]
    body = [e for e in timed if e.get("cat") != "Trace"]
    for k in range(copies):
        for e in body:
            c = dict(e, ts=e["ts"] + k * span)
            if "id" in c and isinstance(c["id"], int):
                c["id"] += k * 10_000_000
            a = c.get("args")
            if isinstance(a, dict) and ("correlation" in a or "External id" in a):
                a = dict(a)
                for key in ("correlation", "External id"):
                    if isinstance(a.get(key), int):
                        a[key] += k * 10_000_000
                c["args"] = a
            out.append(c)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    meta.setdefault("distributedInfo", {"rank": 0, "world_size": 1})   # HTA reads the rank
    path = folder / "rank0.pt.trace.json"
    path.write_bytes(orjson.dumps({**meta, "traceEvents": out}))
    return path, copies


_HTA_CLI = ("import logging, warnings; logging.disable(logging.WARNING); "
            "warnings.filterwarnings('ignore'); import sys; "
            "from hta.trace_analysis import TraceAnalysis; "
            "TraceAnalysis(trace_dir=sys.argv[1], include_last_profiler_step=True)"
            ".get_idle_time_breakdown(visualize=False, consecutive_kernel_delay=30)")


def _process_time(cmd: list) -> tuple[float, float]:
    """(wall s, CPU s) of one child process from its start to its exit."""
    import resource
    import subprocess
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise RuntimeError(f"{cmd[:4]} failed: {r.stderr.decode()[-400:]}")
    return wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def from_process_start(path: Path, folder: Path, repeats: int) -> tuple[dict, dict, float]:
    """mtplab analyze --json vs HTA, each a fresh process, interleaved: (wall s per arm, CPU s
    per arm, each repeat in run order; the import time of mtplab.analysis.cli in s)."""
    import subprocess
    env_py = sys.executable
    arms = {S.CLI_MTPLAB: [env_py, "-m", "mtplab.cli", "analyze", str(path), "--json"],
            S.HTA: [env_py, "-c", _HTA_CLI, str(folder)]}
    imp = [env_py, "-X", "importtime", "-c", "import mtplab.analysis.cli"]
    wall, cpu = {k: [] for k in arms}, {k: [] for k in arms}
    for cmd in arms.values():            # warm-up: page cache, bytecode
        _process_time(cmd)
    for _ in range(repeats):
        for k, cmd in arms.items():
            w, c = _process_time(cmd)
            wall[k].append(w)
            cpu[k].append(c)
    it = subprocess.run(imp, capture_output=True, text=True).stderr.strip().splitlines()
    import_s = int(it[-1].split("|")[1]) / 1e6 if it else float("nan")
    return wall, cpu, import_s


def run_mtplab(path: Path, streaming: bool = False):
    return analyze(load_trace(path, streaming=streaming))


def run_hta(folder: Path):
    from hta.trace_analysis import TraceAnalysis
    ta = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
    df, _ = ta.get_idle_time_breakdown(visualize=False, consecutive_kernel_delay=30)
    return df


def run_orjson(path: Path):
    return orjson.loads(path.read_bytes())


def run_orjson_gc_paused(path: Path):
    gc.disable()
    try:
        doc = orjson.loads(path.read_bytes())
        del doc  # freed inside the pause, as load_trace does
    finally:
        gc.enable()


def exact_hta_definition(path: Path) -> dict[int, float]:
    """HTA's per-stream idle (sum of `ts - previous end`, kernels+memcpy+memset), unrounded."""
    tr = load_trace(path)
    act = tr.cat_mask("kernel", "gpu_memcpy", "gpu_memset")
    out = {}
    for sid in np.unique(tr.stream[act]).tolist():
        sel = np.flatnonzero(act & (tr.stream == sid))
        sel = sel[np.argsort(tr.ts[sel], kind="stable")]
        out[int(sid)] = float(np.sum(tr.ts[sel][1:] - tr.end[sel][:-1]))
    return out


def _quiet_hta() -> None:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_analyzer",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=None,
                    help="time this trace (.json; needs distributedInfo.rank for HTA) instead of "
                         "the synthetic one")
    ap.add_argument("--steps", type=int, default=1500,
                    help="engine steps in the synthetic trace "
                         "(~180 events, ~54 KB each; 1500 -> 81 MB)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profiler-step-every", type=int, default=1, metavar="K",
                    help="one ProfilerStep#N span per K engine steps (default 1: one per step, as "
                         "mtplab's ProfilerSession writes; HTA's iteration tagging costs "
                         "O(events x ProfilerSteps), so K=100 shows its linear cost)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per arm (median reported)")
    ap.add_argument("--streaming", action="store_true", help="also time mtplab's ijson reader")
    ap.add_argument("--no-hta", action="store_true", help="time mtplab only")
    ap.add_argument("--out", default=None, help="also write the markdown tables here (atomically)")
    ap.add_argument("--out-dir", default=None, metavar="DIR",
                    help="write the dated report of question `analyser` and its results into "
                         "DIR/analyser/ (docs/results: the repository's); refused before "
                         "anything runs in a tree with uncommitted changes")
    ap.add_argument("--cli", action="store_true",
                    help="time from process start: mtplab analyze --json vs HTA, fresh processes")
    ap.add_argument("--replicate", default=None, metavar="REAL",
                    help="with --cli and no --trace: replicate this real trace to --target-mb")
    ap.add_argument("--target-mb", type=float, default=60.0)
    ap.add_argument("--note", default="", help="a sentence the report carries above its answer")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.profiler_step_every < 1:
        ap.error("--repeats and --profiler-step-every must be >= 1")
    commit = None
    if a.out_dir is not None:
        commit = R.checkout_commit("bench_analyzer")      # refused before anything runs
        if commit is None:
            return 2
    _quiet_hta()
    tmp = Path(tempfile.mkdtemp(prefix="bench_analyzer_"))
    try:
        doc = (_cli_doc if a.cli else _in_process_doc)(a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc = S.results_doc(**doc, date=time.strftime("%Y-%m-%d"), device="cpu",
                        device_name=f"{_cpu_name()}, {os.cpu_count()} CPU cores",
                        commit=commit or PRINTED, software=_software(a),
                        command=shlex.join(["python", "-m", "benchmarks.bench_analyzer", *argv]),
                        note=a.note)
    table = S.tables(doc)
    print(table)
    if a.out:
        from mtplab.atomic import atomic_write_text
        atomic_write_text(a.out, table + "\n")
    if a.out_dir is not None:
        path = R.write(doc, S.render, Path(a.out_dir))
        print(f"wrote {path} and its results {path.with_suffix('.json').name}")
    return 0


PRINTED = "0000000"           # the commit of a results doc only printed, never written


def _software(a) -> str:
    out = f"Python {platform.python_version()}, numpy {np.__version__}, orjson {orjson.__version__}"
    if not a.no_hta:
        from importlib.metadata import PackageNotFoundError, version
        try:
            out += f", traceinsight {version('traceinsight')}"
        except PackageNotFoundError:
            pass
    return out


def _cli_doc(a, tmp: Path) -> dict:
    """The results of `--cli`: mtplab analyze --json vs HTA from process start."""
    if a.trace:
        src = Path(a.trace)
        path = tmp / "rank0.pt.trace.json"
        os.symlink(src.resolve(), path)
        what = f"`{src.name}`"
    else:
        real = Path(a.replicate or R.REPO / "tests" / "data"
                    / "gpu_frozen_overlap.pt.trace.json.gz")
        path, n = replicate_trace(real, tmp, a.target_mb)
        what = (f"**synthesized**: {n} copies of the real trace `{real.name}` laid end to "
                "end (no real ~60 MB transformers trace given; record one with "
                "benchmarks/record_plain_trace.py)")
    wall, cpu, import_s = from_process_start(path, tmp, a.repeats)
    return {"mode": S.PROCESS_START, "arms": wall, "cpu_seconds": cpu, "import_s": import_s,
            "trace": {"what": what, "mb": path.stat().st_size / 1e6}, "idle": []}


def _in_process_doc(a, tmp: Path) -> dict:
    """The results of the in-process arms (module docstring), interleaved."""
    if a.trace:
        src = Path(a.trace)
        path = tmp / src.name  # HTA wants a folder holding only this trace
        os.symlink(src.resolve(), path)
        what = f"`{src.name}`"
    else:
        t0 = time.perf_counter()
        path = write_trace(tmp, a.steps, a.seed, a.profiler_step_every)
        n_ps = -(-a.steps // a.profiler_step_every)
        what = f"synthetic (seed {a.seed}, {a.steps} engine steps, {n_ps} ProfilerStep#N spans)"
        print(f"built {path} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    size_mb = path.stat().st_size / 1e6
    doc = run_orjson(path)
    n_events = len(doc["traceEvents"])
    n_x = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
    del doc

    arms = {S.MTPLAB: lambda: run_mtplab(path)}
    if a.streaming:
        arms[S.STREAMING] = lambda: run_mtplab(path, streaming=True)
    if not a.no_hta:
        arms[S.HTA] = lambda: run_hta(tmp)
    arms[S.FLOOR] = lambda: run_orjson_gc_paused(path)
    arms[S.GC_ON] = lambda: run_orjson(path)
    times: dict[str, list[float]] = {k: [] for k in arms}
    results = {}
    for k, fn in arms.items():  # warm-up: imports, page cache
        out = fn()
        if k in (S.MTPLAB, S.HTA):  # keep no parsed document alive (the GC would scan it)
            results[k] = out
        del out
    for r in range(a.repeats):
        for k, fn in arms.items():
            gc.collect()
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{a.repeats}: "
              + ", ".join(f"{v[-1]:.2f}s" for v in times.values())
              + f"  ({', '.join(times)})", file=sys.stderr)
    idle = ([] if a.no_hta else
            idle_rows(results[S.MTPLAB], results[S.HTA], exact_hta_definition(path)))
    return {"mode": S.IN_PROCESS, "arms": times, "idle": idle,
            "trace": {"what": what, "mb": size_mb, "events": n_events, "x_events": n_x}}


def idle_rows(res, hta_df, exact: dict[int, float]) -> list[dict]:
    """Per stream: mtplab's idle, the exact sum of HTA's definition, HTA's, and each one's
    split by HTA's categories (analyser.idle_row)."""
    st = res.streams.set_index("stream")
    hta = hta_df.groupby("stream")["idle_time"].sum()
    hta_cat = hta_df.pivot_table(index="stream", columns="idle_category", values="idle_time",
                                 aggfunc="sum").fillna(0.0)
    rows = []
    for sid in sorted(set(st.index.tolist()) | {int(s) for s in hta.index}):
        m = float(st.loc[sid, "idle_us"]) if sid in st.index else None
        mc = ({c: float(st.loc[sid, f"idle_{c}_us"]) for c in S.CAUSES}
              if sid in st.index else None)
        hc = ({c: float(hta_cat.loc[sid].get(c, 0.0)) for c in S.CAUSES}
              if sid in hta_cat.index else None)
        rows.append(S.idle_row(sid, m, exact.get(sid), float(hta.get(sid, float("nan"))),
                               mc, hc))
    return rows


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
