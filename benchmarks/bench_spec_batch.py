"""Long-context speculation by batch size: the spec speedup over target-only at 8k and 32k for
bs 1-64 (Frozen-KV MTP and EAGLE, simulated acceptance 3.0 and per-position rates), and the bs
from which it stops paying; writes the dated report of question `long_context_spec` (the
runner is mtplab/studies/long_context/spec_batch_runner.py).

    python -m benchmarks.bench_spec_batch [--out-dir DIR] [--contexts 8192 32768]
        [--batches 1 2 4 8 16 32 64] [--arms ...] [--budget-s 520]
"""
from mtplab.studies.long_context.spec_batch_runner import main

if __name__ == "__main__":
    raise SystemExit(main())
