"""Production-class decode: the HBM floor, kernels per layer and per step, fused vs unfused
side by side in one run on one GPU (study `decode_floor`; the runner is
mtplab/studies/decode_floor/kernel_figures.py).

    python -m benchmarks.bench_kernels [--out table.md] [--budget-s 300] [--only NAME ...]
"""
from mtplab.studies.decode_floor.kernel_figures import main

if __name__ == "__main__":
    raise SystemExit(main())
