"""Long context at the HBM floor: decode step / floor from 64-token prompts to 32k, spec step /
target step at 8k and 32k, where each microsecond of a step goes; writes the dated dense-floor
report of question `long_context` (the runner is mtplab/studies/long_context/floor_runner.py).

    python -m benchmarks.bench_long_context [--out-dir DIR] [--out table.md]
        [--only short llama frozen gemma] [--no-kernel-table] [--windows 3] [--budget-s 500]
"""
from mtplab.studies.long_context.floor_runner import main

if __name__ == "__main__":
    raise SystemExit(main())
