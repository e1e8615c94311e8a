"""Bubble meter validation on the GPU (docs/results/meter_trust/). Every figure is
printed with PASS/MISS against its target where it has one.

1. Stamp resolution: back-to-back stamp kernels on a backlogged stream; min nonzero / median
   delta between consecutive %globaltimer reads (stated, no target). Wake-up latency: how
   much later than the host's launch a kernel or a graph replay starts after the host was
   idle for d (real idle the meter counts as bubble; stated, no target). Host wake: how much
   longer pure Python, six launches, and six launches + sync take right after a sleep or a
   busy-wait of d (stated, no target; it explains the planted rows' excess over d).
2. Stamp device cost: every segment graph of a decode step replayed back to back, captured
   with and without the meter's stamps -> device µs per step the stamps add (stated).
3. Planted host delays: a sleep of d in {0.2, 1, 5} ms (its last 100 µs spun, so exact) in
   a per-step hook (Engine.on_step), arms interleaved with d = 0; the host's own step
   period (host clock) is read beside it, so a host that slows after being away shows apart.
   host-bound (tiny-code frozen, bs 1), overlap off: the meter's median bubble per decode
   step must rise by d within 5% (or 10 µs); overlap on + zero_bubble: the rise and how much
   of d is hidden (no target). gpu-bound (llama3-8b-like@16 target-only, bs 8, the GPU's step
   longer than the host's): the same two modes, where overlap has queued work to hide d behind.
4. Meter vs profiler in one profiled run: GPU-backlogged (a GPU sleep queued after every
   step, bracketed by meter stamps so both tools count it busy) -> bubble fractions within
   2 points; host-bound (no sleep) -> both, and profiler - meter = idle inside stages the
   meter cannot see (no target).
5. Overhead: decode tok/s meter on vs off, 128-token generates in interleaved repeats for
   420 s per batch size, three engines per arm built interleaved, tiny-code bs 1 and bs 32
   (target <= 1%): the median of the per-repeat ratios with its bootstrap 95% interval, the
   pooled ratio (all tokens / all decode time of each arm), each arm's engine spread, and
   with --split a third arm with unstamped graphs that splits the cost.
6. Split: the meter's cost outside its graphs, by part (unstamped graphs, then the d2h
   kernel unstamped too) against two meter-off engines (stated, no target).

    python -m benchmarks.bench_meter --out $OUT/bench_meter.md [--out-dir DIR]
    python -m benchmarks.bench_meter --pool run1.npz run2.npz    # saved --raw runs, pooled

--out-dir writes the dated report of question `meter_trust` (mtplab/studies/meter_trust: the
results file, what each figure is computed from, per repeat where a part repeats, and the
Markdown rendered from it): DIR/meter_trust/<YYYY-MM-DD>_<device>_<commit>.{json,md}. The
commit is MTP_GIT_COMMIT where set, else this checkout's HEAD; a tree with uncommitted
changes is refused before anything runs. `mtplab report meter_trust` renders it again.

Each part is its own module meter_<part>.py beside this one (the study's __init__ lists
them); this file is the command line that runs them in the order above.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

from mtplab.studies import meter_trust as study
from mtplab.studies import reports as R
from mtplab.studies.run_cells import emit
from .meter_common import OVERLAP, REGIMES
from .meter_host_wake import host_wake
from .meter_overhead import overhead, pool
from .meter_planted import planted
from .meter_profiler import planted_vs_profiler, vs_profiler
from .meter_resolution import resolution
from .meter_split import split
from .meter_stamp_cost import stamp_cost


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="write the markdown here too")
    parts = ["resolution", "host-wake", "cost", "planted", "planted-profiler", "profiler",
             "overhead", "split"]
    ap.add_argument("--only", nargs="+", default=None, choices=parts)
    ap.add_argument("--overhead-reps", type=int, default=5000,
                    help="overhead: at most this many interleaved repeats per batch size")
    ap.add_argument("--split-reps", type=int, default=101,
                    help="interleaved repeats of the split part")
    ap.add_argument("--planted-reps", type=int, default=15,
                    help="(d = 0, d) pairs per planted delay")
    ap.add_argument("--overhead-bs", type=int, nargs="+", default=[1, 32],
                    help="batch sizes of the overhead part")
    ap.add_argument("--overhead-engines", type=int, default=3,
                    help="engines per arm of the overhead part (built interleaved)")
    ap.add_argument("--overhead-tokens", type=int, default=128,
                    help="decode tokens per generate of the overhead part")
    ap.add_argument("--overhead-seconds", type=float, default=420.0,
                    help="overhead: per batch size, start no repeat after this many seconds")
    ap.add_argument("--split", action="store_true",
                    help="overhead: add a third arm, the meter on with unstamped graphs, "
                         "to split the cost into the graphs' stamps and the rest")
    ap.add_argument("--raw", default=None,
                    help="overhead: save every engine's tok/s per repeat to this .npz")
    ap.add_argument("--pin-cpus", type=int, default=0,
                    help="run on this many CPUs (the allowed set's second on), 0: as started")
    ap.add_argument("--pool", nargs="+", default=None, metavar="RAW",
                    help="print the overhead rows of these saved --raw runs pooled (no GPU)")
    ap.add_argument("--out-dir", default=None, metavar="DIR",
                    help="write the dated report into DIR/meter_trust/ (DIR: docs/results "
                         "for the kept answer)")
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    if a.pool and a.out_dir:
        ap.error("--pool prints saved runs pooled; --out-dir writes the report of a run that "
                 "measures: give one of them.")
    if a.pool:
        rows = ["### Bubble meter (benchmarks/bench_meter.py --pool)"]
        pool(rows, a.pool)
        emit("\n".join(rows), a.out)
        return 0
    if a.overhead_engines < 1:
        ap.error(f"--overhead-engines {a.overhead_engines}: an arm needs at least 1 engine.")
    if a.overhead_tokens < 16:
        ap.error(f"--overhead-tokens {a.overhead_tokens}: a generate needs at least 16 decode "
                 "tokens for a median step time.")
    if a.overhead_seconds is not None and a.overhead_seconds <= 0:
        ap.error(f"--overhead-seconds {a.overhead_seconds}: give a positive number of seconds.")
    if a.pin_cpus:
        import os
        cpus = sorted(os.sched_getaffinity(0))[1:1 + a.pin_cpus]
        os.sched_setaffinity(0, cpus)          # before CUDA starts its threads
        print(f"pinned to CPUs {cpus}", file=sys.stderr)
    import torch
    if not torch.cuda.is_available():
        print("bench_meter needs a CUDA device (the CPU path is tested in "
              "tests/instrument/test_meter.py).", file=sys.stderr)
        return 2
    commit = None
    if a.out_dir is not None:
        commit = R.checkout_commit("bench_meter")      # refused before anything runs
        if commit is None:
            return 2
    want = set(a.only or parts)
    data: dict = {}
    rows = ["### Bubble meter (benchmarks/bench_meter.py)"]
    if "resolution" in want:
        resolution(rows, data=data)
    if "host-wake" in want:
        host_wake(rows, data=data)
    if "cost" in want:
        stamp_cost(rows, data=data)
    if "planted" in want:
        for regime in REGIMES:
            for mode in OVERLAP:
                planted(rows, regime, mode, a.planted_reps, data=data)
    if "planted-profiler" in want:
        with tempfile.TemporaryDirectory() as d:
            planted_vs_profiler(rows, Path(d), data=data)
    if "profiler" in want:
        with tempfile.TemporaryDirectory() as d:
            vs_profiler(rows, Path(d), data=data)
    if "overhead" in want:
        overhead(rows, a.overhead_reps, a.overhead_tokens, raw=a.raw,
                 sizes=tuple(a.overhead_bs), per_arm=a.overhead_engines,
                 split_arm=a.split, seconds=a.overhead_seconds, data=data)
    if "split" in want:
        split(rows, a.split_reps, data=data)
    emit("\n".join(rows), a.out)
    if a.out_dir is not None:
        import triton
        name = torch.cuda.get_device_name()
        doc = study.results_doc(
            data, date=time.strftime("%Y-%m-%d"), device=R.device_slug(name), device_name=name,
            commit=commit,
            command=shlex.join(["python", "-m", "benchmarks.bench_meter", *argv]),
            software=f"torch {torch.__version__}; triton {triton.__version__}")
        path = R.write(doc, study.render, Path(a.out_dir))
        print(f"wrote {path} and its results {path.with_suffix('.json').name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
