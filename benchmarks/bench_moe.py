"""The MoE target and the reduced draft head in one process on one GPU: experts touched per
step, the floor of those experts, the draft vocabulary, the spec speedup (study `moe`; the
runner is mtplab/studies/moe/moe_figures.py).

    python -m benchmarks.bench_moe --out FILE [--budget-s 420] [--layers 30] [--only NAME ...]
"""
from mtplab.studies.moe.moe_figures import main

if __name__ == "__main__":
    raise SystemExit(main())
