#!/usr/bin/env bash
# GPU tests and benchmarks in one device call; tables, logs and figures under $OUT.
#   bash scripts/gpu_check.sh [all|tests|bench|lean|recheck|quick]
#     tests   : tests/gpu + spec benchmark + instrumentation checks + the transformers peer
#     bench   : `mtplab bench` (every standard arm) + the GPU notebooks (01, 03)
#     all     : both (default; ~15 min -- split it where one call may run only 10)
#     lean    : tests/gpu + instrumentation checks + core bench arms at bs 1/32 + peer (<10 min)
#     recheck : timeline overhead, host syncs, overlap timelines, overlap/draft arms at bs 1
#     quick   : tests/gpu only
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtplab-gpu}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then        # wheels missing on the device (orjson, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 - <<'PY' | tee "$OUT/device.txt"
import torch, triton, datetime, subprocess
print(datetime.date.today(), torch.__version__, "triton", triton.__version__,
      torch.cuda.get_device_name(), "SMs", torch.cuda.get_device_properties(0).multi_processor_count)
PY
phase=${1:-all}
status=0
case $phase in all|tests|bench|lean|recheck|quick) ;; *) echo "unknown phase $phase"; exit 2;; esac
if [ "$phase" = lean ]; then
  python3 -m pytest -q -x -p no:cacheprovider tests/gpu 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
  python3 -m benchmarks.bench_profile --out-dir "$OUT" > "$OUT/bench_profile.log" 2>&1
  python3 -m mtplab.cli bench --groups drafts overlap fold_seed --bs 1 32 --repeats 1 \
    --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1; tail -50 "$OUT/bench.md"
  python3 -m benchmarks.bench_peer --out "$OUT/bench_peer.md" 2>&1 | tail -8
  exit 0
fi
if [ "$phase" = recheck ]; then
  python3 -m benchmarks.bench_profile --out-dir "$OUT" --only overhead syncs timelines 2>&1 | tail -25
  python3 -m mtplab.cli bench --groups overlap drafts --bs 1 --repeats 1 --out "$OUT/bench.md" \
    > "$OUT/bench.log" 2>&1; tail -30 "$OUT/bench.md"
  exit 0
fi
if [ "$phase" = all ] || [ "$phase" = tests ] || [ "$phase" = quick ]; then
  python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" || status=1
fi
if [ "$phase" = all ] || [ "$phase" = tests ]; then
  python3 -m benchmarks.bench_spec --out "$OUT/bench_spec.md" 2>&1 | tail -12 || status=1
  python3 -m benchmarks.bench_profile --out-dir "$OUT" 2>&1 | tail -40 || status=1
  python3 -m benchmarks.bench_peer --out "$OUT/bench_peer.md" 2>&1 | tail -8 || status=1
fi
if [ "$phase" = all ] || [ "$phase" = bench ]; then
  python3 -m mtplab.cli bench --repeats "${REPEATS:-1}" --out "$OUT/bench.md" 2>&1 | tail -80 || status=1
  if python3 -c "import papermill" 2>/dev/null; then
    for nb in 01_overlap 03_page_topk; do
      python3 -m papermill "notebooks/$nb.ipynb" "$OUT/$nb.ipynb" -p device cuda \
        -p out_dir "$OUT/$nb" --log-level WARNING 2>&1 | tail -3 || status=1
    done
  fi
fi
exit $status
