"""The MoE speculation study in one process: one engine per model, routing and arm measures
every batch size, into the dated report of question `moe` (the runner is
mtplab/studies/moe/moe_spec_runner.py).

    python -m benchmarks.bench_moe_spec [--out-dir DIR] [--routings uniform zipf:1.2]
        [--models ...] [--arms 0 1 2 3 4] [--batches ...] [--budget-s 520]
"""
from mtplab.studies.moe.moe_spec_runner import main

if __name__ == "__main__":
    raise SystemExit(main())
