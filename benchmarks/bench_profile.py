"""Can the instruments be trusted, and what do they cost? (GPU): the event timeline against
the profiler per stage, its overhead, host syncs, bubble timelines; study `meter_trust`
(mtplab/studies/meter_trust/profile_bench.py).

    python -m benchmarks.bench_profile --out-dir $OUT
"""
from mtplab.studies.meter_trust.profile_bench import main

if __name__ == "__main__":
    raise SystemExit(main())
