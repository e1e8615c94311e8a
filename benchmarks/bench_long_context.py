"""Long context at the HBM floor: decode step / floor and spec step / target step, H100.

    python -m benchmarks.bench_long_context [--out table.md] [--only NAME ...]
                                            [--kernel-table] [--budget-s 560]

Every figure is a decode step time (the p50 of Engine.stats()'s decode steps, 48 new tokens,
overlap + zero_bubble, CUDA graphs, bf16, page 16, fused) beside its floor: the bytes the step
reads (mtplab/models/floor.py: weights actually read + the KV of the mean step's context, a
sliding layer's window at most) / the device copy bandwidth measured in this process. One
engine per model and draft serves every context and batch size of a figure (the prompts are
prefilled anew per generate); that is why this script drives engines directly instead of
sweep cells, which would rebuild a 16 GB model and re-capture its graphs per cell.

  short     llama3.1-8b-like@16 and @32, 64-token prompts, bs 1 and 8: floor / step >= 0.85
  llama     llama3.1-8b-like@32 target-only, 8k and 32k prompts, bs 1 and 8: >= 0.80
  frozen    llama3.1-8b-like@32 frozen_kv_mtp (fold_seed, simulated accept 3.0) at 32k, bs 1
            and 8: spec step / target step <= 1.25 (topk 1, S 3) and <= 1.4 (topk 4, D 8)
  gemma     gemma4-31b-like@12 target-only, 8k and 32,656-token prompts (its 32,768 positions
            less the output), bs 1 and 8: >= 0.80 (its five sliding layers of six read their
            1024-entry window; their KV is stored in full)
--kernel-table: the device time of one profiled decode step per kernel (where the time goes),
for the llama 32k bs 1 step and the frozen one.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from mtplab.studies.run_cells import emit
from mtplab.studies.gpu_figures import Report, free, run_figures
from mtplab import Engine, RunConfig
from mtplab.studies.bench import hbm_bandwidth
from mtplab.models.floor import engine_step_bytes

FIGURES = ("short", "llama", "frozen", "gemma")
NEW = 48
GEMMA_32K = 32768 - NEW - 64       # its longest prompt: the preset has 32,768 positions
BASE = dict(page_size=16, overlap=True, zero_bubble=True, dtype="bfloat16")


def engine(model: str, bs: int, ctx: int, **kw) -> Engine:
    """An engine for prompts of up to `ctx` tokens at up to `bs` requests (KV for exactly
    that, plus the decode reserve)."""
    return Engine(RunConfig(model=model, max_running_requests=bs, context_len=ctx + NEW + 16,
                            max_total_tokens=bs * (ctx + NEW + 64), cuda_graph_max_bs=bs,
                            **BASE, **kw))


def prompts(V: int, bs: int, n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed + 7 * bs + n)
    return torch.randint(3, V, (bs, n), generator=g).tolist()


def step(eng: Engine, bs: int, ctx: int) -> float:
    """p50 decode step ms of a generate of bs prompts of ctx tokens, NEW new tokens."""
    eng.generate(prompts(eng.model.config.vocab_size, bs, ctx), max_new_tokens=NEW,
                 ignore_eos=True)
    eng.check_invariants()
    return eng.stats()["decode_step_p50_ms"]


def floor_ms(eng: Engine, bs: int, ctx: int, bw: float) -> tuple[float, float]:
    """(floor ms, its KV term ms) of a mean decode step of `step`'s generate."""
    b = engine_step_bytes(eng, bs, ctx + NEW / 2)
    return 1e3 * b.total / bw, 1e3 * b.kv / bw


def floor_figure(rep: Report, eng: Engine, label: str, bs: int, ctx: int, bw: float,
                 target: float) -> float:
    ms = step(eng, bs, ctx)
    fl, kv = floor_ms(eng, bs, ctx, bw)
    r = fl / ms
    rep.add(f"{label} ctx {ctx} bs {bs}: floor / step",
            f"{r:.3f} (floor {fl:.2f} ms of which KV {kv:.2f}; step {ms:.2f} ms)",
            f">= {target}", r >= target)
    return ms


def kernel_table(rep: Report, eng: Engine, label: str, bs: int, ctx: int) -> None:
    """Device time per kernel of 3 profiled decode steps (after the prefill)."""
    from benchmarks.bench_kernels import gpu_activities
    V = eng.model.config.vocab_size
    for p in prompts(V, bs, ctx, seed=5):
        eng.add_request(p, max_new_tokens=64, ignore_eos=True)
    for _ in range(bs + 4):                  # prefills and a few decode steps
        eng.step()

    def three():
        for _ in range(3):
            eng.step()
    n, names, _ = gpu_activities(three)
    while not eng.idle:
        eng.step()
    total = sum(us for _, us in names.values())
    lines = [f"Kernel table, {label}, ctx {ctx}, bs {bs}: 3 decode steps, {n} GPU activities, "
             f"{total / 3:.0f} µs per step", "", "| kernel | count / step | µs / step | share |",
             "|---|---|---|---|"]
    for k, (c, us) in sorted(names.items(), key=lambda kv: -kv[1][1])[:16]:
        lines.append(f"| {k[:90]} | {c / 3:.0f} | {us / 3:.1f} | {us / total:.1%} |")
    rep.notes.append("\n".join(lines))
    print(rep.notes[-1], flush=True)


def fig_short(rep, bw):
    for depth in (16, 32):
        eng = engine(f"llama3.1-8b-like@{depth}", 8, 64)
        for bs in (1, 8):
            floor_figure(rep, eng, f"target-only llama3.1-8b-like@{depth} (short)", bs, 64,
                         bw, 0.85)
        del eng
        free()


def fig_llama(rep, bw, steps: dict, kernels: bool):
    eng = engine("llama3.1-8b-like@32", 8, 32768)
    for ctx in (8192, 32768):
        for bs in (1, 8):
            steps[(ctx, bs)] = floor_figure(rep, eng, "target-only llama3.1-8b-like@32", bs,
                                            ctx, bw, 0.80)
    if kernels:
        kernel_table(rep, eng, "target-only llama3.1-8b-like@32", 1, 32768)
    del eng
    free()


def fig_frozen(rep, bw, steps: dict, kernels: bool):
    for topk, D, target in ((1, None, 1.25), (4, 8, 1.4)):
        eng = engine("llama3.1-8b-like@32", 8, 32768, draft="frozen_kv_mtp", fold_seed=True,
                     num_steps=3, topk=topk, num_draft_tokens=D, simulate_accept_len=3.0)
        for bs in (1, 8):
            ms = step(eng, bs, 32768)
            fl, _ = floor_ms(eng, bs, 32768, bw)
            base = steps.get((32768, bs))
            r = ms / base if base else float("nan")
            rep.add(f"frozen topk {topk} (D {eng.cfg.num_draft_tokens}) llama3.1-8b-like@32 "
                    f"ctx 32768 bs {bs}: spec step / target step",
                    f"{r:.3f} (spec {ms:.2f} ms, target {base or float('nan'):.2f} ms; "
                    f"spec floor {fl:.2f} ms, floor / step {fl / ms:.3f})",
                    f"<= {target}", r <= target)
        if kernels and topk == 1:
            kernel_table(rep, eng, "frozen topk 1 llama3.1-8b-like@32", 1, 32768)
        del eng
        free()


def fig_gemma(rep, bw):
    eng = engine("gemma4-31b-like@12", 8, GEMMA_32K)
    for ctx in (8192, GEMMA_32K):
        for bs in (1, 8):
            floor_figure(rep, eng, "target-only gemma4-31b-like@12", bs, ctx, bw, 0.80)
    del eng
    free()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the table here "
                    "(default: $OUT/bench_long_context.md when OUT is set)")
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    ap.add_argument("--kernel-table", action="store_true")
    ap.add_argument("--budget-s", type=float, default=560.0)
    a = ap.parse_args(argv)
    if a.out is None and os.environ.get("OUT"):
        a.out = str(Path(os.environ["OUT"]) / "bench_long_context.md")
    if not torch.cuda.is_available():
        print("bench_long_context needs a CUDA device.", file=sys.stderr)
        return 2
    rep = Report(a.budget_s)
    bw = hbm_bandwidth()
    rep.add("device-to-device copy bandwidth", f"{bw / 1e12:.3f} TB/s")
    steps: dict = {}
    figs = [("short", lambda: fig_short(rep, bw)),
            ("llama", lambda: fig_llama(rep, bw, steps, a.kernel_table)),
            ("frozen", lambda: fig_frozen(rep, bw, steps, a.kernel_table)),
            ("gemma", lambda: fig_gemma(rep, bw))]
    run_figures(rep, figs, a.only, reserve_s=40)
    emit(f"{torch.cuda.get_device_name()}, {time.strftime('%Y-%m-%d')}\n\n" + rep.table(),
         a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
