"""What acceptance do the trained tiny-code drafts get, in and out of their training
distribution? (CPU, no timing.) The runner is mtplab/studies/drafts/acceptance.py:

    python -m benchmarks.bench_acceptance [--prompts 6] [--prompt-bytes 300] [--new-tokens 96]
        [--steps 3] [--package torch] [--show] [--out table.md]
"""
from mtplab.studies.drafts.acceptance import main

if __name__ == "__main__":
    raise SystemExit(main())
