"""Long context at the HBM floor: decode step / floor from 64-token prompts to 32k, spec step /
target step at 8k and 32k, and where each microsecond of a step goes. Writes the dated
dense-floor report of question `long_context` (floor_report.py here: the results file and the
Markdown rendered from it) into the results folder --out-dir:

    DIR/long_context/<YYYY-MM-DD>_<device>_<commit>.{json,md}      (DIR default docs/results)

    python -m benchmarks.bench_long_context [--out-dir DIR] [--out table.md]
        [--only short llama frozen hot gemma window gemm attn] [--no-kernel-table] [--windows 3]
        [--budget-s 500]

The commit is MTP_GIT_COMMIT where set, else this checkout's HEAD; a tree with uncommitted
changes is refused before anything runs (a report names one commit).

A cell (model, arm, ctx, bs): one generate of bs prompts of ctx tokens (overlap +
zero_bubble, CUDA graphs, bf16, page 16, fused), the prompts prefilled once, then
`--windows` windows of about NEW decode steps each (the first WARMUP steps dropped): each
window's p50 step is one measurement, their spread the noise. Its floor: the bytes a mean step
reads (models/floor.py: weights actually read + the KV of the mean context, a sliding layer's
window at most) over the copy bandwidth measured in this process. One engine per model and
draft serves every context and batch size of a figure.

  short     llama3-8b-like@16 and @32 target-only, 64-token prompts, bs 1 and 8 (>= 0.85);
            beside each cell the same engine with decode_gemm="cublas" (what the engine's
            GEMM plan buys, models/gemm_plan.py), the plan itself recorded
  llama     llama3.1-8b-like@32 target-only, 8k and 32k prompts, bs 1 and 8 (>= 0.85)
  frozen    llama3.1-8b-like@32 frozen_kv_mtp (fold_seed, S 3, simulated accept 3.0) at 8k and
            32k, bs 1 and 8: spec step / target step (at 32k <= 1.25 with topk 1, <= 1.4 with
            topk 4 and 8 draft tokens)
  hot       the frozen topk-1 arm with a draft head over the HOT most frequent tokens
            (draft_vocab hot:32768, FR-Spec): the option that cuts the draft's three LM-head
            reads to a quarter; a random preset ranks its ids in order, so this is timing only
            (simulated acceptance does not move)
  gemma     gemma4-31b-like@12 target-only, 8k and 32k prompts (as long as its 32,768
            positions hold with the cell's new tokens: 32,288 at 3 windows), bs 1 and 8
  window    the frozen topk-1 arm with the draft attending only the last WINDOW entries of
            the target's KV (draft_kv_window 4096, a draft KV bounded as in MagicDec): the
            option that cuts the draft's three reads of the context's KV; timing only, as hot
  gemm      the decode GEMMs at M = 1 and 8 (llama3-8b-like's fused QKV, o_proj, fused gate/up,
            down, LM head) on cuBLAS beside the skinny Triton GEMM (kernels/gemv.py) at each
            launch shape of gemv_figures.launch_shapes(), each against its bytes floor
            (studies/decode_floor/gemv_figures.py): the faster one for the short-context GEMMs
  attn      the split-KV attention kernel alone over 32k rows (attention_figures.py VERIFY):
            the frozen arm's verify per layer (a chain of 4 nodes, topk 1; 8 nodes, topk 4)
            beside a decode's, bs 1 and 8, --windows repeats each, against the KV bytes floor;
            every launch shape on each shape but the bs-8 decode (does one read the rows
            faster, and is it the same for a decode and a verify, at bs 1 and 8?)
Kernel tables (on unless --no-kernel-table): every GPU activity of 3 profiled decode steps of
the short @32 bs-1 cell, the llama 32k bs-1 cell and the frozen topk-1 32k bs-1 cell.
"""
from __future__ import annotations

import argparse
import gc
import os
import shlex
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from mtplab import Engine, RunConfig
from mtplab.analysis.trace_io import GPU_ACTIVITY_CATS, load_trace
from mtplab.atomic import atomic_write_text
from mtplab.models.floor import engine_step_bytes
from mtplab.studies import reports as R
from mtplab.studies.gpu_figures import copy_bandwidth
from mtplab.studies.gpu_figures import free
from mtplab.studies.run_cells import TimeBox
from mtplab.studies.long_context import floor_report as study

FIGURES = ("short", "llama", "frozen", "hot", "gemma", "window", "gemm", "attn")
NEW = 48                           # decode steps per window
WARMUP = 4                         # decode steps dropped before the first window
PROFILED = 3                       # decode steps of a kernel table
GEMMA_POSITIONS = 32768           # gemma4-31b-like's positions: its longest prompt's bound
BASE = dict(page_size=16, overlap=True, zero_bubble=True, dtype="bfloat16")
FROZEN = dict(draft="frozen_kv_mtp", fold_seed=True, num_steps=3, simulate_accept_len=3.0)
HOT = "hot:32768"                  # the hot figure's draft vocabulary
WINDOW = 4096                      # the window figure's draft_kv_window


def engine(model: str, bs: int, ctx: int, tokens: int, **kw) -> Engine:
    """An engine for prompts of up to `ctx` tokens at up to `bs` requests generating up to
    `tokens` (KV for exactly that, plus the decode reserve)."""
    return Engine(RunConfig(model=model, max_running_requests=bs, context_len=ctx + tokens + 16,
                            max_total_tokens=bs * (ctx + tokens + 64), cuda_graph_max_bs=bs,
                            **BASE, **kw))


def prompts(V: int, bs: int, n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed + 7 * bs + n)
    return torch.randint(3, V, (bs, n), generator=g).tolist()


def tokens_per_step(eng: Engine) -> float:
    return eng.cfg.simulate_accept_len or 1.0


def new_tokens(eng: Engine, windows: int) -> int:
    """Tokens a cell generates: WARMUP + windows x NEW decode steps, one drain step more."""
    return int((WARMUP + windows * NEW + 2) * tokens_per_step(eng))


def windows_ms(step_times_s: list, windows: int) -> list[float]:
    """The p50 (ms) of each of `windows` consecutive windows of decode steps, the first
    WARMUP and the last (the drain) dropped."""
    xs = np.asarray(step_times_s[WARMUP:-1], dtype=float)
    if xs.size < windows:
        raise RuntimeError(f"{xs.size} decode steps for {windows} windows")
    return [1e3 * float(np.median(w)) for w in np.array_split(xs, windows)]


class Run(TimeBox):
    """The results doc (floor_report.py), filled figure by figure under a time box."""

    def __init__(self, doc: dict, budget_s: float, windows: int, kernel_tables: bool):
        super().__init__(budget_s)
        self.doc, self.windows, self.kernel_tables = doc, windows, kernel_tables

    def figure(self, name: str, fn, reserve_s: float = 40.0) -> None:
        """fn(self): its failure is recorded (traceback printed), never raised."""
        figs = self.doc["figures"]
        if self.left() < reserve_s:
            figs[name] = {"status": "skipped", "left_s": round(self.left(), 1)}
            print(f"{name}: SKIPPED (time box)", flush=True)
            return
        t0 = time.perf_counter()
        try:
            fn(self)
            figs[name] = {"status": "done", "seconds": round(time.perf_counter() - t0, 1)}
        except Exception as e:          # one figure failing must not hide the others
            figs[name] = {"status": "error", "error": f"{type(e).__name__}: {e}"[:300]}
            traceback.print_exc()
            gc.collect()
            if torch.cuda.is_available():
                free()

    def cell(self, eng: Engine, figure: str, model: str, arm: str, ctx: int, bs: int) -> dict:
        """One generate at (ctx, bs): its windows' p50 steps and its floor's bytes."""
        tokens = new_tokens(eng, self.windows)
        eng.generate(prompts(eng.model.config.vocab_size, bs, ctx), max_new_tokens=tokens,
                     ignore_eos=True)
        eng.check_invariants()
        ms = windows_ms(eng.scheduler.stats.decode_step_times_s, self.windows)
        b = engine_step_bytes(eng, bs, ctx + tokens / 2)
        row = {"figure": figure, "model": model, "arm": arm, "ctx": ctx, "bs": bs, "ms": ms,
               "floor_bytes": float(b.total), "kv_bytes": float(b.kv),
               "weight_bytes": float(b.weights), "topk": eng.cfg.topk,
               "draft_tokens": eng.cfg.num_draft_tokens if arm != "target" else None}
        if eng.cfg.draft_vocab != "full":
            row["draft_vocab"] = eng.cfg.draft_vocab
        if eng.cfg.draft_kv_window:
            row["draft_kv_window"] = eng.cfg.draft_kv_window
        self.doc["steps"].append(row)
        fl = 1e3 * b.total / study.bandwidth(self.doc)
        print(f"{model} {arm} ctx {ctx} bs {bs}: step p50 per window "
              f"{[round(x, 3) for x in ms]} ms, floor {fl:.3f} ms, floor / step "
              f"{fl / statistics.median(ms):.3f}", flush=True)
        return row

    def kernels(self, eng: Engine, label: str, model: str, arm: str, ctx: int) -> None:
        """Every GPU activity of PROFILED decode steps at bs 1, in launch order."""
        if not self.kernel_tables:
            return
        eng.add_request(prompts(eng.model.config.vocab_size, 1, ctx, seed=5)[0],
                        max_new_tokens=new_tokens(eng, 1), ignore_eos=True)
        stats = eng.scheduler.stats
        d0 = stats.decode_steps
        while stats.decode_steps - d0 < WARMUP:    # the prefill (its chunks), then decodes
            eng.step()
        acts = ordered_activities(lambda: [eng.step() for _ in range(PROFILED)])
        while not eng.idle:
            eng.step()
        eng.check_invariants()
        c = eng.model.config
        self.doc["kernels"].append({
            "label": label, "model": model, "arm": arm, "topk": eng.cfg.topk, "ctx": ctx,
            "bs": 1, "layers": c.num_hidden_layers, "steps": PROFILED, "kernels": acts,
            "proj_bytes": proj_bytes(eng)})
        print(f"kernel table {label}: {len(acts)} activities, "
              f"{sum(us for _, us in acts) / PROFILED:.0f} µs busy per step", flush=True)


def ordered_activities(fn) -> list[list]:
    """[name, µs] of every GPU activity of one fn() call, in launch order (the device
    synchronized before and after)."""
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with tempfile.TemporaryDirectory() as d:
        with torch.profiler.profile(activities=acts) as p:
            fn()
            torch.cuda.synchronize()
        path = Path(d) / "t.json"
        p.export_chrome_trace(str(path))
        tr = load_trace(path)
    sel = np.flatnonzero(tr.cat_mask(*GPU_ACTIVITY_CATS))
    sel = sel[np.argsort(tr.ts[sel], kind="stable")]
    return [[tr.name_of(i), float(tr.dur[i])] for i in sel]


def proj_bytes(eng: Engine) -> dict:
    """Bytes of each projection's weights over all layers (what one step reads of them)."""
    c = eng.model.config
    e = eng.model.lm_head.weight.element_size()
    H, d, L = c.hidden_size, c.head_dim, c.num_hidden_layers
    return {"qkv": e * L * H * d * (c.num_attention_heads + 2 * c.num_key_value_heads),
            "o_proj": e * L * c.num_attention_heads * d * H,
            "gate_up": e * L * 2 * c.intermediate_size * H,
            "down": e * L * c.intermediate_size * H,
            "lm_head": e * c.vocab_size * H}


# -- figures -----------------------------------------------------------------------------------
def fig_short(run: Run) -> None:
    """Each depth's engine (decode_gemm auto, its GEMM plan recorded) beside one on cuBLAS
    (the plan's side-by-side), cell by cell."""
    for depth in (16, 32):
        model = f"llama3-8b-like@{depth}"
        engs = {"target": engine(model, 8, 64, new_tokens_max(run)),
                study.CUBLAS_ARM: engine(model, 8, 64, new_tokens_max(run),
                                         decode_gemm="cublas")}
        run.doc["gemm_plan"][model] = engs["target"].gemm_plan
        for bs in (1, 8):
            for arm, eng in engs.items():
                run.cell(eng, "short", model, arm, 64, bs)
        if depth == 32:
            run.kernels(engs["target"], f"target-only {model}", model, "target", 64)
        del engs, eng
        free()


def new_tokens_max(run: Run) -> int:
    """The most tokens any cell generates (a spec cell's)."""
    return int((WARMUP + run.windows * NEW + 2) * FROZEN["simulate_accept_len"])


def fig_llama(run: Run) -> None:
    model = "llama3.1-8b-like@32"
    eng = engine(model, 8, 32768, new_tokens_max(run))
    for ctx in (8192, 32768):
        for bs in (1, 8):
            run.cell(eng, "llama", model, "target", ctx, bs)
    run.kernels(eng, f"target-only {model}", model, "target", 32768)
    del eng
    free()


def fig_frozen(run: Run) -> None:
    model = "llama3.1-8b-like@32"
    for topk, D in ((1, None), (4, 8)):
        if run.left() < 60:
            raise RuntimeError(f"time box reached before topk {topk}")
        eng = engine(model, 8, 32768, new_tokens_max(run), topk=topk, num_draft_tokens=D,
                     **FROZEN)
        arm = f"frozen_kv_mtp topk {topk}"
        for ctx in (8192, 32768):
            for bs in (1, 8):
                run.cell(eng, "frozen", model, arm, ctx, bs)
        if topk == 1:
            run.kernels(eng, f"{arm} {model}", model, arm, 32768)
        del eng
        free()


def frozen_option(run: Run, figure: str, option: str, **kw) -> None:
    """The frozen topk-1 arm with one draft option (kw) at 8k and 32k, bs 1 and 8."""
    model = "llama3.1-8b-like@32"
    eng = engine(model, 8, 32768, new_tokens_max(run), topk=1, **kw, **FROZEN)
    for ctx in (8192, 32768):
        for bs in (1, 8):
            run.cell(eng, figure, model, f"frozen_kv_mtp topk 1 {option}", ctx, bs)
    del eng
    free()


def fig_hot(run: Run) -> None:
    frozen_option(run, "hot", HOT, draft_vocab=HOT)


def fig_window(run: Run) -> None:
    frozen_option(run, "window", f"kv window {WINDOW}", draft_kv_window=WINDOW)


def fig_gemm(run: Run) -> None:
    from mtplab.studies.decode_floor.gemv_figures import measure
    got = measure([1, 8], with_configs=True, repeats=run.windows, bw=study.bandwidth(run.doc))
    run.doc["gemm"] = got["cells"]


def fig_attn(run: Run) -> None:
    from mtplab.studies.long_context.attention_figures import VERIFY, VERIFY_SWEEP, measure
    run.doc["attn"] = measure(VERIFY, VERIFY_SWEEP, study.bandwidth(run.doc), run.windows)


def gemma_long_ctx(run: Run) -> int:
    """gemma4-31b-like's longest prompt: its engine's context_len (prompt + the most tokens a
    cell generates + 16) within GEMMA_POSITIONS, a whole number of pages."""
    return (GEMMA_POSITIONS - new_tokens_max(run) - 16) // 16 * 16


def fig_gemma(run: Run) -> None:
    model = "gemma4-31b-like@12"
    long_ctx = gemma_long_ctx(run)
    eng = engine(model, 8, long_ctx, new_tokens_max(run))
    for ctx in (8192, long_ctx):
        for bs in (1, 8):
            run.cell(eng, "gemma", model, "target", ctx, bs)
    del eng
    free()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_long_context",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(R.RESULTS),
                    help="the results folder: the report goes into DIR/long_context/ "
                         "(default %(default)s)")
    ap.add_argument("--out", default=None, help="also write the report's Markdown here "
                    "(default: $OUT/bench_long_context.md when OUT is set)")
    ap.add_argument("--only", nargs="+", choices=FIGURES, default=list(FIGURES))
    ap.add_argument("--kernel-table", action=argparse.BooleanOptionalAction, default=True,
                    help="profile the kernel tables (default on)")
    ap.add_argument("--windows", type=int, default=3,
                    help="windows of decode steps per cell: the repeats (default 3)")
    ap.add_argument("--budget-s", type=float, default=500.0)
    a = ap.parse_args(argv)
    if a.out is None and os.environ.get("OUT"):
        a.out = str(Path(os.environ["OUT"]) / "bench_long_context.md")
    if not torch.cuda.is_available():
        print("bench_long_context needs a CUDA device.", file=sys.stderr)
        return 2
    commit = R.checkout_commit("bench_long_context")          # refused before anything runs
    if commit is None:
        return 2
    run = Run(study.new_doc(new_tokens=NEW, windows=a.windows, warmup_steps=WARMUP),
              a.budget_s, a.windows, a.kernel_table)
    run.doc["bandwidth"] = [float(copy_bandwidth()) for _ in range(3)]
    print(f"copy bandwidth {study.bandwidth(run.doc) / 1e12:.3f} TB/s", flush=True)
    figs = {"short": fig_short, "llama": fig_llama, "frozen": fig_frozen, "hot": fig_hot,
            "window": fig_window, "gemma": fig_gemma, "gemm": fig_gemm, "attn": fig_attn}
    for name in FIGURES:
        if name in a.only:
            run.figure(name, figs[name], reserve_s=90 if name == "frozen" else 40)
    gc.collect()
    doc = R.measured_here(run.doc, device="cuda", commit=commit, command=shlex.join(
        ["python", "-m", "benchmarks.bench_long_context", *argv]))
    path = R.write(doc, study.render, Path(a.out_dir))
    text = path.read_text()
    print(text, flush=True)
    if a.out:
        atomic_write_text(a.out, text)
    print(f"report: {path} (results: {path.with_suffix('.json').name})", flush=True)
    return 0
