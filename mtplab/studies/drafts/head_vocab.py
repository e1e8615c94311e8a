"""Acceptance of tiny-code's drafts with a reduced head (`draft_vocab`), measured with the
engine (CPU is fine): the hot vocabulary's escape figure and what it costs in acceptance.

Prompts as acceptance.py here: held-out CPython stdlib snippets and snippets of an
installed package outside the stdlib (default torch). Each cell generates `--new-tokens` greedy
tokens per prompt and reports the mean accept length (bonus included) and, for a hot head, the
escape share: emitted tokens outside the hot set (the N most frequent ids of tiny-code's
training split, zoo/tiny-code/token_counts.json), each a position the draft cannot propose.
Every spec output is checked against the target-only output. Decode tok/s and the LM head's
share of draft time need the GPU: benchmarks/bench_moe.py --only vocab. A runner of study
`drafts`; its entry point is benchmarks/bench_draft_vocab.py:

    python -m benchmarks.bench_draft_vocab [--out table.md]
"""
from __future__ import annotations

import argparse

import torch

from mtplab import Engine, RunConfig
from mtplab.models.draft_vocab import escape_share
from mtplab.studies.drafts.acceptance import prompt_sets
from mtplab.studies.run_cells import emit

DRAFTS = ("frozen_kv_mtp", "eagle")
VOCABS = ("full", "hot:128", "hot:64", "hot:32", "centroids:16/4")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-bytes", type=int, default=300)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--package", default="torch")
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    a = ap.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    sets = prompt_sets(a.prompts, a.prompt_bytes, a.package)
    cols = [f"{d} {v}" for d in DRAFTS for v in VOCABS]
    rows = [f"tiny-code, greedy, num_steps=3, topk=1, {a.prompts} prompts x ~{a.prompt_bytes} "
            f"bytes, {a.new_tokens} new tokens; mean accept length (bonus incl.) / escape "
            "share (emitted tokens outside the hot set)", "",
            "| prompts | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, prompts in sets.items():
        kw = dict(model="tiny-code", page_size=16, max_running_requests=len(prompts))
        ref = Engine(RunConfig(**kw)).generate(prompts, a.new_tokens, ignore_eos=True)
        cells = []
        for d in DRAFTS:
            for v in VOCABS:
                eng = Engine(RunConfig(draft=d, draft_vocab=v, **kw))
                out = eng.generate(prompts, a.new_tokens, ignore_eos=True)
                eng.check_invariants()
                if out != ref:
                    raise AssertionError(f"{d} {v}: speculative output differs from "
                                         "target-only")
                ids = eng.draft_model.vocab_ids            # a hot set (None: no fixed set)
                esc = "-" if ids is None else f"{escape_share(ref, ids):.1%}"
                cells.append(f"{eng.stats()['accept_len']:.2f} / {esc}")
                eng.close()
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    emit("\n".join(rows), a.out)
    return 0

