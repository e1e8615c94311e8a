"""Did decode (or, with `--group host`, a decode step's host time) get slower or faster since
a commit? The runner is mtplab/studies/host_path/ab.py (the grids, the hash seed and the
ratios' bootstrap intervals in its doc):

    python -m benchmarks.bench_ab --commit C [--repeats 3] [--out FILE]
    python -m benchmarks.bench_ab --commit C --group host [--repeats 3] [--out FILE]
        [--arms 1] [--granularity stage step] [--bs B ...] [--old-tree DIR]
"""
from mtplab.studies.host_path.ab import main

if __name__ == "__main__":
    raise SystemExit(main())
