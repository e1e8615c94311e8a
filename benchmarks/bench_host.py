"""Where does a decode step's host time go, and does overlap + zero_bubble ever lose to the
plain loop? (tiny-code: the engine is host-bound; a GPU-bound preset as the contrast)

Drives engines directly, every arm built once in this process and run interleaved (arm A
B C .., A B C .., over repeats): the loop modes are compared on one host at one moment, and
the host-stage table needs the engine's own objects (its graph runners, its spans).

    phases (--only, default all):
      ratios   decode tok/s per arm and batch size, median [min-max] over interleaved
               repeats; per draft the ratio overlap+zb / overlap off; meter bubble and meter
               wall per step (bubble_meter on, as in every sweep cell)
      table    the host-stage table: per arm and batch size, host µs per decode step of each
               stage (schedule, prepare, each segment's launch, d2h, sync, process_result),
               the loop's own Python between them, replays / copy_ / other aten ops per step
               (counted in a generate of their own), against the replay floor
               (instrument/hostclock.py)
      cprofile top functions by own time (cProfile, one generate) for a few cells
      diag     the plain and the overlap loop side by side under variants that each remove
               one suspect (GPU idle during the host's work, one stream, gc off, a pure-Python
               probe per step, threads' CPU time)
      gpubound the ratios phase at a GPU-bound preset (--gpu-model, simulated acceptance)

    python -m benchmarks.bench_host --out-dir DIR [--only ratios table ...] [--bs 1 8 32 64]
        [--repeats 5] [--drafts none frozen eagle] [--set key=value ...]
"""
from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

from mtplab import Engine, RunConfig
from mtplab.instrument.hostclock import HostClock, OpCounter, replay_floor_us, replays
from mtplab.sweep.measure import code_prompts

DRAFTS = {"none": dict(draft="none"),
          "frozen": dict(draft="frozen_kv_mtp", fold_seed=True),
          "frozenK4": dict(draft="frozen_kv_mtp", fold_seed=True, topk=4, num_draft_tokens=8),
          "eagle": dict(draft="eagle")}
LOOPS = {"off": dict(overlap=False), "on+zb": dict(overlap=True, zero_bubble=True)}
STAGE_ORDER = ("schedule", "prepare", "resolve", "draft.seed", "draft", "tree", "verify",
               "accept", "commit", "publish", "draft_extend", "stash", "d2h", "sync",
               "process_result")


def parse_set(items) -> dict:
    out = {}
    for it in items or ():
        k, v = it.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def runners(eng) -> list:
    tw = eng.target_worker
    rs = list(tw.decode_graphs.values()) + list(tw.graphs.values())
    if eng.worker is not tw:
        rs += list(eng.worker.graphs.values())
    return rs


class Arms:
    """One engine per (draft, loop) arm, built once (graphs captured for every bucket up to
    the largest batch size)."""

    def __init__(self, drafts, loops, max_bs: int, base: dict, log):
        self.engines: dict = {}
        self.prompts: dict = {}
        for d in drafts:
            for lp in loops:
                t = time.perf_counter()
                cfg = RunConfig(**{**base, **DRAFTS[d], **LOOPS[lp],
                                   "max_running_requests": max_bs,
                                   "cuda_graph_max_bs": max_bs, "bubble_meter": True})
                self.engines[(d, lp)] = Engine(cfg)
                log(f"built {d} {lp} in {time.perf_counter() - t:.1f} s")
        self.tok = next(iter(self.engines.values())).tokenizer

    def prompts_for(self, bs: int, length: int):
        key = (bs, length)
        if key not in self.prompts:
            self.prompts[key] = code_prompts(self.tok, bs, length)
        return self.prompts[key]


def generate(eng, ps, n: int) -> dict:
    eng.generate(ps, max_new_tokens=n, ignore_eos=True)
    return eng.stats()


def phase_ratios(arms: Arms, a, log) -> list[str]:
    res: dict = {}
    for k in arms.engines:                   # warm-up: every bucket the batch sizes use
        for bs in a.bs:
            generate(arms.engines[k], arms.prompts_for(bs, a.prompt_len), 8)
    for rep in range(a.repeats):
        for bs in a.bs:
            ps = arms.prompts_for(bs, a.prompt_len)
            for k, eng in arms.engines.items():
                st = generate(eng, ps, a.tokens)
                res.setdefault((k, bs), []).append(st)
        log(f"ratios repeat {rep} done")
    rows = ["| draft | bs | loop | decode tok/s median [min-max] | on+zb / off | step p50 ms | "
            "meter wall µs/step | meter bubble % | accept len |", "|---" * 9 + "|"]
    for bs in a.bs:
        for d in a.drafts:
            base = None
            for lp in a.loops:
                sts = res.get(((d, lp), bs))
                if not sts:
                    continue
                tps = [s["decode_tok_per_s"] for s in sts]
                med = statistics.median(tps)
                if lp == "off":
                    base = med
                ratio = f"{med / base:.3f}x" if base and lp != "off" else "-"
                rows.append(
                    f"| {d} | {bs} | {lp} | {med:,.0f} [{min(tps):,.0f}-{max(tps):,.0f}] | "
                    f"{ratio} | {statistics.median(s['decode_step_p50_ms'] for s in sts):.3f} | "
                    f"{statistics.median(s['meter_wall_us_per_step'] for s in sts):.0f} | "
                    f"{100 * statistics.median(s['bubble_frac'] for s in sts):.1f} | "
                    f"{statistics.median(s.get('accept_len', 1.0) or 1.0 for s in sts):.2f} |")
    return rows


def decode_only(eng, ps, n: int, body):
    """Run the prompts step by step: prefill first, then `body` wraps the decode steps.
    Returns the decode steps run inside it."""
    reqs = [eng.add_request(p, n, ignore_eos=True) for p in ps]
    sched = eng.scheduler
    while sched.waiting:
        eng.step()
    d0 = sched.stats.decode_steps
    with body():
        while not eng.idle:
            eng.step()
    eng.device.synchronize()
    assert all(r.finished for r in reqs)
    return sched.stats.decode_steps - d0


def host_row(eng, ps, n: int) -> dict:
    clock = HostClock()
    eng.spans.host_clock = clock
    try:
        generate(eng, ps, n)
    finally:
        eng.spans.host_clock = None
    per = clock.per_step()
    oc = OpCounter()
    rs = runners(eng)
    r0 = replays(rs)
    steps = decode_only(eng, ps, n, lambda: oc)
    eng.check_invariants()
    ops = {k: v / steps for k, v in oc.ops.items()}
    per["replays"] = (replays(rs) - r0) / steps
    per["copy_"] = ops.get("copy_", 0.0)
    per["ops"] = sum(ops.values())
    per["views"] = oc.views / steps
    per["ops_by_name"] = dict(sorted(ops.items(), key=lambda kv: -kv[1])[:8])
    return per


def phase_table(arms: Arms, a, log, floor1, floor20) -> list[str]:
    cols = [s for s in STAGE_ORDER]
    out = {}
    for rep in range(max(1, a.table_repeats)):
        for bs in a.table_bs:
            ps = arms.prompts_for(bs, a.prompt_len)
            for k, eng in arms.engines.items():
                generate(eng, ps, 8)
                out.setdefault((k, bs), []).append(host_row(eng, ps, a.tokens))
    seen = [c for c in cols if any(c in r for rows in out.values() for r in rows)]
    head = (["draft", "loop", "bs", "step µs"] + [f"{c} µs" for c in seen] +
            ["loop Python µs", "replays", "copy_", "other ops", "views", "floor µs",
             "step / floor"])
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for (k, bs), rs in out.items():
        med = {c: statistics.median(r.get(c, 0.0) for r in rs)
               for c in seen + ["step", "stages", "replays", "copy_", "ops", "views"]}
        floor = med["replays"] * floor1 if floor1 else float("nan")
        rows.append("| " + " | ".join(
            [k[0], k[1], str(bs), f"{med['step']:.0f}"] + [f"{med[c]:.1f}" for c in seen] +
            [f"{med['step'] - med['stages']:.1f}", f"{med['replays']:.2f}",
             f"{med['copy_']:.2f}", f"{med['ops'] - med['copy_']:.2f}", f"{med['views']:.1f}",
             f"{floor:.1f}", f"{med['step'] / floor:.1f}x" if floor == floor else "-"]) + " |")
        log(f"{k} bs {bs} ops: {rs[-1]['ops_by_name']}")
    rows.append("")
    rows.append(f"replay floor (host µs per CUDAGraph.replay, this process): 1 kernel "
                f"{floor1}, 20 kernels {floor20}; floor µs = replays/step x the 1-kernel figure")
    return rows


def phase_cprofile(arms: Arms, a, log) -> list[str]:
    out = []
    for spec in a.cprofile:
        d, lp, bs = spec.split(":")
        eng = arms.engines.get((d, lp))
        if eng is None:
            continue
        ps = arms.prompts_for(int(bs), a.prompt_len)
        generate(eng, ps, 8)
        pr = cProfile.Profile()
        pr.enable()
        st = generate(eng, ps, a.tokens)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22)
        lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
        out += [f"#### cProfile {d} {lp} bs {bs}: {st['decode_steps']} decode steps, "
                f"{st['steps']} steps", "```", *lines[:32], "```"]
    return out


def _threads_cpu() -> dict:
    out = {}
    for t in Path("/proc/self/task").iterdir():
        try:
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            name = (t / "comm").read_text().strip()
            out[f"{t.name}:{name}"] = (int(f[11]) + int(f[12]))      # utime + stime, ticks
        except OSError:
            pass
    return out


def _probe() -> int:
    t = time.perf_counter_ns()
    x = 0
    for i in range(300):
        x += i * i
    return time.perf_counter_ns() - t


def phase_diag(arms: Arms, a, log) -> list[str]:
    bs = a.diag_bs
    ps = arms.prompts_for(bs, a.prompt_len)
    hz = os.sysconf("SC_CLK_TCK")
    stages = ("schedule", "prepare", "resolve", "verify", "d2h", "sync", "process_result")
    rows = ["| loop | variant | step µs | " + " | ".join(f"{s} µs" for s in stages) +
            " | loop Python µs | probe µs |", "|---" * (len(stages) + 5) + "|"]
    cycles = None

    def run(eng, variant):
        nonlocal cycles
        probe: list = []
        hooks = list(eng._step_hooks)
        ctx = contextlib.nullcontext()
        if variant == "probe":
            eng.on_step(lambda i: probe.append(_probe()))
        elif variant == "gpu idle":            # the device drained after every step
            eng.on_step(lambda i: torch.cuda.synchronize())
        elif variant == "gpu busy":            # a side stream keeps the device busy
            if cycles is None:
                from benchmarks.common import sleep_cycles
                cycles = sleep_cycles(0.3)
            side = torch.cuda.Stream()

            def busy(i):
                with torch.cuda.stream(side):
                    torch.cuda._sleep(cycles)
            eng.on_step(busy)
        elif variant == "gc off":
            ctx = _gc_off()
        sched = eng.scheduler
        streams = (sched.schedule_stream, sched.forward_stream, sched.copy_stream)
        if variant == "one stream":
            cur = eng.device.current_stream()
            sched.schedule_stream = sched.forward_stream = sched.copy_stream = cur
        clock = HostClock()
        eng.spans.host_clock = clock
        try:
            with ctx:
                generate(eng, ps, a.tokens)
        finally:
            eng.spans.host_clock = None
            eng._step_hooks[:] = hooks
            sched.schedule_stream, sched.forward_stream, sched.copy_stream = streams
        per = clock.per_step()
        pr = statistics.median(probe) / 1e3 if probe else float("nan")
        return per, pr

    res: dict = {}
    variants = ("plain", "probe", "gpu idle", "gpu busy", "gc off", "one stream")
    for rep in range(a.diag_repeats):
        for v in variants:
            for lp in a.loops:
                eng = arms.engines[("none", lp)]
                if v == "one stream" and lp == "off":
                    continue
                generate(eng, ps, 8)
                res.setdefault((lp, v), []).append(run(eng, v))
    for (lp, v), rs in res.items():
        step = statistics.median(r[0]["step"] for r in rs)
        py = statistics.median(r[0]["step"] - r[0]["stages"] for r in rs)
        rows.append(f"| {lp} | {v} | {step:.0f} | " + " | ".join(
            f"{statistics.median(r[0].get(s, 0.0) for r in rs):.1f}" for s in stages) +
            f" | {py:.1f} | {statistics.median(r[1] for r in rs):.2f} |")
    # threads: CPU time of every thread of this process over one generate per loop
    for lp in a.loops:
        eng = arms.engines[("none", lp)]
        t0, w0 = _threads_cpu(), time.perf_counter()
        generate(eng, ps, a.tokens)
        t1, w1 = _threads_cpu(), time.perf_counter()
        busy = {k: (t1[k] - t0.get(k, 0)) / hz for k in t1 if t1[k] - t0.get(k, 0) > 0}
        rows.append(f"\nthreads' CPU s over one generate of {w1 - w0:.2f} s ({lp}): {busy}")
    rows.append(f"threads now: {[t.name for t in threading.enumerate()]}; "
                f"affinity {sorted(os.sched_getaffinity(0))}")
    return rows


@contextlib.contextmanager
def _gc_off():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--only", nargs="+",
                    default=["ratios", "table", "cprofile", "diag"])
    ap.add_argument("--drafts", nargs="+", default=["none", "frozen", "eagle"])
    ap.add_argument("--loops", nargs="+", default=list(LOOPS))
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--table-bs", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--table-repeats", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--diag-bs", type=int, default=32)
    ap.add_argument("--diag-repeats", type=int, default=2)
    ap.add_argument("--cprofile", nargs="*",
                    default=["none:off:32", "none:on+zb:32", "frozen:on+zb:1"])
    ap.add_argument("--model", default="tiny-code")
    ap.add_argument("--set", nargs="*", default=[], help="RunConfig key=value for every arm")
    ap.add_argument("--gpu-model", default="llama3-8b-like")
    ap.add_argument("--gpu-layers", type=int, default=32)
    a = ap.parse_args(argv)
    out_dir = Path(a.out_dir) if a.out_dir else None
    t_start = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    base = dict(model=a.model, context_len=1024, page_size=16, **parse_set(a.set))
    text = [f"bench_host on {torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'}"
            f"; torch {torch.__version__}; {time.strftime('%Y-%m-%d %H:%M')}; "
            f"settings {base}; argv {sys.argv[1:]}"]
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    floor1, floor20 = replay_floor_us(dev, 1), replay_floor_us(dev, 20)
    log(f"replay floor 1 kernel {floor1} µs, 20 kernels {floor20} µs")
    max_bs = max(a.bs + a.table_bs + [a.diag_bs])
    if {"ratios", "table", "cprofile", "diag"} & set(a.only):
        arms = Arms(a.drafts, a.loops, max_bs, base, log)
        for ph, fn in (("table", lambda: phase_table(arms, a, log, floor1, floor20)),
                       ("diag", lambda: phase_diag(arms, a, log)),
                       ("cprofile", lambda: phase_cprofile(arms, a, log)),
                       ("ratios", lambda: phase_ratios(arms, a, log))):
            if ph in a.only:
                text += ["", f"### {ph}", ""] + fn()
                log(f"{ph} done")
                if out_dir:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    (out_dir / "bench_host.md").write_text("\n".join(text) + "\n")
        del arms
        gc.collect()
        torch.cuda.empty_cache()
    if "gpubound" in a.only:
        gb = dict(base, model=a.gpu_model, layers=a.gpu_layers)
        g = argparse.Namespace(**{**vars(a), "repeats": max(2, a.repeats // 2)})
        for d in a.drafts:
            sim = {} if d == "none" else {"simulate_accept_len": 3.0}
            arms = Arms([d], a.loops, max(a.bs), {**gb, **sim}, log)
            g.drafts = [d]
            text += ["", f"### gpubound {a.gpu_model}@{a.gpu_layers} {d}", ""] + \
                phase_ratios(arms, g, log)
            del arms
            gc.collect()
            torch.cuda.empty_cache()
            if out_dir:
                (out_dir / "bench_host.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
