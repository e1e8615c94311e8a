"""A/B of decode tok/s between this working tree and an earlier commit (a perf regression
check): the commit is exported with `git archive` into a temp folder, and each (tree, arm)
runs in its own process, interleaved A B A B ..., timeline and profiler off.

    python -m benchmarks.bench_ab --commit 409421f [--repeats 3] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import emit

ARMS = {"target-only bs1": dict(draft="none", bs=1),
        "frozen bs1": dict(draft="frozen_kv_mtp", fold_seed=True, bs=1),
        "frozen bs8": dict(draft="frozen_kv_mtp", fold_seed=True, bs=8)}

CHILD = r"""
import json, sys
from mtplab import Engine, RunConfig
from benchmarks.bench_profile import prompts
arm = json.loads(sys.argv[1]); bs = arm.pop("bs")
eng = Engine(RunConfig(model="tiny-code", context_len=1024, overlap=True, zero_bubble=True,
                       max_running_requests=bs, **arm))
ps = prompts(eng, bs)
eng.generate(ps, max_new_tokens=16, ignore_eos=True)
rates = []
for _ in range(5):
    eng.generate(ps, max_new_tokens=128, ignore_eos=True)
    rates.append(eng.stats()["decode_tok_per_s"])
print(json.dumps(rates))
"""


def run(tree: Path, arm: dict) -> list:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(arm)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commit", required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    here = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as d:
        old = Path(d)
        arch = subprocess.run(["git", "-C", str(here), "archive", a.commit], check=True,
                              capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=arch, check=True)
        trees = {a.commit: old, "working tree": here}
        res = {(t, k): [] for t in trees for k in ARMS}
        for _ in range(a.repeats):
            for k, arm in ARMS.items():
                for t, path in trees.items():
                    res[(t, k)] += run(path, dict(arm))
    rows = [f"Decode tok/s, {a.commit} vs the working tree (tiny-code, overlap + zero_bubble, "
            f"graphs, timeline off; {a.repeats} interleaved processes x 5 generates; median "
            "[min-max])", "", f"| arm | {a.commit} | working tree | ratio |", "|---|---|---|---|"]
    for k in ARMS:
        o, n = res[(a.commit, k)], res[("working tree", k)]
        mo, mn = statistics.median(o), statistics.median(n)
        rows.append(f"| {k} | {mo:.0f} [{min(o):.0f}-{max(o):.0f}] | {mn:.0f} "
                    f"[{min(n):.0f}-{max(n):.0f}] | {mn / mo:.2f}x |")
    emit("\n".join(rows), a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
