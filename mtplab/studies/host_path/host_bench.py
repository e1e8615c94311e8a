"""Where does a decode step's host time go, and does overlap + zero_bubble ever lose to the
plain loop? (tiny-code: the engine is host-bound; a GPU-bound preset as the contrast)

Drives engines directly, every arm built once in this process and run interleaved (arm A
B C .., A B C .., over repeats): the loop modes are compared on one host at one moment, and
the host-stage table needs the engine's own objects (its graph runners, its spans). A runner of
study `host_path`; its entry point is benchmarks/bench_host.py.

    phases (--only, default table diag cprofile ratios):
      prims    host µs per call of each primitive the decode path issues (event record and
               wait, stream switch, graph replay, the d2h launch, append_decode, ...)
      ratios   decode tok/s per arm and batch size, median [min-max] over interleaved
               repeats; per draft the ratio overlap+zb / overlap off; meter bubble and meter
               wall per step (bubble_meter on, as in every sweep cell)
      table    the host-stage table: per arm and batch size, host µs per decode step of each
               stage (schedule, prepare, each segment's launch, d2h, sync, process_result),
               the loop's own Python between them, replays / copy_ / other aten ops per step
               (counted in a generate of their own), against the replay floor
               (instrument/hostclock.py)
      cprofile top functions by own time (cProfile, one generate) for a few cells
      diag     two loops of one draft (--diag-draft; the first and last of --loops) side by
               side under variants that each remove one suspect (GPU idle during the host's
               work, one stream, gc off, a pure-Python probe per step, threads' CPU time):
               is one loop's host work slower per call, or the host's own speed drifting?
      gpubound the ratios phase at a GPU-bound preset (--gpu-model@--gpu-layers, simulated
               acceptance 3.0, --gpu-tokens per request, --gpu-repeats), one draft at a time

    python -m benchmarks.bench_host --out-dir DIR [--only ratios table ...] [--bs 1 8 32 64]
        [--repeats 5] [--drafts none frozen eagle] [--loops off on on+zb] [--set key=value ...]
        [--diag-draft frozen --loops on on+zb --diag-bs 32 --diag-repeats 6]
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
from mtplab.instrument.hostclock import HostClock, replay_floor_us
from mtplab.nogc import gc_paused
from mtplab.sweep.host import HOST_STAGES, host_columns
from mtplab.sweep.measure import code_prompts
from mtplab.sweep.measure import prompts as random_prompts

DRAFTS = {"none": dict(draft="none"),
          "frozen": dict(draft="frozen_kv_mtp", fold_seed=True),
          "frozenK4": dict(draft="frozen_kv_mtp", fold_seed=True, topk=4, num_draft_tokens=8),
          "eagle": dict(draft="eagle")}
LOOPS = {"off": dict(overlap=False), "on": dict(overlap=True),
         "on+zb": dict(overlap=True, zero_bubble=True)}


def parse_set(items) -> dict:
    out = {}
    for it in items or ():
        k, v = it.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


class Arms:
    """One engine per (draft, loop) arm, built once (graphs captured for every bucket up to
    the largest batch size)."""

    def __init__(self, drafts, loops, grans, max_bs: int, base: dict, log):
        self.engines: dict = {}
        self.prompts: dict = {}
        for d in drafts:
            for g in grans:
                for lp in loops:
                    t = time.perf_counter()
                    cfg = RunConfig(**{**base, **DRAFTS[d], **LOOPS[lp],
                                       "graph_granularity": g, "max_running_requests": max_bs,
                                       "cuda_graph_max_bs": max_bs, "bubble_meter": True})
                    self.engines[(d, lp, g)] = Engine(cfg)
                    log(f"built {d} {lp} {g} in {time.perf_counter() - t:.1f} s")
        eng = next(iter(self.engines.values()))
        self.tok, self.vocab = eng.tokenizer, eng.model.config.vocab_size

    def prompts_for(self, bs: int, length: int):
        """Held-out code prompts (random token ids for a preset without a tokenizer)."""
        key = (bs, length)
        if key not in self.prompts:
            self.prompts[key] = code_prompts(self.tok, bs, length) if self.tok is not None \
                else random_prompts(bs, length, self.vocab, 0)
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
    rows = ["| draft | graphs | bs | loop | decode tok/s median [min-max] | / off | "
            "step p50 ms | meter wall µs/step | meter bubble % | accept len |", "|---" * 10 + "|"]
    for bs in a.bs:
        for d in a.drafts:
            for g in a.granularities:
                base = None
                for lp in a.loops:
                    sts = res.get(((d, lp, g), bs))
                    if not sts:
                        continue
                    tps = [s["decode_tok_per_s"] for s in sts]
                    med = statistics.median(tps)
                    if lp == "off":
                        base = med
                    ratio = f"{med / base:.3f}x" if base and lp != "off" else "-"
                    rows.append(
                        f"| {d} | {g} | {bs} | {lp} | {med:,.0f} "
                        f"[{min(tps):,.0f}-{max(tps):,.0f}] | {ratio} | "
                        f"{statistics.median(s['decode_step_p50_ms'] for s in sts):.3f} | "
                        f"{statistics.median(s['meter_wall_us_per_step'] for s in sts):.0f} | "
                        f"{100 * statistics.median(s['bubble_frac'] for s in sts):.1f} | "
                        f"{statistics.median(s.get('accept_len', 1.0) or 1.0 for s in sts):.2f} |")
    return rows


def phase_table(arms: Arms, a, log, floor1, floor20) -> list[str]:
    out = {}
    for _ in range(max(1, a.table_repeats)):
        for bs in a.table_bs:
            ps = arms.prompts_for(bs, a.prompt_len)
            for k, eng in arms.engines.items():
                generate(eng, ps, 8)
                out.setdefault((k, bs), []).append(host_columns(eng, ps, a.tokens))
                eng.check_invariants()
    col = {s: f"host_{s.replace('.', '_')}_us" for s in HOST_STAGES}
    seen = [s for s in HOST_STAGES if any(r[col[s]] > 0 for rs in out.values() for r in rs)]
    head = (["draft", "loop", "graphs", "bs", "step µs", "p50 µs"] + [f"{c} µs" for c in seen] +
            ["loop Python µs", "replays", "copy_", "other ops", "views", "floor µs",
             "step / floor"])
    rows = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for (k, bs), rs in out.items():
        med = {c: statistics.median(r[c] for r in rs) for c in rs[0]}
        floor = med["host_floor_us"]
        rows.append("| " + " | ".join(
            [k[0], k[1], k[2], str(bs), f"{med['host_step_us']:.0f}",
             f"{med['host_step_p50_us']:.0f}"] +
            [f"{med[col[c]]:.1f}" for c in seen] +
            [f"{med['host_loop_us']:.1f}", f"{med['host_replays_per_step']:.2f}",
             f"{med['host_copies_per_step']:.2f}", f"{med['host_ops_per_step']:.2f}",
             f"{med['host_views_per_step']:.1f}", f"{floor:.1f}",
             f"{med['host_step_us'] / floor:.1f}x" if floor == floor and floor else "-"]) + " |")
    rows.append("")
    rows.append(f"replay floor (host µs per CUDAGraph.replay, this process): 1 kernel "
                f"{floor1}, 20 kernels {floor20}; floor µs = replays/step x the 1-kernel figure")
    return rows


def phase_cprofile(arms: Arms, a, log) -> list[str]:
    out = []
    for spec in a.cprofile:
        d, lp, g, bs = spec.split(":")
        eng = arms.engines.get((d, lp, g))
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
        out += [f"#### cProfile {d} {lp} {g} bs {bs}: {st['decode_steps']} decode steps, "
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


def _steal_ticks() -> int:
    """System-wide steal time so far (ticks; /proc/stat `cpu` line, 8th value)."""
    try:
        return int(Path("/proc/stat").read_text().split("\n", 1)[0].split()[8])
    except (OSError, IndexError, ValueError):
        return -1


def _cpu_now() -> int:
    try:
        return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def _probe() -> int:
    """ns of a fixed pure-Python loop: the host's speed at this moment."""
    t = time.perf_counter_ns()
    x = 0
    for i in range(300):
        x += i * i
    return time.perf_counter_ns() - t


def phase_diag(arms: Arms, a, log) -> list[str]:
    """Two loops of --diag-draft (the first and last of --loops) at --diag-bs in alternating
    generates, each with a pure-Python probe after every step: is one loop's host work slower
    per call, or is the host's own speed moving under both? Variants remove one suspect each."""
    bs, d, (l0, l1) = a.diag_bs, a.diag_draft, (a.loops[0], a.loops[-1])
    ps = arms.prompts_for(bs, a.prompt_len)
    hz = os.sysconf("SC_CLK_TCK")
    stages = ("schedule", "prepare", "resolve", "verify", "d2h", "sync", "process_result")
    cycles = None

    def run(eng, variant):
        nonlocal cycles
        probe: list = []
        ctx = contextlib.nullcontext()
        hooks = [eng.on_step(lambda i: probe.append(_probe()))]
        if variant == "gpu idle":            # the device drained after every step
            hooks.append(eng.on_step(lambda i: torch.cuda.synchronize()))
        elif variant == "gpu busy":            # a side stream keeps the device busy
            if cycles is None:
                from mtplab.studies.run_cells import sleep_cycles
                cycles = sleep_cycles(0.3)
            side = torch.cuda.Stream()

            def busy(i):
                with torch.cuda.stream(side):
                    torch.cuda._sleep(cycles)
            hooks.append(eng.on_step(busy))
        elif variant == "gc off":
            ctx = gc_paused()
        sched = eng.scheduler
        streams = (sched.schedule_stream, sched.forward_stream, sched.copy_stream)
        if variant == "one stream":
            cur = eng.device.current_stream()
            sched.schedule_stream = sched.forward_stream = sched.copy_stream = cur
        clock = HostClock()
        eng.spans.host_clock = clock
        st0, c0, w0 = _steal_ticks(), time.process_time(), time.perf_counter()
        try:
            with ctx:
                generate(eng, ps, a.tokens)
        finally:
            eng.spans.host_clock = None
            for h in hooks:
                h.remove()
            sched.schedule_stream, sched.forward_stream, sched.copy_stream = streams
        cpu_frac = (time.process_time() - c0) / (time.perf_counter() - w0)
        return dict(clock.per_step(), probe=statistics.median(probe) / 1e3,
                    steal=(_steal_ticks() - st0) / hz, cpu_frac=cpu_frac, cpu=_cpu_now())

    res: dict = {}
    seq: list = []
    variants = ("plain", "gpu idle", "gpu busy", "gc off", "one stream") \
        if torch.cuda.is_available() else ("plain", "gc off", "one stream")
    for rep in range(a.diag_repeats):
        for v in variants:
            for lp in a.loops:
                eng = arms.engines[(d, lp, a.granularities[0])]
                if v == "one stream" and lp == "off":
                    continue
                generate(eng, ps, 8)
                r = run(eng, v)
                res.setdefault((lp, v), []).append(r)
                seq.append((rep, v, lp, r))
    rows = [f"{d}, bs {bs}, {a.diag_repeats} alternating rounds; medians over them",
            "", "| loop | variant | step µs | " + " | ".join(f"{s} µs" for s in stages) +
            " | loop Python µs | probe µs | steal s | process CPU / wall |",
            "|---" * (len(stages) + 7) + "|"]
    for (lp, v), rs in res.items():
        med = lambda k, rs=rs: statistics.median(r.get(k, 0.0) for r in rs)   # noqa: E731
        rows.append(f"| {lp} | {v} | {med('step'):.0f} | " + " | ".join(
            f"{med(s):.1f}" for s in stages) +
            f" | {statistics.median(r['step'] - r['stages'] for r in rs):.1f} | "
            f"{med('probe'):.2f} | {med('steal'):.3f} | {med('cpu_frac'):.2f} |")
    # per round: the two loops' plain runs side by side, with the probe beside each
    rows += ["", f"plain runs in order (round: {l0} step µs / probe µs, {l1} step µs / probe "
             "µs, ratio of steps, ratio of probes, cpu):"]
    plain = [(rep, lp, r) for rep, v, lp, r in seq if v == "plain"]
    for rep in range(a.diag_repeats):
        pr = {lp: r for k, lp, r in plain if k == rep}
        if {l0, l1} <= set(pr):
            o, n = pr[l0], pr[l1]
            rows.append(f"  {rep}: {o['step']:.0f} / {o['probe']:.2f}, {n['step']:.0f} / "
                        f"{n['probe']:.2f}, {n['step'] / o['step']:.2f}, "
                        f"{n['probe'] / o['probe']:.2f}, cpu {o['cpu']}/{n['cpu']}")
    steps = [r["step"] for *_, r in seq]
    probes = [r["probe"] for *_, r in seq]
    if len(steps) > 2:
        import numpy as np
        rows.append(f"correlation of step µs with the probe over all {len(steps)} runs: "
                    f"{np.corrcoef(steps, probes)[0, 1]:.2f}")
    for lp in a.loops:
        eng = arms.engines[(d, lp, a.granularities[0])]
        t0, w0 = _threads_cpu(), time.perf_counter()
        generate(eng, ps, a.tokens)
        t1, w1 = _threads_cpu(), time.perf_counter()
        busy = {k: (t1[k] - t0.get(k, 0)) / hz for k in t1 if t1[k] - t0.get(k, 0) > 0}
        rows.append(f"threads' CPU s over one generate of {w1 - w0:.2f} s ({lp}): {busy}")
    rows.append(f"threads now: {[t.name for t in threading.enumerate()]}; "
                f"affinity {sorted(os.sched_getaffinity(0))}")
    return rows


def _per_call_us(fn, n: int = 2000, sync_every: int = 100) -> float:
    """Host µs per call of fn, median of batches (the device drained between batches)."""
    per = []
    for _ in range(max(1, n // sync_every)):
        t = time.perf_counter_ns()
        for _ in range(sync_every):
            fn()
        per.append((time.perf_counter_ns() - t) / sync_every / 1e3)
        torch.cuda.synchronize()
    return statistics.median(per)


def phase_prims(a, log) -> list[str]:
    """Host µs per call of each primitive the decode path issues, on this host."""
    import numpy as np

    from mtplab.device import current_cuda_stream, resolve_device
    from mtplab.kernels.stamp import StampedCopy
    from mtplab.sched.process_result import append_decode
    from mtplab.sched.rows import Batch, HostRows
    from mtplab.sched.scheduler import StepStats

    dev = resolve_device("cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    ev = torch.cuda.Event()
    ev.record(s1)
    ev.synchronize()
    out = {}
    out["Event.record(stream)"] = _per_call_us(lambda: ev.record(s1))
    out["Event.record()"] = _per_call_us(lambda: ev.record())
    out["Stream.wait_event"] = _per_call_us(lambda: s2.wait_event(ev))
    out["Event.query (done)"] = _per_call_us(lambda: ev.query())
    ev.synchronize()
    out["Event.synchronize (done)"] = _per_call_us(lambda: ev.synchronize())

    def use_stream():
        with dev.stream(s1):
            pass
    out["Device.stream enter/exit"] = _per_call_us(use_stream)
    out["Device.order"] = _per_call_us(lambda: dev.order(s2, s1))
    out["torch.cuda.current_stream()"] = _per_call_us(torch.cuda.current_stream)
    out["current_cuda_stream()"] = _per_call_us(current_cuda_stream)
    src = [torch.arange(4, device="cuda"), torch.arange(1, device="cuda")]
    pin = torch.empty(64, dtype=torch.long, pin_memory=True)
    dst = [pin[:4], pin[8:9]]
    sc = StampedCopy(dev.torch_device, None)
    out["StampedCopy (direct launch)" if sc.run is not None else "StampedCopy (JIT)"] = \
        _per_call_us(lambda: sc(dst, src, None))
    out["Tensor.copy_ D2H non_blocking"] = _per_call_us(
        lambda: dst[0].copy_(src[0], non_blocking=True))
    x = torch.zeros(8, device="cuda")
    out["aten add_ (a kernel launch)"] = _per_call_us(lambda: x.add_(1))
    out["tensor slice [:4]"] = _per_call_us(lambda: x[:4])
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(200):
            x.add_(1)
    out["CUDAGraph.replay (200 kernels)"] = _per_call_us(g.replay, n=500, sync_every=20)
    hnp = pin.numpy()
    out["pinned .numpy()"] = _per_call_us(lambda: pin.numpy())
    for bs in (1, 32):
        host = HostRows(bs)
        rows = np.arange(1, bs + 1)
        host.rid[rows], host.max_new[rows] = rows, 10**9
        from mtplab.core import Req
        reqs = [Req(int(r), [1], 10**9) for r in rows]
        for r in reqs:
            r.kv = type("K", (), {"row": int(r.rid)})()
        b = Batch(reqs, [None] * bs, rows, rows.copy(), np.full((bs, 1), -1), True, False)
        committed = np.zeros(bs + 1, np.int64)
        toks, lens = np.full((bs, 4), 7, np.int64), np.full(bs, 3, np.int64)
        st = StepStats()

        def ad(b=b, toks=toks, lens=lens, host=host, committed=committed, st=st, reqs=reqs):
            append_decode(b, toks, lens, host, committed, st)
            if len(reqs[0].output_ids) > 3000:
                for r in reqs:
                    r.output_ids.clear()
                    r.arrivals.clear()
        out[f"append_decode bs {bs}"] = _per_call_us(ad)
    out["Python probe (300 iterations)"] = statistics.median(_probe() / 1e3 for _ in range(500))
    del hnp
    return ["| primitive | host µs per call |", "|---|---|"] + \
        [f"| {k} | {v:.2f} |" for k, v in out.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", default=None)
    ap.add_argument("--only", nargs="+",
                    default=["ratios", "table", "cprofile", "diag"])
    ap.add_argument("--drafts", nargs="+", default=["none", "frozen", "eagle"])
    ap.add_argument("--loops", nargs="+", default=["off", "on+zb"], choices=list(LOOPS))
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 8, 32, 64])
    ap.add_argument("--table-bs", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--table-repeats", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--diag-bs", type=int, default=32)
    ap.add_argument("--diag-repeats", type=int, default=2)
    ap.add_argument("--diag-draft", default="none", help="the draft whose loops diag compares "
                    "(one of --drafts)")
    ap.add_argument("--granularities", nargs="+", default=["stage", "step"])
    ap.add_argument("--cprofile", nargs="*", help="draft:loop:granularity:bs cells",
                    default=["none:on+zb:step:32", "frozen:on+zb:step:1"])
    ap.add_argument("--model", default="tiny-code")
    ap.add_argument("--set", nargs="*", default=[], help="RunConfig key=value for every arm")
    ap.add_argument("--gpu-model", default="llama3-8b-like")
    ap.add_argument("--gpu-layers", type=int, default=32)
    ap.add_argument("--gpu-tokens", type=int, default=48)
    ap.add_argument("--gpu-repeats", type=int, default=2)
    ap.add_argument("--gpu-granularities", nargs="+", default=["stage"])
    a = ap.parse_args(argv)
    if "diag" in a.only and a.diag_draft not in a.drafts:
        ap.error(f"--diag-draft {a.diag_draft} is not one of --drafts {a.drafts}; add it there.")
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
    if {"ratios", "table", "cprofile", "diag", "prims"} & set(a.only):
        arms = Arms(a.drafts, a.loops, a.granularities, max_bs, base, log)
        for ph, fn in (("prims", lambda: phase_prims(a, log)),
                       ("table", lambda: phase_table(arms, a, log, floor1, floor20)),
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
        g = argparse.Namespace(**{**vars(a), "repeats": a.gpu_repeats, "tokens": a.gpu_tokens,
                                  "granularities": a.gpu_granularities})
        for d in a.drafts:
            sim = {} if d == "none" else {"simulate_accept_len": 3.0}
            arms = Arms([d], a.loops, a.gpu_granularities, max(a.bs), {**gb, **sim}, log)
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

