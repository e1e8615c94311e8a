#!/usr/bin/env bash
# The most important GPU checks when device time is short (one call, < 10 min):
# tests/gpu, instrumentation checks, core bench arms at bs 1/32, the transformers peer.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtplab-gpu}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
python3 -m pytest -q -x -p no:cacheprovider tests/gpu 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
python3 -m benchmarks.bench_profile --out-dir "$OUT" > "$OUT/bench_profile.log" 2>&1; tail -30 "$OUT/bench_profile.log"
python3 -m mtplab.cli bench --groups drafts overlap fold_seed --bs 1 32 --repeats 1 \
  --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1; tail -50 "$OUT/bench.md"
python3 -m benchmarks.bench_peer --out "$OUT/bench_peer.md" 2>&1 | tail -8
