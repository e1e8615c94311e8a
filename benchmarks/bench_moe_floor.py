"""An MoE decode step against its floor, split vs grouped MoE kernels (question `moe_floor`;
the runner is mtplab/studies/moe/moe_floor_runner.py).

    PYTHONUNBUFFERED=1 python -m benchmarks.bench_moe_floor --out-dir DIR [--layers 30]
        [--batches 1 8 32] [--repeats 3] [--tokens 48] [--budget-s 400]
        [--only check ffn decode kernels]
"""
from mtplab.studies.moe.moe_floor_runner import main

if __name__ == "__main__":
    raise SystemExit(main())
