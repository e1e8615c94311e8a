"""Deterministic mode: its cost and what it fixes, side by side in one run.

Table 1: tok/s (end to end and decode-only) at bs 1 and 32 of target-only and frozen_kv_mtp,
deterministic off vs on, CUDA graphs on, bf16; the four arms of a batch size are built once,
warmed up, then run interleaved `--repeats` times (medians); ratios on / off per draft.
Table 2: per mode, bs 1 / 8 / 32: requests whose greedy spec output diverges from target-only
at the same batch size (and their first divergence positions), for frozen topk 1, frozen
topk 4 and eagle. Deterministic mode must read 0 everywhere.

tiny-code, held-out stdlib prompts of ~256 bytes, greedy, ignore_eos.

    python -m benchmarks.bench_deterministic [--new-tokens 192] [--repeats 3] [--out t.md]
        [--out-dir DIR]

--out-dir writes the dated report of question `deterministic` (mtplab/studies/deterministic:
the results file, every repeat's tok/s and each divergence count, and the Markdown rendered
from it): DIR/deterministic/<YYYY-MM-DD>_<device>_<commit>.{json,md}. The commit is
MTP_GIT_COMMIT where set, else this checkout's HEAD; a tree with uncommitted changes is
refused before anything runs. `mtplab report deterministic` renders the report again.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

from mtplab.studies import deterministic as study
from mtplab.studies import reports as R
from mtplab.studies.run_cells import emit
from mtplab import Engine, RunConfig
from mtplab.lossless import divergence
from mtplab.models.corpus import heldout_snippets
from mtplab.models.zoo import build_target

SPEC = {"frozen": dict(draft="frozen_kv_mtp"),
        "frozen_topk4": dict(draft="frozen_kv_mtp", topk=4, num_draft_tokens=8),
        "eagle": dict(draft="eagle")}


def engine(a, bs: int, deterministic: bool, **kw) -> Engine:
    return Engine(RunConfig(model=a.model, dtype="bfloat16", page_size=16, context_len=1024,
                            max_running_requests=bs, deterministic=deterministic, **kw))


def throughput(a, prompts, data: list) -> list[str]:
    """The cost table's rows; `data` gets one record per arm and bs with every repeat's
    tok/s (studies/deterministic `results_doc`)."""
    rows = ["| bs | arm | default tok/s | deterministic tok/s | det / default | "
            "default decode tok/s | det decode tok/s | det / default (decode) |",
            "|---" * 8 + "|"]
    for bs in a.bs:
        arms = {(name, det): engine(a, bs, det, **kw)
                for name, kw in (("target-only", {}), ("frozen_kv_mtp", SPEC["frozen"]))
                for det in (False, True)}
        for eng in arms.values():                               # warm-up (JIT, allocator)
            eng.generate(prompts[:bs], max_new_tokens=16, ignore_eos=True)
        rates = {k: ([], []) for k in arms}
        for _ in range(a.repeats):
            for k, eng in arms.items():
                eng.generate(prompts[:bs], max_new_tokens=a.new_tokens, ignore_eos=True)
                eng.check_invariants()
                st = eng.stats()
                rates[k][0].append(st["tok_per_s"])
                rates[k][1].append(st["decode_tok_per_s"])
        for (name, det), (tps, dec) in rates.items():
            data.append({"bs": bs, "arm": name, "deterministic": det,
                         "tok_per_s": [float(x) for x in tps],
                         "decode_tok_per_s": [float(x) for x in dec]})
        for name in ("target-only", "frozen_kv_mtp"):
            off = [statistics.median(x) for x in rates[(name, False)]]
            on = [statistics.median(x) for x in rates[(name, True)]]
            rows.append(f"| {bs} | {name} | {off[0]:.0f} | {on[0]:.0f} | {on[0] / off[0]:.2f}x "
                        f"| {off[1]:.0f} | {on[1]:.0f} | {on[1] / off[1]:.2f}x |")
            print(rows[-1], flush=True)
        del arms
    return rows


def divergence_table(a, prompts, data: list) -> list[str]:
    """The divergence table's rows; `data` gets one record per mode, spec arm and bs."""
    batches = (1, 8, 32)
    rows = ["| mode | spec arm | " + " | ".join(f"bs {b}: diverging (first positions)"
                                             for b in batches) + " |", "|---" * 5 + "|"]
    n = max(batches)
    for det in (False, True):
        target = engine(a, n, det)
        want = {b: target.generate(prompts[:b], max_new_tokens=a.new_tokens, ignore_eos=True)
                for b in batches}
        del target
        for name, kw in SPEC.items():
            eng = engine(a, n, det, **kw)
            cells = []
            for b in batches:
                got = eng.generate(prompts[:b], max_new_tokens=a.new_tokens, ignore_eos=True)
                eng.check_invariants()
                k, firsts = divergence(got, want[b])
                data.append({"deterministic": det, "arm": name, "bs": b, "diverging": int(k),
                             "requests": b,
                             "first": sorted(int(f) for f in firsts if f is not None)})
                cells.append(f"{k}/{b} {sorted(f for f in firsts if f is not None)}")
            rows.append(f"| {'deterministic' if det else 'default'} | {name} | "
                        + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
            del eng
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-code")
    ap.add_argument("--bs", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the markdown tables here too")
    ap.add_argument("--out-dir", default=None, metavar="DIR",
                    help="write the dated report into DIR/deterministic/ (DIR: docs/results "
                         "for the kept answer)")
    argv = sys.argv[1:] if argv is None else argv
    a = ap.parse_args(argv)
    commit = None
    if a.out_dir is not None:
        commit = R.checkout_commit("bench_deterministic")      # refused before anything runs
        if commit is None:
            return 2
    tok = build_target(a.model, 0)[1]
    prompts = [tok.encode(t) for t in heldout_snippets(32, 256)]
    rows = [f"model {a.model}, bf16, page 16, CUDA graphs, greedy, {a.new_tokens} new tokens, "
            "held-out prompts of ~256 bytes", ""]
    cost, diverging = [], []
    rows += throughput(a, prompts, cost)
    rows += [""] + divergence_table(a, prompts, diverging)
    emit("\n".join(rows), a.out)
    if a.out_dir is not None:
        import torch
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        software = f"torch {torch.__version__}"
        if torch.cuda.is_available():
            import triton
            software += f"; triton {triton.__version__}"
        doc = study.results_doc(
            throughput=cost, divergence=diverging, date=time.strftime("%Y-%m-%d"),
            device=R.device_slug(name), device_name="" if name == "cpu" else name,
            commit=commit, model=a.model, new_tokens=a.new_tokens, repeats=a.repeats,
            command=shlex.join(["python", "-m", "benchmarks.bench_deterministic", *argv]),
            software=software)
        path = R.write(doc, study.render, Path(a.out_dir))
        print(f"wrote {path} and its results {path.with_suffix('.json').name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
