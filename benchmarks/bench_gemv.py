"""The decode GEMMs at M <= 8: cuBLAS beside the skinny Triton kernel, each against its bytes
floor, in one run on one GPU (study `decode_floor`; the runner is
mtplab/studies/decode_floor/gemv_figures.py).

    python -m benchmarks.bench_gemv [--out DIR] [--rows 1 8] [--configs]
"""
from mtplab.studies.decode_floor.gemv_figures import main

if __name__ == "__main__":
    raise SystemExit(main())
