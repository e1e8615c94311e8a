"""Greedy acceptance of the trained `tiny-code` drafts, measured with the engine (CPU is fine).

Prompts: `--prompts` snippets of about `--prompt-bytes` bytes from (a) held-out CPython stdlib
files (mtplab.models.corpus split, this Python's stdlib) and (b) Python sources outside the
stdlib (an installed package, default torch). Each cell generates `--new-tokens` greedy tokens
per prompt (ignore_eos) and reports the mean accept length: tokens committed per verify,
bonus included. Every spec output is also checked against the target-only output. A runner
of study `drafts`; its entry point is benchmarks/bench_acceptance.py:

    python -m benchmarks.bench_acceptance [--out table.md]
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from mtplab import Engine, RunConfig
from mtplab.models.corpus import code_snippets, is_heldout, list_files, stdlib_root
from mtplab.studies.run_cells import emit

CELLS = [("frozen_kv_mtp", 1), ("frozen_kv_mtp", 2), ("frozen_kv_mtp", 4),
         ("eagle", 1), ("eagle", 4)]


def prompt_sets(n: int, nbytes: int, package: str) -> dict[str, list[str]]:
    root = stdlib_root()
    held = [f for f in list_files(root) if is_heldout(f)]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {package!r} is not installed; pass --package NAME.")
    proot = Path(spec.origin).parent
    pfiles = [f for f in list_files(proot) if "test" not in f]
    return {"stdlib held-out": code_snippets(root, held, n, nbytes),
            f"{package} (not stdlib)": code_snippets(proot, pfiles, n, nbytes)}


def measure(prompts: list[str], draft: str, topk: int, steps: int, new_tokens: int,
            reference: list[list[int]]) -> float:
    eng = Engine(RunConfig(model="tiny-code", draft=draft, topk=topk, num_steps=steps,
                           page_size=16, max_running_requests=len(prompts)))
    out = eng.generate(prompts, max_new_tokens=new_tokens, ignore_eos=True)
    eng.check_invariants()
    if out != reference:
        raise AssertionError(f"{draft} topk={topk}: speculative output differs from target-only")
    return eng.stats()["accept_len"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-bytes", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--package", default="torch")
    ap.add_argument("--show", action="store_true", help="print one continuation per set")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    a = ap.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    sets = prompt_sets(a.prompts, a.prompt_bytes, a.package)
    head = "| prompts | " + " | ".join(f"{d} k={k}" for d, k in CELLS) + " |"
    rows = [f"tiny-code, greedy, num_steps={a.steps}, {a.prompts} prompts x ~{a.prompt_bytes} "
            f"bytes, {a.new_tokens} new tokens; mean accept length (bonus incl.)", "",
            head, "|---" * (len(CELLS) + 1) + "|"]
    for name, prompts in sets.items():
        target = Engine(RunConfig(model="tiny-code", page_size=16,
                                  max_running_requests=len(prompts)))
        ref = target.generate(prompts, max_new_tokens=a.new_tokens, ignore_eos=True)
        if a.show:
            print(f"--- {name}: prompt ...{prompts[0][-120:]!r}\n+++ "
                  f"{target.tokenizer.decode(ref[0])!r}", flush=True)
        accs = [measure(prompts, d, k, a.steps, a.new_tokens, ref) for d, k in CELLS]
        rows.append(f"| {name} | " + " | ".join(f"{x:.2f}" for x in accs) + " |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    emit(table, a.out)
    return 0

