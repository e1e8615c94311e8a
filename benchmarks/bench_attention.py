"""Decode-side attention at long context: how close is the split-KV kernel to the HBM floor?
(study `long_context`; the runner is mtplab/studies/long_context/attention_figures.py)

    python -m benchmarks.bench_attention [--out table.md] [--sweep] [--shapes NAME ...]
"""
from mtplab.studies.long_context.attention_figures import main

if __name__ == "__main__":
    raise SystemExit(main())
