"""What does the non-finite check (the device-side NaN/inf flag on every step's logits and
hidden states) cost against the decode step it sits in? The runner is
mtplab/studies/decode_floor/nonfinite.py:

    python -m benchmarks.bench_nonfinite [--device cpu] [--reps 200] [--tokens 32]
"""
from mtplab.studies.decode_floor.nonfinite import main

if __name__ == "__main__":
    raise SystemExit(main())
