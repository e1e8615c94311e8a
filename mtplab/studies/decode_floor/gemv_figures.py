"""The decode GEMMs at M <= 8: cuBLAS (F.linear) beside the skinny Triton kernel
(kernels/gemv.py), in one process on one GPU, each against the bytes floor of its weight.

    python -m benchmarks.bench_gemv [--out DIR] [--rows 1 8] [--configs]

Shapes: llama3-8b-like's decode GEMMs (fused QKV, o_proj, fused gate/up, down, the LM head).
Each arm runs `copies` distinct weights in turn (together >= 1 GiB, so no read hits the 50 MB
L2), captured in one CUDA graph; its time is gpu_figures.graph_us's median device µs per call.
floor µs = N*K*2 bytes / the device copy bandwidth (bytes read + written per second) measured
in the same process, the floor of every study;
floor / µs is the fraction of the floor an arm reaches. With --configs, every launch shape of
launch_shapes() runs beside config()'s pick. Writes DIR/gemv.json and DIR/gemv.md (a table per
M). The long_context report's `gemm` figure runs the same measurement in its process.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics

SHAPES = (("qkv", 6144, 4096), ("o_proj", 4096, 4096), ("gate_up", 28672, 4096),
          ("down", 4096, 14336), ("lm_head", 128256, 4096))
ROTATE_BYTES = 1 << 30


def launch_shapes() -> list:
    """The Triton launch shapes --configs runs beside config()'s pick."""
    from ...kernels.gemv import GemvConfig
    return [GemvConfig(block_n=bn, block_k=bk, split_k=sk, num_warps=nw, num_stages=ns)
            for bn, bk, sk, nw, ns in ((16, 256, 1, 4, 4), (32, 256, 1, 4, 4), (64, 128, 1, 4, 4),
                                       (16, 512, 1, 4, 3), (16, 256, 2, 4, 4), (32, 128, 2, 4, 5),
                                       (16, 256, 4, 4, 4), (64, 256, 1, 8, 3))]


def _cell(name: str, n: int, k: int, m: int, ws: list, bw: float, sms: int,
          with_configs: bool, repeats: int) -> dict:
    """One shape at one M: every arm's device µs per call over the rotating weights ws."""
    import torch
    import torch.nn.functional as F

    from ...kernels import gemv as G
    from ..gpu_figures import graph_us
    x = torch.randn(m, k, device=ws[0].device, dtype=torch.bfloat16)
    want = F.linear(x, ws[0]).float()
    arms = {"cublas": lambda w: F.linear(x, w), "triton": lambda w: G._gemv_triton(x, w)}
    if with_configs:
        for c in launch_shapes():
            arms[f"triton {c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps} "
                 f"st{c.num_stages}"] = (lambda w, c=c: G._gemv_triton(x, w, c))
    cell = {"shape": name, "N": n, "K": k, "M": m, "floor_us": n * k * 2 / bw * 1e6,
            "config": vars(G.config(n, k, sms)), "arms": {}}
    for arm, f in arms.items():
        err = (f(ws[0]).float() - want).abs().max().item()
        us = [graph_us(lambda f=f: [f(w) for w in ws], reps=1, replays=20) / len(ws)
              for _ in range(repeats)]
        cell["arms"][arm] = {"us": us, "max_abs_err": err}
    return cell


def measure(rows: list[int], with_configs: bool, repeats: int = 3,
            bw: float | None = None) -> dict:
    """Every shape of SHAPES at each M of `rows`; `bw` the copy bandwidth (None: measured
    here)."""
    import torch

    from ..gpu_figures import copy_bandwidth
    dev = torch.device("cuda")
    bw = copy_bandwidth() if bw is None else bw
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    out = {"device": torch.cuda.get_device_name(dev), "copy_bw": bw, "sms": sms, "cells": []}
    for name, n, k in SHAPES:
        copies = max(2, math.ceil(ROTATE_BYTES / (n * k * 2)))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k ** 0.5
              for _ in range(copies)]
        for m in rows:
            cell = _cell(name, n, k, m, ws, bw, sms, with_configs, repeats)
            out["cells"].append(cell)
            print(_line(cell), flush=True)
        del ws
        torch.cuda.empty_cache()
    return out


def _line(c: dict) -> str:
    cub = statistics.median(c["arms"]["cublas"]["us"])
    tri = statistics.median(c["arms"]["triton"]["us"])
    return (f"{c['shape']:8s} M={c['M']}: cuBLAS {cub:7.1f} µs ({c['floor_us'] / cub:.3f} of "
            f"floor), triton {tri:7.1f} µs ({c['floor_us'] / tri:.3f}), cuBLAS / triton "
            f"{cub / tri:.3f}")


def render(doc: dict) -> str:
    lines = ["# Decode GEMMs at M <= 8: cuBLAS beside the skinny Triton kernel", "",
             f"- device: {doc['device']} ({doc['sms']} SMs); copy bandwidth "
             f"{doc['copy_bw'] / 1e12:.2f} TB/s", f"- command: `{doc.get('command', '')}`",
             "- each figure: the median of the repeats' median device µs per call; noise: "
             "(max - min) / median over the repeats", ""]
    for m in sorted({c["M"] for c in doc["cells"]}):
        lines += [f"## M = {m}", "", "| shape | N x K | floor µs | arm | µs | floor / µs | "
                  "noise | max abs err |", "|---|---|---|---|---|---|---|---|"]
        for c in (c for c in doc["cells"] if c["M"] == m):
            for arm, a in c["arms"].items():
                med = statistics.median(a["us"])
                lines.append(f"| {c['shape']} | {c['N']} x {c['K']} | {c['floor_us']:.1f} | "
                             f"{arm} | {med:.1f} | {c['floor_us'] / med:.3f} | "
                             f"{(max(a['us']) - min(a['us'])) / med:.1%} | "
                             f"{a['max_abs_err']:.2e} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_gemv", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gemv_out", help="folder for gemv.json and gemv.md")
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--configs", action="store_true",
                    help="every launch shape of launch_shapes() too")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("bench_gemv: needs a CUDA device (the figures are device µs); run it on a GPU.")
        return 2
    doc = measure(a.rows, a.configs, a.repeats)
    doc["command"] = "python -m benchmarks.bench_gemv " + " ".join(argv or [])
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gemv.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(a.out, "gemv.md"), "w") as f:
        f.write(render(doc))
    return 0
