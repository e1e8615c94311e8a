"""What does a reduced draft head (hot: FR-Spec, or centroids) cost in acceptance, and how many
emitted tokens escape the hot set? (CPU, no timing.) The runner is
mtplab/studies/drafts/head_vocab.py:

    python -m benchmarks.bench_draft_vocab [--prompts 6] [--prompt-bytes 300]
        [--new-tokens 96] [--package torch] [--out table.md]
"""
from mtplab.studies.drafts.head_vocab import main

if __name__ == "__main__":
    raise SystemExit(main())
