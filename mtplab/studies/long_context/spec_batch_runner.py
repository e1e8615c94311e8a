"""Long-context speculation by batch size: the spec speedup over target-only at each bs, and
the bs from which it stops paying. Writes the dated report of question `long_context_spec`
(spec_batch.py here: the results file and the Markdown rendered from it) into --out-dir:

    DIR/long_context_spec/<YYYY-MM-DD>_<device>_<commit>.{json,md}   (DIR default docs/results)

    python -m benchmarks.bench_spec_batch [--out-dir DIR] [--contexts 8192 32768]
        [--batches 1 2 4 8 16 32 64]
        [--arms target frozen eagle frozen-rates eagle-rates frozen-window]
        [--model llama3.1-8b-like@32] [--steps-per-level 36] [--windows 3] [--budget-s 520]

A run at a stamp (date, device, commit) that already has a report adds its cells to it (one
report covers both contexts when each runs in its own call). The commit is MTP_GIT_COMMIT where
set, else this checkout's HEAD; a tree with uncommitted changes is refused before anything runs.

One engine per (context, arm), overlap + zero_bubble, CUDA graphs, page 16, fused:
  - its largest batch B: the largest of --batches whose KV (B x (context + output)) fits the
    device beside the weights (models/memory.py estimate); larger ones are skipped, the reason
    stated;
  - B prompts of `context` tokens are prefilled once; request r is given as many tokens as
    --steps-per-level decode steps at each level b > r of the batch sizes, so the running
    batch falls from B to 1 level by level (the KV read per step does not depend on what the
    prompts hold);
  - every iteration is timed (host wall between step() returns: the GPU step when the loop is
    GPU-bound) beside the running count and the tokens out; an iteration counts for bs b when
    b requests ran in it and in the two before and after, with no prefill among them.
Arms: target-only; frozen_kv_mtp (fold_seed) and eagle, topk 1, 3 steps, at simulated
acceptance 3.0 ("frozen", "eagle") and at per-position rates RATES ("-rates"); and
"frozen-window", the frozen arm with its draft attending only the last WINDOW entries of the
context (draft_kv_window: a draft KV bounded as in MagicDec), measured last.
"""
from __future__ import annotations

import argparse
import gc
import shlex
import statistics
import sys
import traceback
from pathlib import Path

import torch

from mtplab import RunConfig
from mtplab.models.memory import (InsufficientMemoryError, device_free_bytes,
                                  estimate_memory)
from mtplab.studies import reports as R
from mtplab.studies.run_cells import TimeBox
from mtplab.studies.batch_levels import (request_tokens, run_levels, steady_cells,
                                         tokens_per_step)
from mtplab.studies.long_context import spec_batch as study

RATES = (0.844, 0.7097, 0.6427)      # the field's per-position acceptance, positions 1-3
ARMS = {                             # in the order a run measures them
    "target": {},
    "frozen": dict(draft="frozen_kv_mtp", fold_seed=True, simulate_accept_len=3.0),
    "eagle": dict(draft="eagle", simulate_accept_len=3.0),
    "frozen-rates": dict(draft="frozen_kv_mtp", fold_seed=True, simulate_accept_rates=RATES),
    "eagle-rates": dict(draft="eagle", simulate_accept_rates=RATES),
    "frozen-window": dict(draft="frozen_kv_mtp", fold_seed=True, simulate_accept_len=3.0,
                          draft_kv_window=4096),
}
SPEC = dict(num_steps=3, topk=1)
BASE = dict(page_size=16, overlap=True, zero_bubble=True)
FREE_SHARE = 0.92                    # of the device's free bytes an engine may plan for


def config(model: str, ctx: int, bs: int, tokens: int, arm: str, dtype: str,
           device: str) -> RunConfig:
    kw = ARMS[arm]
    return RunConfig(model=model, max_running_requests=bs, context_len=ctx + tokens + 16,
                     max_total_tokens=bs * (ctx + tokens + 64), cuda_graph_max_bs=bs,
                     dtype=dtype, device=device, **BASE, **kw, **(SPEC if kw else {}))


def largest_fit(model: str, ctx: int, batches: list[int], tokens_of, arm: str, dtype: str,
                device: str, free: float) -> tuple[int, dict]:
    """(the largest bs of `batches` whose engine fits `free` bytes, {bs: why it does not fit}
    for each larger one); (0, {...}) when none fits."""
    why = {}
    for bs in sorted(batches, reverse=True):
        cfg = config(model, ctx, bs, tokens_of(bs), arm, dtype, device)
        cfg.validate()
        need = estimate_memory(cfg).device_bytes
        if need <= free:
            return bs, why
        why[bs] = (f"bs {bs} x {ctx + tokens_of(bs)} tokens needs {need / 1e9:.3g} GB "
                   f"(weights + KV + workspace), {free / 1e9:.3g} GB are free")
    return 0, why


class Run(TimeBox):
    def __init__(self, doc: dict, a):
        super().__init__(a.budget_s)
        self.doc, self.a = doc, a

    def skip(self, ctx: int, arm: str, batches, reason: str) -> None:
        self.doc["cells"] += [{"ctx": ctx, "arm": arm, "bs": bs, "status": "skipped",
                               "reason": reason} for bs in batches]

    def engine_cell(self, ctx: int, arm: str) -> None:
        a, doc = self.a, self.doc
        per = tokens_per_step(ARMS[arm])
        batches = sorted(a.batches)

        def tokens_of(bs: int) -> int:
            return max(request_tokens(batches, bs, a.steps_per_level, per))

        free = (a.device_gb * 1e9 if a.device_gb else device_free_bytes(a.device)) * FREE_SHARE
        B, why = largest_fit(a.model, ctx, batches, tokens_of, arm, a.dtype, a.device, free)
        for bs in (b for b in batches if b > B):
            self.skip(ctx, arm, [bs], f"the KV does not fit the device: {why[bs]}")
        if B == 0:
            doc["engines"].append({"ctx": ctx, "arm": arm, "status": "skipped",
                                   "reason": why[min(batches)]})
            return
        while True:                    # the estimate can be short: one level down on OOM
            try:
                rows, build_s, prefill_s = self.measure(ctx, arm, B, batches, tokens_of, per)
                break
            except (torch.cuda.OutOfMemoryError, InsufficientMemoryError) as e:
                msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
                self.skip(ctx, arm, [B], f"the engine at bs {B} ran out of memory: {msg}")
                smaller = [b for b in batches if b < B]
                if not smaller:
                    doc["engines"].append({"ctx": ctx, "arm": arm, "status": "skipped",
                                           "reason": msg})
                    return
                B = smaller[-1]
        got = steady_cells(rows, [b for b in batches if b <= B], a.windows)
        for bs in (b for b in batches if b <= B):
            if bs in got:
                ms, tps, n = got[bs]
                doc["cells"].append({"ctx": ctx, "arm": arm, "bs": bs, "status": "ok",
                                     "ms": ms, "tokens_per_step": tps, "steps": n})
            else:
                self.skip(ctx, arm, [bs], f"fewer than {a.windows} steady steps at bs {bs}")
        doc["engines"].append({"ctx": ctx, "arm": arm, "status": "ok", "max_bs": B,
                               "build_s": round(build_s, 1), "prefill_s": round(prefill_s, 1),
                               "steps": len(rows)})
        print(f"{ctx} {arm}: bs up to {B}, build {build_s:.0f} s, prefill {prefill_s:.0f} s; "
              + ", ".join(f"bs {bs} {statistics.median(m):.3f} ms x {t:.1f} tok"
                          for bs, (m, t, _) in sorted(got.items())), flush=True)

    def measure(self, ctx: int, arm: str, B: int, batches: list[int], tokens_of,
                per: float) -> tuple[list, float, float]:
        """One engine at batch B: batch_levels.run_levels' (rows, build s, prefill s)."""
        a = self.a
        return run_levels(config(a.model, ctx, B, tokens_of(B), arm, a.dtype, a.device),
                          batches, a.steps_per_level, per, ctx, seed=ctx + B)

    def cell(self, ctx: int, arm: str) -> None:
        """engine_cell under the time box; an error is recorded, never raised."""
        if self.left() < self.a.reserve_s:
            self.skip(ctx, arm, self.a.batches, f"time box ({self.left():.0f} s left)")
            self.doc["engines"].append({"ctx": ctx, "arm": arm, "status": "skipped",
                                        "reason": "time box"})
            return
        try:
            self.engine_cell(ctx, arm)
        except Exception as e:        # one engine failing must not hide the others
            traceback.print_exc()
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            done = {c["bs"] for c in self.doc["cells"] if (c["ctx"], c["arm"]) == (ctx, arm)}
            self.skip(ctx, arm, [b for b in self.a.batches if b not in done], f"error {msg}")
            self.doc["engines"].append({"ctx": ctx, "arm": arm, "status": "error",
                                        "reason": msg})
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_spec_batch",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(R.RESULTS),
                    help="the results folder: the report goes into DIR/long_context_spec/ "
                         "(default %(default)s)")
    ap.add_argument("--model", default="llama3.1-8b-like@32")
    ap.add_argument("--contexts", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    ap.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    ap.add_argument("--steps-per-level", type=int, default=36)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--device-gb", type=float, default=None,
                    help="plan for this many GB free instead of what the device reports")
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--reserve-s", type=float, default=60.0,
                    help="an engine starts only with this much of the budget left")
    a = ap.parse_args(argv)
    if "target" not in a.arms:
        print("bench_spec_batch: the speedup is over target-only: keep `target` in --arms.",
              file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("bench_spec_batch needs a CUDA device (or --device cpu).", file=sys.stderr)
        return 2
    commit = R.checkout_commit("bench_spec_batch")          # refused before anything runs
    if commit is None:
        return 2
    run = Run(study.new_doc(model=a.model, batches=sorted(a.batches),
                            contexts=sorted(a.contexts), windows=a.windows,
                            steps_per_level=a.steps_per_level), a)
    run.doc["arm_settings"] = {arm: {**ARMS[arm], **(SPEC if ARMS[arm] else {})}
                               for arm in a.arms}
    for ctx in sorted(a.contexts):
        for arm in a.arms:
            run.cell(ctx, arm)
    doc = R.measured_here(run.doc, device=a.device, commit=commit, command=shlex.join(
        ["python", "-m", "benchmarks.bench_spec_batch", *argv]))
    path = R.write_merged(doc, study.render, Path(a.out_dir), study.merge)
    print(path.read_text(), flush=True)
    print(f"report: {path} (results: {path.with_suffix('.json').name})", flush=True)
    return 0
