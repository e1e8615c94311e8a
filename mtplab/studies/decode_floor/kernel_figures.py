"""Production-class decode: the HBM floor, kernels per layer and per step, fused vs
unfused side by side in one run on one GPU.

    python -m benchmarks.bench_kernels [--out table.md] [--budget-s 300] [--only NAME ...]

Figures (each printed as it is measured, then one table: figure | value | target | PASS/MISS):
  bandwidth    device-to-device copy, bytes read + written / time (the floor's bandwidth)
  build        llama3-8b-like@16 build_target on the device (target <= 10 s)
  floor        target-only decode at bs 1, overlap + zero_bubble, CUDA graphs, fused:
               floor = the bytes a step reads (mtplab/models/floor.py: weights actually read,
               not the untied input-embedding table, + the KV in context) / bandwidth;
               ratio = floor / step (target >= 0.85) for llama3-8b-like@16 and
               gemma4-31b-like@8
  frozen       frozen_kv_mtp (fold_seed, S=3) with simulated accept 3.0 on llama3-8b-like@16:
               floor per token = the spec step's bytes (models/floor.py: target, S x (assistant
               + LM head), the KV both read) / accept_len / bandwidth;
               ratio = floor / measured ms per token (target >= 0.80)
  layers       (measured on the llama3-8b-like@16 engine of `floor`)
               kernels (GPU activities: kernels, memcpy, memset) per decoder layer per forward,
               from torch.profiler traces of one eager decode forward at two depths:
               (k(L) - k(L/2)) / (L - L/2), fused vs unfused (target <= 12), beside the block
               that repeats once per layer in the full-depth trace (analysis/kernels.py: the
               `kernels_per_layer` of `mtplab bench`, read here on the same forward); the fused
               forward's kernel table (where the time goes)
  busy         tiny-code frozen_kv_mtp (fold + overlap + zero_bubble), bs 1 and 32: device busy
               per decode step, kernels_per_step and kernels_per_layer of the profiled decode
               steps (sweep/metrics.py trace_metrics, as `mtplab bench` reads them), fused vs
               unfused (target: unfused / fused >= 2). Unfused = RunConfig(fused=False):
               the op-by-op model and the torch bodies of tree/accept/commit (the engine before
               the fused decoder layer)
  bf16         tiny-code target-only, bf16, fused vs unfused greedy over 256 tokens: the first
               divergent token (if any) is printed, never hidden
  topk         the draft's branch_topk at V=128256, bf16, K=1, N=1 and N=4 (torch log_softmax +
               topk vs the split-V kernel pair of kernels/topk.py), and the accept stage's argmax
               over fp32 [4, 128256] (torch vs kernel): device µs per call, each arm captured 20x
               in one CUDA graph, median over 50 replays (CUDA events); printed as reference /
               fused
Each figure runs under a shared time budget; a figure not reached prints SKIPPED and MISS.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from mtplab.studies.run_cells import emit
from mtplab.studies.gpu_figures import (Report, copy_bandwidth, decode_forward, depth, free,
                                        gpu_activities, graph_us, run_figures)
from mtplab.studies.gpu_figures import prompts as shared_prompts
from mtplab import Engine, RunConfig
from mtplab.analysis.kernels import layer_block
from mtplab.analysis.trace_io import GPU_ACTIVITY_CATS
from mtplab.models.floor import engine_step_bytes, module_bytes
from mtplab.sweep.metrics import trace_metrics

FIGURES = ("bandwidth", "build", "floor", "frozen", "layers", "busy", "bf16", "topk")
BASE = dict(page_size=16, context_len=1024, overlap=True, zero_bubble=True)
PROMPT = 64     # prompt tokens of every timed decode


def floor_bytes(eng: Engine, bs: int, new_tokens: int) -> int:
    """The bytes a mean decode step of `decode_ms_per_token`'s timed generate reads (prompt +
    half the output in context): the HBM floor's numerator, mtplab/models/floor.py."""
    return engine_step_bytes(eng, bs, PROMPT + new_tokens / 2).total


def prompts(V: int, bs: int, n: int = PROMPT, seed: int = 0) -> list[list[int]]:
    """gpu_figures.prompts with the timed decodes' prompt length by default."""
    return shared_prompts(V, bs, n, seed)


def decode_ms_per_token(eng: Engine, bs: int, new_tokens: int) -> tuple[float, dict]:
    V = eng.model.config.vocab_size
    eng.generate(prompts(V, bs), max_new_tokens=16, ignore_eos=True)          # warm-up
    eng.generate(prompts(V, bs, seed=1), max_new_tokens=new_tokens, ignore_eos=True)
    eng.check_invariants()
    st = eng.stats()
    return 1e3 * bs / st["decode_tok_per_s"], st


# -- figures -------------------------------------------------------------------------------
def fig_build(rep: Report) -> None:
    from mtplab.models.zoo import build_target
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model, _ = build_target("llama3-8b-like@16", 0, torch.device("cuda"), torch.bfloat16)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    rep.add("build llama3-8b-like@16 on the device", f"{dt:.1f} s "
            f"({module_bytes(model) / 1e9:.2f} GB)", "<= 10 s", dt <= 10.0)
    del model
    free()


def fig_floor(rep: Report, bw: float, model: str, unfused_too: bool, layers: bool) -> None:
    arms = [True, False] if unfused_too else [True]
    for fused in arms:
        if rep.left() < 45:
            rep.add(f"floor {model} fused={fused}", "SKIPPED (time box)", ">= 0.85", False)
            continue
        eng = Engine(RunConfig(model=model, max_running_requests=1, fused=fused, **BASE))
        floor = 1e3 * floor_bytes(eng, 1, 96) / bw
        step_ms, _ = decode_ms_per_token(eng, 1, 96)
        ratio = floor / step_ms
        label = f"target-only {model} bs 1 fused={fused}: floor/step"
        rep.add(label, f"{ratio:.3f} (floor {floor:.2f} ms, step {step_ms:.2f} ms)",
                ">= 0.85" if fused else "", ratio >= 0.85 if fused else None)
        if fused and layers:
            layer_table(rep, eng, model)
        del eng
        free()


def fig_frozen(rep: Report, bw: float) -> None:
    model = "llama3-8b-like@16"
    S = 3
    eng = Engine(RunConfig(model=model, max_running_requests=1, draft="frozen_kv_mtp",
                           fold_seed=True, num_steps=S, simulate_accept_len=3.0, fused=True,
                           **BASE))
    ms_tok, st = decode_ms_per_token(eng, 1, 120)
    acc = st["accept_len"]
    floor_tok = 1e3 * floor_bytes(eng, 1, 120) / acc / bw
    ratio = floor_tok / ms_tok
    rep.add(f"frozen_kv_mtp {model} accept {acc:.2f}: floor/token", f"{ratio:.3f} "
            f"(floor {floor_tok:.3f} ms/token, measured {ms_tok:.3f} ms/token)", ">= 0.80",
            ratio >= 0.80)
    del eng
    free()


def layer_counts(eng: Engine, cats: tuple = GPU_ACTIVITY_CATS) -> dict:
    """{fused: (activities per decoder layer from the two depths, activities outside the
    layers, layer_block (k, reps) of the full-depth forward's names, {name: (count, µs)} of the
    full-depth forward)} for fused True and False, on one eager bs-1 decode forward."""
    L = eng.model.config.num_hidden_layers
    half = max(1, L // 2)
    fn = decode_forward(eng)
    was = eng.model.fused
    out = {}
    try:
        with torch.no_grad():
            for fused in (True, False):
                eng.model.set_fused(fused)
                full, names, order = gpu_activities(fn, cats)
                with depth(eng.model, half):
                    part, _, _ = gpu_activities(fn, cats)
                codes = {n: i for i, n in enumerate(dict.fromkeys(order))}
                per = (full - part) / (L - half)
                out[fused] = (per, full - L * per, layer_block([codes[n] for n in order], L),
                              names)
    finally:
        eng.model.set_fused(was)
    return out


def layer_table(rep: Report, eng: Engine, model: str) -> None:
    """Kernels per decoder layer per forward, fused vs unfused, on this engine's model."""
    if rep.left() < 20:
        rep.add("kernels per layer", "SKIPPED (time box)", "<= 12", False)
        return
    got = layer_counts(eng)
    for fused in (True, False):
        per, outside, (block, reps), _ = got[fused]
        rep.add(f"kernels per decoder layer per forward, {model}, "
                f"{'fused' if fused else 'unfused'}",
                f"{per:.1f} (+ {outside:.0f} outside the layers; repeating block in the "
                f"trace: {f'{block} x {reps}' if block else 'none'})",
                "<= 12" if fused else "", per <= 12 if fused else None)
    kernel_names = got[True][3]
    total = sum(t for _, t in kernel_names.values()) or 1.0
    rows = sorted(kernel_names.items(), key=lambda kv: -kv[1][1])[:14]
    rep.notes += [f"Kernel table, {model}, fused, one eager bs-1 decode forward + sampling "
                  f"({sum(c for c, _ in kernel_names.values())} GPU activities, "
                  f"{total:.0f} µs):", "", "| kernel | count | µs | share |", "|---|---|---|---|"]
    rep.notes += [f"| {n[:90]} | {c} | {t:.1f} | {t / total:.1%} |" for n, (c, t) in rows]
    rep.notes.append("")


def busy_per_step(fused: bool, bs: int) -> dict:
    """trace_metrics (sweep/metrics.py) of the profiled decode steps of tiny-code
    frozen_kv_mtp, fold + overlap + zero_bubble: device_busy_step_ms, kernels_per_step,
    kernels_per_layer, bubble_steps, ..."""
    with tempfile.TemporaryDirectory() as d:
        eng = Engine(RunConfig(model="tiny-code", draft="frozen_kv_mtp", fold_seed=True,
                               max_running_requests=bs, fused=fused, profile=True,
                               profile_wait=6, profile_warmup=2, profile_active=10,
                               trace_dir=d, run_name="busy", **BASE))
        eng.generate(prompts(320, bs, 48), max_new_tokens=96, ignore_eos=True)
        eng.check_invariants()
        layers = eng.model.config.num_hidden_layers
        files = eng.finish()
        del eng
        return trace_metrics(str(files["trace0"]), 0, layers)


def fig_busy(rep: Report) -> None:
    for bs in (1, 32):
        if rep.left() < 40:
            rep.add(f"tiny-code busy per spec step bs {bs}", "SKIPPED (time box)", ">= 2x",
                    False)
            continue
        got = {f: busy_per_step(f, bs) for f in (False, True)}
        u, f = got[False], got[True]
        bu, bf = 1e3 * u["device_busy_step_ms"], 1e3 * f["device_busy_step_ms"]
        n = u["bubble_steps"]
        rep.add(f"tiny-code frozen bs {bs}: kernels_per_step unfused / fused",
                f"{u['kernels_per_step']:.0f} / {f['kernels_per_step']:.0f}")
        rep.add(f"tiny-code frozen bs {bs}: kernels_per_layer unfused / fused",
                f"{u['kernels_per_layer']:.4g} / {f['kernels_per_layer']:.4g}")
        rep.add(f"tiny-code frozen bs {bs}: device busy per spec step unfused / fused",
                f"{bu / bf:.2f}x ({bu:.0f} µs / {bf:.0f} µs, {n} steps)", ">= 2x",
                bu / bf >= 2.0)
        free()


def fig_bf16(rep: Report, tokens: int = 256) -> None:
    outs = {}
    for fused in (False, True):
        eng = Engine(RunConfig(model="tiny-code", max_running_requests=4, fused=fused,
                               dtype="bfloat16", **BASE))
        ps = ["def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n",
              "# Licensed under"]
        outs[fused] = eng.generate(ps, max_new_tokens=tokens, ignore_eos=True)
        eng.check_invariants()
        del eng
    firsts = []
    for i, (a, b) in enumerate(zip(outs[False], outs[True])):
        d = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
        firsts.append(d)
        print(f"bf16 request {i}: first divergence "
              f"{'none' if d is None else f'at token {d}: unfused {a[d]} fused {b[d]}'}")
    same = sum(d is None for d in firsts)
    rep.add(f"bf16 tiny-code fused vs unfused greedy, {tokens} tokens x 4",
            f"{same}/4 identical; first divergence per request: "
            f"{['none' if d is None else d for d in firsts]}")


def fig_topk(rep: Report, V: int = 128256) -> None:
    from mtplab.kernels import topk as T
    g = torch.Generator(device="cuda").manual_seed(0)
    for N in (1, 4):
        x = (3 * torch.randn(N, V, generator=g, device="cuda")).to(torch.bfloat16)
        got, want = T.logp_topk_triton(x, 1), T.logp_topk_ref(x, 1)
        same = torch.equal(got[1], want[1]) and torch.allclose(got[0], want[0], 1e-5, 1e-5)
        ref_us = graph_us(lambda x=x: T.logp_topk_ref(x, 1))
        fused_us = graph_us(lambda x=x: T.logp_topk_triton(x, 1))
        rep.add(f"branch_topk V={V} N={N} K=1 bf16: reference / fused",
                f"{ref_us / fused_us:.2f}x ({ref_us:.1f} µs / {fused_us:.1f} µs)"
                + ("" if same else "; RESULTS DIFFER"))
    x = 3 * torch.randn(4, V, generator=g, device="cuda")
    same = torch.equal(T.argmax_triton(x), x.argmax(-1))
    ref_us = graph_us(lambda: T.argmax_ref(x))
    fused_us = graph_us(lambda: T.argmax_triton(x))
    rep.add(f"accept argmax [4, {V}] fp32: reference / fused",
            f"{ref_us / fused_us:.2f}x ({ref_us:.1f} µs / {fused_us:.1f} µs)"
            + ("" if same else "; RESULTS DIFFER"))
    free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="also write the markdown table here "
                    "(default: $OUT/bench_kernels.md when OUT is set)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="time box for the whole run; figures not reached print SKIPPED")
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    a = ap.parse_args(argv)
    if a.out is None and os.environ.get("OUT"):
        a.out = str(Path(os.environ["OUT"]) / "bench_kernels.md")
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA device.", file=sys.stderr)
        return 2
    rep = Report(a.budget_s)
    bw = copy_bandwidth()
    rep.add("device-to-device copy bandwidth", f"{bw / 1e12:.3f} TB/s")
    steps = [("build", lambda: fig_build(rep)),
             ("floor", lambda: fig_floor(rep, bw, "llama3-8b-like@16", unfused_too=True,
                                         layers="layers" in a.only)),
             ("frozen", lambda: fig_frozen(rep, bw)),
             ("floor", lambda: fig_floor(rep, bw, "gemma4-31b-like@8", unfused_too=False,
                                         layers=False)),
             ("busy", lambda: fig_busy(rep)),
             ("bf16", lambda: fig_bf16(rep)),
             ("topk", lambda: fig_topk(rep))]
    run_figures(rep, steps, a.only, reserve_s=45)
    emit(rep.table(), a.out)
    return 0

