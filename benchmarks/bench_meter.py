"""Bubble meter validation on the GPU: the runner of study `meter_trust`
(mtplab/studies/meter_trust/meter_bench.py says what each part measures and its target).

    python -m benchmarks.bench_meter --out $OUT/bench_meter.md [--out-dir docs/results]
    python -m benchmarks.bench_meter --pool run1.npz run2.npz    # saved --raw runs, pooled
"""
from mtplab.studies.meter_trust.meter_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
