"""Do the health figures read right on a GPU? Writes the dated report of question `health`,
DIR/health/<YYYY-MM-DD>_<device>_<commit>.{json,md} (DIR default docs/results). The runner is
mtplab/studies/health/runner.py (its arms and checks in its doc):

    python -m benchmarks.bench_health [--repeats 3] [--out-len 64] [--prompt-len 128]
        [--no-moe] [--out-dir DIR]
    python -m benchmarks.bench_health --smoke --out-dir /tmp/h     # CPU: the path
"""
from mtplab.studies.health.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
