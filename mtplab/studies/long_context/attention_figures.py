"""Decode-side attention at long context: how close is the split-KV kernel to the HBM floor?

    python -m benchmarks.bench_attention [--out table.md] [--sweep] [--shapes NAME ...]

Each shape is one attention call over paged KV (pages of 16, shuffled), bf16, timed as 20 calls
captured in one CUDA graph, median over 30 replays. Floor = the KV bytes the call must read
(per lane and KV head min(kv_len, window) entries x head_dim x 2 x 2 bytes) / the device copy
bandwidth measured in the same process. Arms, side by side on the same inputs:
  split      the engine's plan (kernels/triton_attention.py split_count)
  unsplit    num_splits=1: one program per (lane, KV head) over the whole row, no reduce
             pass (the layout of the decode and verify kernels before split-KV)
--sweep: for the first shapes, every launch shape (BLOCK_N, warps, stages) and programs-per-SM
in the grid below (chunks of at least MIN_CHUNK entries), µs each, then the best per shape:
what kernels/triton_attention.py LAUNCHES holds for the shape's class (decode or verify).

`measure` serves the `attn` figure of bench_long_context (floor_runner.py): the VERIFY shapes,
the frozen arm's verify attention (a chain of 4 nodes for topk 1, 8 nodes for topk 4) beside a
decode's over the same 32k rows, repeated, with the launch sweep on every shape but the bs-8
decode (at its floor already): a launch per shape class, decode and verify, bs 1 and 8.
"""
from __future__ import annotations

import argparse
import functools
import itertools

import torch

from mtplab.studies.run_cells import emit
from mtplab.studies.gpu_figures import graph_us
from mtplab.studies.bench import hbm_bandwidth
from mtplab.kernels import triton_attention as ta
from mtplab.kernels.attn_meta import AttnMeta

# name -> (kind, B, kv_len, Hq, Hkv, d, window); kind: decode (1 query), tree (D nodes),
# shared (K branches of a Frozen-KV draft step)
SHAPES = {
    "llama decode bs1 32k": ("decode", 1, 32768, 32, 8, 128, 0),
    "llama decode bs8 32k": ("decode", 8, 32768, 32, 8, 128, 0),
    "llama decode bs1 8k": ("decode", 1, 8192, 32, 8, 128, 0),
    "llama decode bs8 8k": ("decode", 8, 8192, 32, 8, 128, 0),
    "llama decode bs32 8k": ("decode", 32, 8192, 32, 8, 128, 0),
    "llama tree D4 bs1 32k": ("tree4", 1, 32768, 32, 8, 128, 0),
    "llama tree D8 bs1 32k": ("tree8", 1, 32768, 32, 8, 128, 0),
    "llama tree D4 bs8 32k": ("tree4", 8, 32768, 32, 8, 128, 0),
    "llama tree D8 bs8 32k": ("tree8", 8, 32768, 32, 8, 128, 0),
    "llama draft K4 bs1 32k": ("shared4", 1, 32768, 32, 8, 128, 0),
    "gemma decode bs1 32k": ("decode", 1, 32768, 32, 16, 256, 0),
    "gemma sliding decode bs1 32k": ("decode", 1, 32768, 32, 16, 256, 1024),
    "llama decode bs1 1k": ("decode", 1, 1024, 32, 8, 128, 0),
}
# the attn figure: a decode per layer beside the frozen arm's verify per layer, bs 1 and 8
VERIFY = ("llama decode bs1 32k", "llama tree D4 bs1 32k", "llama tree D8 bs1 32k",
          "llama decode bs8 32k", "llama tree D4 bs8 32k", "llama tree D8 bs8 32k")
VERIFY_SWEEP = ("llama decode bs1 32k", "llama tree D4 bs1 32k", "llama tree D8 bs1 32k",
                "llama tree D4 bs8 32k", "llama tree D8 bs8 32k")
SWEEP = dict(block_n=(32, 64, 128), warps=(4, 8), stages=(2, 3), per_sm=(2, 4, 8))


def make(kind: str, B: int, kv_len: int, Hq: int, Hkv: int, d: int, gen: torch.Generator):
    Q = 1 if kind == "decode" else int(kind[-1])
    page = 16
    pages = -(-(kv_len + Q) // page)
    perm = torch.randperm(B * pages, generator=gen).view(B, pages)
    j = torch.arange(pages * page)
    table = (perm[:, j // page] * page + j % page).to(torch.int32).cuda()
    N = B * pages * page
    k = torch.randn(N, Hkv, d, generator=gen).to("cuda", torch.bfloat16)
    v = torch.randn(N, Hkv, d, generator=gen).to("cuda", torch.bfloat16)
    q = torch.randn(B * Q, Hq, d, generator=gen).to("cuda", torch.bfloat16)
    shared = kind.startswith("shared")
    kv = kv_len if shared else kv_len + Q
    tree = None
    if kind.startswith("tree"):          # a chain: node i sees nodes 0..i
        tree = torch.tril(torch.ones(Q, Q, dtype=torch.bool)).expand(B, Q, Q).contiguous()
    pos = torch.full((B, Q), kv_len - 1) if shared else kv_len + torch.arange(Q).expand(B, Q)
    meta = AttnMeta(table, torch.arange(B, device="cuda"),
                    torch.full((B,), kv, dtype=torch.int32, device="cuda"),
                    torch.full((B,), Q, device="cuda"),
                    torch.arange(B + 1, device="cuda") * Q, pos.reshape(-1).cuda(), Q,
                    pages * page, tree_mask=None if tree is None else tree.cuda(),
                    kv_shared=shared)
    return q, k, v, meta


def splits(q: torch.Tensor, Hkv: int, meta: AttnMeta) -> int:
    """The engine's split count for these lanes (kernels/triton_attention.py split_plan)."""
    d = q.shape[-1]
    return ta.split_plan(meta, d, q.shape[1] // Hkv, Hkv, q.dtype, ta.num_sms(q.device))[3]


def time_us(fn) -> float:
    """µs per call: 20 calls captured in one CUDA graph, median over 30 replays."""
    return graph_us(fn, reps=20, replays=30)


def kv_bytes(B, kv_len, Hkv, d, window) -> int:
    return B * (min(kv_len, window) if window else kv_len) * Hkv * d * 2 * 2


def run_shape(name: str, bw: float, gen) -> list[str]:
    kind, B, kv_len, Hq, Hkv, d, window = SHAPES[name]
    q, k, v, meta = make(kind, B, kv_len, Hq, Hkv, d, gen)
    scale = d ** -0.5
    floor = kv_bytes(B, kv_len, Hkv, d, window) / bw * 1e6
    ns = splits(q, Hkv, meta)
    split = time_us(lambda: ta.paged_attention_triton(q, k, v, meta, scale, window))
    unsplit = time_us(lambda: ta.paged_attention_triton(q, k, v, meta, scale, window,
                                                        num_splits=1))
    row = [name, str(ns), f"{floor:.1f}", f"{split:.1f}", f"{floor / split:.2f}",
           f"{unsplit:.1f}", f"{floor / unsplit:.2f}", f"{unsplit / split:.1f}x"]
    print(" | ".join(row), flush=True)
    return row


def launches(name: str, gen) -> list[dict]:
    """Every launch shape of SWEEP on shape `name`: [{launch: "BLOCK_N/warps/stages/per_sm",
    us}] (a shape that does not launch, e.g. out of shared memory, is left out)."""
    kind, B, kv_len, Hq, Hkv, d, window = SHAPES[name]
    q, k, v, meta = make(kind, B, kv_len, Hq, Hkv, d, gen)
    scale = d ** -0.5
    cls = "decode" if kind.startswith(("decode", "shared")) else "verify"
    saved = {c: dict(t) for c, t in ta.LAUNCHES.items()}
    out = []
    try:
        for bn, w, st, per_sm in itertools.product(*SWEEP.values()):
            ta.LAUNCHES[cls][d] = ta.SplitLaunch(bn, w, st, per_sm, ta.MIN_CHUNK)
            try:
                us = time_us(lambda: ta.paged_attention_triton(q, k, v, meta, scale, window))
            except Exception as e:          # out of shared memory: not a candidate
                print(f"  {name} {bn}/{w}/{st}/{per_sm}: {type(e).__name__}", flush=True)
                continue
            print(f"  {name} BLOCK_N {bn} warps {w} stages {st} per_sm {per_sm}: {us:.1f} µs",
                  flush=True)
            out.append({"launch": f"{bn}/{w}/{st}/{per_sm}", "us": us})
    finally:
        for c, t in saved.items():
            ta.LAUNCHES[c].clear()
            ta.LAUNCHES[c].update(t)
    return out


def sweep_shape(name: str, bw: float, gen) -> list[str]:
    kind, B, kv_len, Hq, Hkv, d, window = SHAPES[name]
    floor = kv_bytes(B, kv_len, Hkv, d, window) / bw * 1e6
    best = min(launches(name, gen), key=lambda r: r["us"])
    return [name, best["launch"].replace("/", " / "), f"{best['us']:.1f}",
            f"{floor / best['us']:.2f}"]


def measure(shapes, sweep, bw: float, repeats: int) -> list[dict]:
    """The attn figure's cells: per shape its queries per lane, the engine's split plan, the
    floor (its KV bytes over `bw`), the engine's launch `repeats` times (µs each, the shapes
    interleaved), and for the shapes in `sweep` every launch shape's µs."""
    gen = torch.Generator().manual_seed(0)
    cells, calls = [], []
    for name in shapes:
        kind, B, kv_len, Hq, Hkv, d, window = SHAPES[name]
        q, k, v, meta = make(kind, B, kv_len, Hq, Hkv, d, gen)
        cells.append({"shape": name, "kind": kind, "bs": B, "kv_len": kv_len,
                      "queries": 1 if kind == "decode" else int(kind[-1]),
                      "splits": splits(q, Hkv, meta),
                      "floor_us": kv_bytes(B, kv_len, Hkv, d, window) / bw * 1e6, "us": []})
        calls.append(functools.partial(ta.paged_attention_triton, q, k, v, meta, d ** -0.5,
                                       window))
    for _ in range(repeats):
        for c, call in zip(cells, calls):
            c["us"].append(time_us(call))
    del calls
    for c in cells:
        if c["shape"] in sweep:
            c["sweep"] = launches(c["shape"], gen)
    return cells


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--sweep", nargs="*", default=None, choices=list(SHAPES),
                    help="launch-shape sweep on these shapes (none named: the first four)")
    a = ap.parse_args(argv)
    bw = hbm_bandwidth()
    gen = torch.Generator().manual_seed(0)
    lines = [f"device {torch.cuda.get_device_name()}; copy bandwidth {bw / 1e9:.0f} GB/s; "
             f"SMs {ta.num_sms(torch.device('cuda'))}", "",
             "| shape | splits | floor µs | split µs | floor/split | unsplit µs | floor/unsplit "
             "| unsplit / split |", "|---|---|---|---|---|---|---|---|"]
    for name in a.shapes:
        lines.append("| " + " | ".join(run_shape(name, bw, gen)) + " |")
    if a.sweep is not None:
        lines += ["", "| shape | best BLOCK_N / warps / stages / programs per SM | µs | "
                  "floor / µs |", "|---|---|---|---|"]
        for name in (a.sweep or list(SHAPES)[:4]):
            lines.append("| " + " | ".join(sweep_shape(name, bw, gen)) + " |")
    emit("\n".join(lines), a.out)
    return 0

