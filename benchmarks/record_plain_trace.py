"""Record plain PyTorch traces (transformers' `generate` under torch.profiler) and print the
analyser's cause split; study `meter_trust` (mtplab/studies/meter_trust/plain_trace.py).

    python -m benchmarks.record_plain_trace --out-dir $OUT
"""
from mtplab.studies.meter_trust.plain_trace import main

if __name__ == "__main__":
    raise SystemExit(main())
