"""Dense decode at the HBM floor: cuBLAS vs the skinny GEMM, per GEMM and per decode step.

    python -m benchmarks.bench_dense_floor [--out-dir DIR] [--only gemm decode long tune]
                                           [--rounds 5] [--budget-s 330]

One process, one GPU; the device-to-device copy bandwidth (bytes read + written / time) is
measured at the start and again at the end (their difference is the noise the ratios carry).

  gemm    llama3-8b's decode GEMMs (q/o, k/v, fused qkv, fused gate/up, down, down reading
          [gate | up] through SiLU * up, the 128256 x 4096 LM head) at M = 1, 2, 4, 8 rows,
          bf16: device µs per call of cuBLAS (F.linear; for the down with SiLU, the silu_mul
          kernel then F.linear, as the engine runs it without the kernel) and of the skinny
          GEMM (kernels/skinny_gemm.py, its default plan); each arm is one CUDA graph of calls
          cycling over copies of the weight that together exceed 3x the L2 (no call finds its
          weight in L2), the arms replayed in interleaved rounds: median [min-max] over rounds;
          achieved TB/s = (weight + x + y bytes) / µs, beside the copy bandwidth
  decode  llama3-8b-like@32 target-only, 64-token prompts, bs 1 and 8, 48 new tokens, CUDA
          graphs, bf16, page 16, overlap + zero_bubble, fused: p50 decode step of an engine
          with skinny_gemm off and one with it on (generates interleaved over rounds), floor /
          step (floor: models/floor.py, every parameter less the untied input embedding plus
          the context's KV, over the copy bandwidth); then one profiled graph-replayed decode
          step of each engine and bs: per kernel count / µs / share, grouped (GEMM, attention,
          norms / RoPE / elementwise, other), and the step's time outside kernels
  long    llama3.1-8b-like@32 target-only bs 1, 8k and 32k prompts, off vs on: p50 step, floor
          (weights + KV) / step
  tune    per GEMM at M = 1 and 8, a grid of skinny plans (BLOCK_N, BLOCK_K, splits, warps,
          stages) beside the default plan: the best plan and default / best (time-boxed: what
          is left of the budget)

Writes DIR/dense_floor.md (date, device, versions, commit, command, bandwidth, every table) and
DIR/dense_floor.json (the raw numbers), rewritten after each figure: a run cut short keeps
what it measured. Needs no trace reader beyond the standard library's json.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.bench_long_context import NEW, engine, floor_ms, prompts
from benchmarks.report import Report, free, run_figures
from mtplab.atomic import atomic_write_text
from mtplab.kernels import fused_ops as fo
from mtplab.kernels import skinny_gemm as sg
from mtplab.nogc import gc_paused
from mtplab.provenance import git_commit

FIGURES = ("gemm", "decode", "long", "tune")
DT = torch.bfloat16
H, I, V = 4096, 14336, 128256
# name -> (N, K, silu): llama3-8b's weights as the fused decoder layer reads them
GEMMS = {"q / o": (4096, H, False), "k / v": (1024, H, False), "qkv fused": (6144, H, False),
         "gate/up fused": (2 * I, H, False), "down": (H, I, False),
         "down + SiLU*up": (H, I, True), "LM head": (V, H, False)}
MS = (1, 2, 4, 8)
ARMS = (("off", False), ("on", True))
GROUPS = (("GEMM", ("nvjet", "gemm", "gemv", "cutlass", "splitkreduce", "xmma", "_skinny")),
          ("attention", ("_split_kernel", "_split_reduce", "_extend_kernel", "_det_kernel",
                         "_decode_kernel", "attn", "flash")),
          ("norms / RoPE / elementwise", ("_add_rmsnorm", "_rope", "_silu", "elementwise",
                                          "rmsnorm", "reduce_kernel", "_argmax", "topk")))
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second (CUDA events)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        b.copy_(a)
    e.record()
    e.synchronize()
    del a, b
    return 2 * nbytes * iters / (s.elapsed_time(e) / 1e3)


def spread(xs) -> str:
    return f"{np.median(xs):.1f} [{min(xs):.1f}-{max(xs):.1f}]"


class Run:
    """The report under construction: summary rows (Report), markdown sections, raw data."""

    def __init__(self, out_dir: Path, budget_s: float, argv: list[str]):
        self.out_dir = out_dir
        self.rep = Report(budget_s)
        self.sections: list[str] = []
        self.data: dict = {"figures": {}}
        try:
            import triton
            tv = triton.__version__
        except ImportError:
            tv = "not installed"
        self.head = [
            "# Dense decode at the HBM floor: cuBLAS vs the skinny GEMM",
            "",
            f"- date: {time.strftime('%Y-%m-%d %H:%M')}",
            f"- device: {torch.cuda.get_device_name()} "
            f"({torch.cuda.get_device_properties(0).multi_processor_count} SMs)",
            f"- torch {torch.__version__} (CUDA {torch.version.cuda}), triton {tv}",
            f"- commit: {git_commit() or 'unknown'}",
            f"- command: python -m benchmarks.bench_dense_floor {' '.join(argv)}"]
        self.data["meta"] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                             "triton": tv, "commit": git_commit(), "argv": argv}

    def section(self, title: str, lines: list[str]) -> None:
        self.sections.append("\n".join([f"## {title}", ""] + lines))
        print(self.sections[-1], flush=True)
        self.write()

    def write(self) -> None:
        doc = "\n".join(self.head + ["", "## Summary", "", self.rep.table(), ""]
                        + [s + "\n" for s in self.sections])
        atomic_write_text(self.out_dir / "dense_floor.md", doc)
        atomic_write_text(self.out_dir / "dense_floor.json",
                          json.dumps(self.data, indent=1, default=str))


# -- GEMMs ---------------------------------------------------------------------------------
def weight_copies(N: int, K: int) -> list[torch.Tensor]:
    """Enough [N, K] weights that together they exceed 3x the L2 (at least 2)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    n = max(2, min(64, math.ceil(3 * l2 / (N * K * 2))))
    return [torch.empty(N, K, dtype=DT, device="cuda").normal_(0, K ** -0.5) for _ in range(n)]


def capture(calls: list) -> torch.cuda.CUDAGraph:
    """One graph of every call, in order (warmed up and compiled on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls[:2]:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with gc_paused(), torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    return g


def replay_us(g: torch.cuda.CUDAGraph, calls: int, replays: int = 10) -> float:
    """Median device µs per call over `replays` replays of a graph of `calls` calls."""
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(1e3 * a.elapsed_time(b) / calls)
    return float(np.median(times))


def gemm_calls(ws, N: int, K: int, M: int, silu: bool, ws_list: list, skinny: bool,
               config=None) -> list:
    """The calls of one arm: one per weight copy, at least 8."""
    x = torch.randn(M, 2 * K if silu else K, device="cuda").to(DT)
    n = max(8, len(ws_list))
    if skinny:
        return [(lambda w=ws_list[i % len(ws_list)]: sg.skinny_gemm_triton(
            x, w, ws, silu_mul=silu, config=config)) for i in range(n)]
    if silu:
        return [(lambda w=ws_list[i % len(ws_list)]: F.linear(fo.silu_mul_triton(x), w))
                for i in range(n)]
    return [(lambda w=ws_list[i % len(ws_list)]: F.linear(x, w)) for i in range(n)]


def fig_gemm(run: Run, bw: float, rounds: int) -> None:
    ws = sg.Workspace(torch.device("cuda"))
    rows, raw = [], []
    for name, (N, K, silu) in GEMMS.items():
        copies = weight_copies(N, K)
        p = sg.plan(N, K, DT, ws.sms)
        for M in MS:
            arms = {}
            for arm in ("cuBLAS", "skinny"):
                calls = gemm_calls(ws, N, K, M, silu, copies, arm == "skinny")
                arms[arm] = (capture(calls), len(calls))
            t = {arm: [] for arm in arms}
            for _ in range(rounds):
                for arm, (g, n) in arms.items():
                    t[arm].append(replay_us(g, n))
            nbytes = N * K * 2 + M * (2 * K if silu else K) * 2 + M * N * 2
            c, s = float(np.median(t["cuBLAS"])), float(np.median(t["skinny"]))
            rows.append(f"| {name} | {N} x {K} | {M} | {spread(t['cuBLAS'])} | "
                        f"{spread(t['skinny'])} | {nbytes / c / 1e6:.2f} ({nbytes / c / 1e6 / (bw / 1e12):.2f}) | "
                        f"{nbytes / s / 1e6:.2f} ({nbytes / s / 1e6 / (bw / 1e12):.2f}) | "
                        f"**{c / s:.2f}** | {p.block_n}/{p.block_k}/{p.splits} |")
            raw.append(dict(gemm=name, N=N, K=K, M=M, silu=silu, bytes=nbytes,
                            cublas_us=t["cuBLAS"], skinny_us=t["skinny"],
                            plan=[p.block_n, p.block_k, p.splits, p.num_warps, p.num_stages]))
            print(rows[-1], flush=True)
            del arms
        del copies
        free()
    run.data["figures"]["gemm"] = raw
    tot = {a: sum(float(np.median(r[k])) for r in raw if r["M"] == 1 and r["gemm"] in
                  ("qkv fused", "q / o", "gate/up fused", "down + SiLU*up"))
           for a, k in (("cuBLAS", "cublas_us"), ("skinny", "skinny_us"))}
    run.rep.add("one fused decoder layer's GEMMs at M = 1 (qkv, o, gate/up, down + SiLU*up): "
                "cuBLAS / skinny", f"{tot['cuBLAS'] / tot['skinny']:.3f} "
                f"({tot['cuBLAS']:.1f} µs / {tot['skinny']:.1f} µs)")
    run.section("GEMMs: cuBLAS vs skinny GEMM, device µs per call", [
        f"bf16; {rounds} interleaved rounds, each the median of 10 graph replays; TB/s = "
        f"(weight + x + y bytes) / µs, in parentheses its share of the copy bandwidth "
        f"{bw / 1e12:.3f} TB/s; plan = BLOCK_N / BLOCK_K / splits of the default plan.", "",
        "| GEMM | N x K | M | cuBLAS µs med [min-max] | skinny µs med [min-max] | "
        "cuBLAS TB/s (of copy) | skinny TB/s (of copy) | cuBLAS / skinny | plan |",
        "|---|---|---|---|---|---|---|---|---|"] + rows)


def fig_tune(run: Run, bw: float) -> None:
    """Per GEMM at M = 1 and 8: the tiles x splits grid at 4 warps / 4 stages, then the best
    tile at other warps / stages; stops when the budget runs low."""
    ws = sg.Workspace(torch.device("cuda"))
    rows, raw = [], []
    tiles = [dict(block_n=bn, block_k=bk, splits=s) for bn in (16, 32, 64)
             for bk in (128, 256, 512) for s in (1, 2, 4, 8)]
    launch = [dict(num_warps=w, num_stages=st) for w, st in ((4, 3), (8, 4), (8, 3), (4, 2))]
    for name in ("q / o", "down + SiLU*up", "qkv fused", "gate/up fused", "LM head", "k / v"):
        N, K, silu = GEMMS[name]
        if run.rep.left() < 30:
            rows.append(f"| {name} | (budget spent) | | | | |")
            break
        copies = weight_copies(N, K)
        for M in (1, 8):
            results, seen = [], set()

            def measure(p) -> None:
                key = (p.block_n, p.block_k, p.splits, p.num_warps, p.num_stages)
                if key in seen or run.rep.left() < 25:
                    return
                seen.add(key)
                try:
                    calls = gemm_calls(ws, N, K, M, silu, copies, True, config=p)
                    results.append((replay_us(capture(calls), len(calls)), key))
                except Exception as e:      # a plan that does not compile (shared memory)
                    print(f"tune {name} M {M} {key}: {type(e).__name__}", flush=True)
            measure(sg.plan(N, K, DT, ws.sms))
            if not results:
                continue
            for kw in tiles:
                measure(sg.plan(N, K, DT, ws.sms, **kw))
            bn, bk, splits = min(results)[1][:3]
            for kw in launch:
                measure(sg.plan(N, K, DT, ws.sms, block_n=bn, block_k=bk, splits=splits, **kw))
            best, dflt = min(results), results[0]
            rows.append(f"| {name} | {M} | {dflt[0]:.1f} ({'/'.join(map(str, dflt[1]))}) | "
                        f"{best[0]:.1f} ({'/'.join(map(str, best[1]))}) | "
                        f"{N * K * 2 / best[0] / 1e6 / (bw / 1e12):.2f} | "
                        f"{dflt[0] / best[0]:.2f} | {len(results)} |")
            raw.append(dict(gemm=name, M=M, results=[(t, list(k)) for t, k in results]))
            print(rows[-1], flush=True)
        del copies
        free()
    run.data["figures"]["tune"] = raw
    run.section("Plan sweep: the skinny GEMM's default plan vs the best of a grid", [
        "Plan = BLOCK_N / BLOCK_K / splits / warps / stages; µs per call (graph of calls over "
        "weight copies beyond the L2, median of 10 replays); best weight TB/s as a share of "
        "the copy bandwidth; plans = how many were measured.", "",
        "| GEMM | M | default µs (plan) | best µs (plan) | best of copy | default / best | "
        "plans |", "|---|---|---|---|---|---|---|"] + rows)


# -- engines -------------------------------------------------------------------------------
def timed_generate(eng, bs: int, ctx: int) -> tuple[float, list]:
    """(p50 decode step ms, outputs) of a generate of bs prompts of ctx tokens, NEW new."""
    out = eng.generate(prompts(eng.model.config.vocab_size, bs, ctx), max_new_tokens=NEW,
                       ignore_eos=True)
    eng.check_invariants()
    return eng.stats()["decode_step_p50_ms"], out


def group_of(name: str) -> str:
    low = name.lower()
    for g, keys in GROUPS:
        if any(k in low for k in keys):
            return g
    return "other"


def profile_steps(eng, bs: int, ctx: int, steps: int = 3) -> dict:
    """{kernel name: (count, µs)} over `steps` profiled decode steps (after the prefills and
    a few decode steps), from the profiler's Chrome trace (standard-library json)."""
    for p in prompts(eng.model.config.vocab_size, bs, ctx, seed=5):
        eng.add_request(p, max_new_tokens=NEW, ignore_eos=True)
    for _ in range(bs + 4):
        eng.step()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as d:
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(steps):
                eng.step()
            torch.cuda.synchronize()
        path = Path(d) / "trace.json"
        prof.export_chrome_trace(str(path))
        raw = path.read_bytes()
        doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    while not eng.idle:
        eng.step()
    names: dict = {}
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("cat") in GPU_CATS:
            c, t = names.get(ev["name"], (0, 0.0))
            names[ev["name"]] = (c + 1, t + float(ev.get("dur", 0.0)))
    return {k: (c / steps, us / steps) for k, (c, us) in names.items()}


def kernel_tables(run: Run, label: str, per: dict, steps_ms: dict, floors: dict) -> None:
    """Per (arm, bs): the top kernels and the grouped split, beside the step and its floor."""
    lines = []
    groups = [g for g, _ in GROUPS] + ["other"]
    head = ("| arm, bs | step p50 µs | floor µs | kernels µs (count) | "
            + " | ".join(f"{g} µs" for g in groups) + " | outside kernels µs |")
    summary = [head, "|" + "---|" * (5 + len(groups))]
    for key, names in per.items():
        total = sum(us for _, us in names.values()) or 1.0
        count = sum(c for c, _ in names.values())
        by = {g: sum(us for n, (_, us) in names.items() if group_of(n) == g) for g in groups}
        step_us = 1e3 * steps_ms[key]
        summary.append(f"| {key} | {step_us:.0f} | {1e3 * floors[key]:.0f} | {total:.0f} "
                       f"({count:.0f}) | " + " | ".join(f"{by[g]:.0f} ({by[g] / total:.0%})"
                                                       for g in groups)
                       + f" | {step_us - total:.0f} |")
        lines += ["", f"{label}, {key}: one graph-replayed decode step, {count:.0f} GPU "
                      f"activities, {total:.0f} µs", "",
                  "| kernel | group | count / step | µs / step | share |", "|---|---|---|---|---|"]
        for n, (c, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:14]:
            lines.append(f"| {n[:90]} | {group_of(n)} | {c:.0f} | {us:.1f} | {us / total:.1%} |")
    run.section(f"Where a decode step's time goes: {label}", [
        "Device µs per step by kernel group (the profiler's GPU activities of 3 steps / 3); "
        "'outside kernels' = p50 step - kernel time: launch gaps and idle.", ""]
        + summary + lines)


def fig_decode(run: Run, bw: float, rounds: int, kernels: bool) -> None:
    model = "llama3-8b-like@32"
    engines = {arm: engine(model, 8, 64, skinny_gemm=on) for arm, on in ARMS}
    try:
        for eng in engines.values():          # warm-up: compiles, first replays
            for bs in (1, 8):
                timed_generate(eng, bs, 64)
        t = {(arm, bs): [] for arm in engines for bs in (1, 8)}
        same = {}
        for _ in range(rounds):
            for bs in (1, 8):
                outs = {}
                for arm, eng in engines.items():
                    ms, outs[arm] = timed_generate(eng, bs, 64)
                    t[(arm, bs)].append(ms)
                same[bs] = sum(a == b for a, b in zip(outs["off"], outs["on"]))
        rows, floors, steps = [], {}, {}
        for bs in (1, 8):
            fl, kv = floor_ms(engines["off"], bs, 64, bw)
            med = {arm: float(np.median(t[(arm, bs)])) for arm in engines}
            for arm in engines:
                floors[f"{arm}, bs {bs}"] = fl
                steps[f"{arm}, bs {bs}"] = med[arm]
                r = fl / med[arm]
                run.rep.add(f"{model} target-only 64-token prompts bs {bs}, skinny_gemm {arm}: "
                            f"floor / step", f"{r:.3f} (floor {fl:.3f} ms, step {med[arm]:.3f} "
                            f"ms [{min(t[(arm, bs)]):.3f}-{max(t[(arm, bs)]):.3f}])", ">= 0.85",
                            r >= 0.85)
            rows.append(f"| {bs} | {fl:.3f} ({kv:.3f}) | {spread([1e3 * x for x in t[('off', bs)]])} "
                        f"| {spread([1e3 * x for x in t[('on', bs)]])} | {fl / med['off']:.3f} | "
                        f"**{fl / med['on']:.3f}** | {med['off'] / med['on']:.3f} | "
                        f"{same[bs]}/{bs} |")
        run.data["figures"]["decode"] = {"steps_ms": {f"{a} bs {b}": v for (a, b), v in
                                                      t.items()}, "floor_ms": floors}
        run.section(f"Decode step: {model} target-only, 64-token prompts, skinny_gemm off vs on", [
            f"CUDA graphs, bf16, page 16, overlap + zero_bubble, fused; p50 decode step of a "
            f"generate of {NEW} new tokens, {rounds} rounds interleaved off / on: median "
            f"[min-max] of the rounds' p50 in µs. Floor = (every parameter less the untied "
            f"input embedding + the KV of prompt + {NEW // 2} tokens) / {bw / 1e12:.3f} TB/s. "
            "Greedy outputs off vs on in bf16 (identical requests of the last round) are "
            "reported, not required: the GEMMs round differently.", "",
            "| bs | floor ms (KV) | off step µs | on step µs | off floor / step | "
            "on floor / step | off / on | same outputs |", "|---|---|---|---|---|---|---|---|"]
            + rows)
        if kernels and run.rep.left() > 60:
            per = {}
            for arm, eng in engines.items():
                for bs in (1, 8):
                    per[f"{arm}, bs {bs}"] = profile_steps(eng, bs, 64)
            run.data["figures"]["kernels"] = per
            kernel_tables(run, f"{model} 64-token prompts", per, steps, floors)
    finally:
        for eng in engines.values():
            eng.close()
        del engines
        free()


def fig_long(run: Run, bw: float, rounds: int) -> None:
    model = "llama3.1-8b-like@32"
    engines = {arm: engine(model, 1, 32768, skinny_gemm=on) for arm, on in ARMS}
    try:
        for eng in engines.values():
            timed_generate(eng, 1, 512)
        rows, raw = [], {}
        for ctx in (8192, 32768):
            t = {arm: [] for arm in engines}
            for _ in range(rounds):
                for arm, eng in engines.items():
                    t[arm].append(timed_generate(eng, 1, ctx)[0])
            fl, kv = floor_ms(engines["off"], 1, ctx, bw)
            med = {arm: float(np.median(v)) for arm, v in t.items()}
            for arm in engines:
                r = fl / med[arm]
                run.rep.add(f"{model} target-only {ctx // 1024}k bs 1, skinny_gemm {arm}: "
                            "floor / step", f"{r:.3f} (floor {fl:.3f} ms of which KV {kv:.3f}; "
                            f"step {med[arm]:.3f} ms)", ">= 0.85", r >= 0.85)
            rows.append(f"| {ctx} | {fl:.3f} ({kv:.3f}) | {spread([1e3 * x for x in t['off']])} | "
                        f"{spread([1e3 * x for x in t['on']])} | {fl / med['off']:.3f} | "
                        f"**{fl / med['on']:.3f}** | {med['off'] / med['on']:.3f} |")
            raw[ctx] = dict(t, floor_ms=fl, kv_ms=kv)
        run.data["figures"]["long"] = raw
        run.section(f"Long context: {model} target-only bs 1, skinny_gemm off vs on", [
            f"As 'Decode step' (p50 of {NEW} new tokens, {rounds} interleaved rounds, µs); the "
            "floor includes the KV of the context.", "",
            "| prompt tokens | floor ms (KV) | off step µs | on step µs | off floor / step | "
            "on floor / step | off / on |", "|---|---|---|---|---|---|---|"] + rows)
    finally:
        for eng in engines.values():
            eng.close()
        del engines
        free()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "dense_floor_out"),
                    help="where dense_floor.md / .json go (default: $OUT, else ./dense_floor_out)")
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per arm")
    ap.add_argument("--no-kernel-table", action="store_true")
    ap.add_argument("--budget-s", type=float, default=330.0)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_dense_floor needs a CUDA device.", file=sys.stderr)
        return 2
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(out, a.budget_s, argv)
    bw = copy_bandwidth()
    run.data["copy_bw_start"] = bw
    run.rep.add("device-to-device copy bandwidth (start)", f"{bw / 1e12:.3f} TB/s")
    figs = [("gemm", lambda: fig_gemm(run, bw, a.rounds)),
            ("decode", lambda: fig_decode(run, bw, a.rounds, not a.no_kernel_table)),
            ("long", lambda: fig_long(run, bw, max(2, a.rounds // 2))),
            ("tune", lambda: fig_tune(run, bw))]
    run_figures(run.rep, figs, a.only, reserve_s=25)
    end = copy_bandwidth()
    run.data["copy_bw_end"] = end
    run.rep.add("device-to-device copy bandwidth (end)", f"{end / 1e12:.3f} TB/s "
                f"({100 * (end - bw) / bw:+.1f}% vs start)")
    run.write()
    print(f"\nwrote {out / 'dense_floor.md'}\n")
    print(run.rep.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
