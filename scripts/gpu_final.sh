#!/usr/bin/env bash
# Re-check after the host-sync fixes: timeline overhead, syncs per mode, overlap + draft arms
# at bs 1 and the overlap timelines (short device budget).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtplab-gpu}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
python3 -m benchmarks.bench_profile --out-dir "$OUT" --only overhead syncs timelines 2>&1 | grep -v Warn | tail -25
python3 -m mtplab.cli bench --groups overlap drafts --bs 1 --repeats 1 --out "$OUT/bench.md" > "$OUT/bench.log" 2>&1; tail -30 "$OUT/bench.md"
