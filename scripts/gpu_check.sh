#!/usr/bin/env bash
# GPU tests and benchmarks, one device call per phase; tables, logs and figures under $OUT
# (at most 8 files come back from a device call: each phase writes no more).
#   bash scripts/gpu_check.sh PHASE [ARGS]
#     tests             : pytest tests/gpu
#     check             : tests + host-time breakdown (bench_host) + instrumentation checks
#                         (bench_profile: stages, timeline overhead, host syncs, overlap
#                         timelines, a small real trace)                              ~5 min
#     stages            : tests + the per-stage timeline-vs-profiler check in every regime  ~4 min
#     bench [GROUP...]  : `mtplab bench` (default: every group; REPEATS=1, BS="1 8 32")
#                         drafts+overlap ~8 min, fold_seed+page_topk+shape ~5 min at repeats 1
#     notebooks         : 01_overlap and 03_page_topk under papermill with GPU parameters
#                         (papermill + ipykernel carried as wheels in .whl)             ~5 min
#     front             : `mtplab demo` on the GPU, then `mtplab analyze` and `mtplab plot` of
#                         its run folder (the two must agree on steps and wall)     ~2 min
#     ab [COMMIT]       : decode tok/s, working tree vs COMMIT (git archive), interleaved
#     peer              : transformers greedy / assisted generation on the same weights
#     decode            : eager vs CUDA-graph decode and the spec arms (bench_decode, bench_spec)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/mtplab-gpu}; mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then        # wheels missing on the device (orjson, papermill...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 - <<'PY' | tee "$OUT/device.txt"
import torch, triton, datetime, subprocess
print(datetime.date.today(), torch.__version__, "triton", triton.__version__,
      torch.cuda.get_device_name(), "SMs", torch.cuda.get_device_properties(0).multi_processor_count,
      "commit", subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True).stdout.strip() or "?")
PY
phase=${1:-}; shift || true
LOG="$OUT/run.log"
case $phase in
  tests)
    python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$LOG" | tail -15 ;;
  check)
    python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$LOG" | tail -15
    python3 -m benchmarks.bench_host --out "$OUT/bench_host.md" >> "$LOG" 2>&1
    python3 -m benchmarks.bench_profile --out-dir "$OUT" >> "$LOG" 2>&1
    grep -h "^#### " "$OUT/bench_host.md"; cat "$OUT/bench_profile.md" ;;
  stages)
    python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$LOG" | tail -15
    python3 -m benchmarks.bench_profile --out-dir "$OUT" --only stages >> "$LOG" 2>&1
    cat "$OUT/bench_profile.md" ;;
  bench)
    python3 -m mtplab.cli bench ${1:+--groups "$@"} --repeats "${REPEATS:-1}" \
      --bs ${BS:-1 8 32} --out "$OUT/bench.md" > "$LOG" 2>&1; cat "$OUT/bench.md" ;;
  notebooks)
    python3 -m papermill notebooks/01_overlap.ipynb "$OUT/01_overlap.ipynb" -p device cuda \
      -p model tiny-code -y "simulate_accept_len: null" -p prompt_len_tokens 128 \
      -p output_len_tokens 128 -y "batch_sizes: [1, 8, 32]" -p out_dir /tmp/nb/01 \
      --log-level WARNING > "$LOG" 2>&1
    python3 -m papermill notebooks/03_page_topk.ipynb "$OUT/03_page_topk.ipynb" -p device cuda \
      -p model tiny-code -y "simulate_accept_len: null" -p prompt_len_tokens 128 \
      -p output_len_tokens 128 -p batch_size 8 -y "page_sizes: [1, 16, 64]" \
      -y "topks: [1, 4]" -p out_dir /tmp/nb/03 --log-level WARNING >> "$LOG" 2>&1
    for n in 01 03; do cp /tmp/nb/$n/answer.json "$OUT/answer_$n.json" 2>/dev/null; done
    tail -5 "$LOG" ;;
  front)       # the demo, then analyze and plot of its run folder: one warm-up rule, same steps
    rm -rf /tmp/front && python3 -m mtplab.cli demo --trace-dir /tmp/front > "$OUT/demo.txt" 2>&1
    run=$(ls -d /tmp/front/demo-* | tail -1)
    python3 -m mtplab.cli analyze "$run" > "$OUT/analyze.txt" 2>&1
    python3 -m mtplab.cli plot "$run" --out "$OUT/plot_run.png" > "$LOG" 2>&1
    cp "$run/timeline.png" "$OUT/demo_timeline.png"
    grep -E "profiled steps|device bubble|USDT" "$OUT/demo.txt"; head -4 "$OUT/analyze.txt"
    tail -2 "$LOG" ;;
  ab)          # decode tok/s of the working tree vs an earlier commit (regression check)
    python3 -m benchmarks.bench_ab --commit "${1:-HEAD~1}" --out "$OUT/bench_ab.md" > "$LOG" 2>&1
    cat "$OUT/bench_ab.md" ;;
  peer)
    python3 -m benchmarks.bench_peer --out "$OUT/bench_peer.md" 2>&1 | tee "$LOG" | tail -8 ;;
  decode)
    python3 -m benchmarks.bench_decode --out "$OUT/bench_decode.md" > "$LOG" 2>&1
    python3 -m benchmarks.bench_spec --out "$OUT/bench_spec.md" >> "$LOG" 2>&1
    cat "$OUT/bench_decode.md" "$OUT/bench_spec.md" ;;
  *) echo "usage: bash scripts/gpu_check.sh tests|check|stages|bench [GROUP...]|notebooks|ab [COMMIT]|peer|decode"
     exit 2 ;;
esac
