"""Where does a decode step's host time go, and does overlap + zero_bubble ever lose to the
plain loop? The runner is mtplab/studies/host_path/host_bench.py (its phases and flags in its
doc):

    python -m benchmarks.bench_host --out-dir DIR [--only prims table diag cprofile ratios
        gpubound] [--bs 1 8 32 64] [--repeats 5] [--drafts none frozen eagle]
        [--loops off on on+zb] [--granularities stage step] [--diag-draft D]
"""
from mtplab.studies.host_path.host_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
