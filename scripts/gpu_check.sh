#!/usr/bin/env bash
# One device call: GPU tests, then the benchmarks; tables and logs under $OUT.
#   device run:  bash scripts/gpu_check.sh [quick]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtplab-gpu}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 - <<'PY' | tee "$OUT/device.txt"
import torch, triton, datetime
print(datetime.date.today(), torch.__version__, "triton", triton.__version__,
      torch.cuda.get_device_name(), "SMs", torch.cuda.get_device_properties(0).multi_processor_count)
PY
status=0
python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" || status=1
[ "${1:-}" = quick ] && exit $status
python3 -m benchmarks.bench_decode --out "$OUT/bench_decode.md" 2>&1 | tee "$OUT/bench_decode.log" || status=1
python3 -m benchmarks.bench_spec --out "$OUT/bench_spec.md" 2>&1 | tee "$OUT/bench_spec.log" || status=1
exit $status
