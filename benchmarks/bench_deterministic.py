"""Deterministic mode: its cost and what it fixes, side by side in one run; the runner of
study `deterministic` (mtplab/studies/deterministic/deterministic_bench.py).

    python -m benchmarks.bench_deterministic [--new-tokens 192] [--repeats 3] [--out t.md]
        [--out-dir docs/results]
"""
from mtplab.studies.deterministic.deterministic_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
