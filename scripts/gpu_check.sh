#!/usr/bin/env bash
# GPU tests and benchmarks as phases; each phase's tables, log and figures go under the output
# folder (-o DIR, else $OUT when set, else ./gpu_out).
#
#   bash scripts/gpu_check.sh [-o DIR] PHASE[:ARG,ARG...] [PHASE...]
#   bash scripts/gpu_check.sh tests bench:drafts,overlap stages
#   bash scripts/gpu_check.sh all                  # every phase in ALL, in order
#
# A phase is a function `phase_NAME` with a `#: NAME  description` line above it; its ARGs
# arrive as positional arguments. To add one, add such a block (nothing else to register).
# Environment: REPEATS and BS for `bench` (default: the grid files' repeats and batch sizes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-./gpu_out}
if [[ ${1:-} == -o ]]; then OUT_DIR=$2; shift 2; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
ALL=(tests stages instruments host bench peer notebooks)

#: tests  pytest tests/gpu (every GPU test); with pytest-xdist importable, GPU_TEST_WORKERS=5
#:        processes share the GPU (about 2 minutes on the H200 instead of 12), and the files of
#:        SERIAL_GPU_TESTS (timing: run-ahead, hidden host delay; memory baselines) run alone
#:        after them. A machine without it: carry the pytest-xdist and execnet wheels (.whl).
SERIAL_GPU_TESTS="tests/gpu/test_meter_gpu.py tests/gpu/test_overlap_hides_host_gpu.py
  tests/gpu/test_lifetime_gpu.py"
phase_tests() {
  if ! python3 -c "import xdist" 2>/dev/null; then
    python3 -m pytest -q -p no:cacheprovider tests/gpu
    return
  fi
  local f rc=0 ignore=()
  for f in $SERIAL_GPU_TESTS; do ignore+=(--ignore="$f"); done
  python3 -m pytest -q -p no:cacheprovider -n "${GPU_TEST_WORKERS:-5}" tests/gpu \
    "${ignore[@]}" || rc=1
  python3 -m pytest -q -p no:cacheprovider $SERIAL_GPU_TESTS || rc=1
  return $rc
}

#: bench  `mtplab bench` [GROUP,...] (default every group): ratio tables -> bench.md
phase_bench() {
  python3 -m mtplab.cli bench --no-progress ${1:+--groups "$@"} ${REPEATS:+--repeats "$REPEATS"} \
    ${BS:+--bs $BS} --dir "$OUT_DIR/bench" --out "$OUT_DIR/bench.md"
}

#: stages  per-stage event timeline vs profiler, every regime -> stages/bench_profile.md
phase_stages() {
  python3 -m benchmarks.bench_profile --out-dir "$OUT_DIR/stages" --only stages
}

#: instruments  timeline overhead, host syncs, bubble timelines (PNG), a small real trace
#:              -> instruments/bench_profile.md
phase_instruments() {
  python3 -m benchmarks.bench_profile --out-dir "$OUT_DIR/instruments" \
    --only overhead syncs timelines trace
}

#: host  where a decode step's host time goes, loop modes side by side -> host/bench_host.md
phase_host() {
  python3 -m benchmarks.bench_host --out-dir "$OUT_DIR/host"
}

#: ab  decode tok/s, working tree vs [COMMIT] (default HEAD~1) -> bench_ab.md
phase_ab() {
  python3 -m benchmarks.bench_ab --commit "${1:-HEAD~1}" --out "$OUT_DIR/bench_ab.md"
}

#: peer  transformers greedy / assisted generation on the same weights -> bench_peer.md
phase_peer() {
  python3 -m benchmarks.bench_peer --out "$OUT_DIR/bench_peer.md"
}

#: notebooks  [NN,...] notebooks/NN_*.ipynb under papermill with GPU parameters (default
#:            01,04,02: overlap, zero bubble, seed folding; any other if named, 01-04 with the
#:            sizes below, others with their defaults; 01, 02 and 04 once per shape of
#:            NB_SHAPES), one after another within NB_BUDGET_S -> notebooks/NN_name[-shape].ipynb
#:            (executed), notebooks/notebooks.tgz (each one's answer.json, PNG figures and
#:            sweep results.parquet); answers in notebooks.log
# Environment (defaults: the H100 run): NB_DEVICE=cuda NB_PROMPTS=code
# NB_SHAPES="tiny-code llama3-8b-like@16" (01, 02, 04 run at each: a host-bound and a GPU-bound
# shape; a shape preset MODEL@LAYERS runs random prompts at NB_SIM_ACCEPT=3.0 simulated
# acceptance, tiny-code its held-out code prompts at real acceptance)
# NB_PROMPT_LEN=128 NB_OUTPUT_LEN=128 NB_REPEATS=2 (interleaved rounds per cell, round 0
# profiled) NB_BS="[1, 8, 32]" (01: 18 cells) NB_BS02="[1, 32]" NB_GRAPHS02="[true]" (02: 8)
# NB_BS04=8 NB_REPEATS04=3 (04: 15 cells, round 0 under the sync debug mode is not timed)
# 08: its quick ladder, NB_REPEATS08=2 rounds, within what is left of the budget
# NB_BUDGET_S=520 (no notebook starts after it, a running one is stopped at it)
# NB_WORK=/tmp/mtplab_nb (the notebooks' out_dirs: sweeps, traces).
# A machine without papermill/ipykernel and no network (an offline H100): download their cp312
# wheels here into an ignored folder (echo /.whl_nb/ >> .git/info/exclude), carry it, and
# install them first on the device (34 wheels, 15 MB, the versions of `.[notebooks]`):
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
#     -d .whl_nb papermill nbclient nbformat jupyter_client jupyter_core ipykernel ipython \
#     comm debugpy pyzmq tornado traitlets nest_asyncio2 matplotlib_inline jedi parso \
#     pexpect ptyprocess prompt_toolkit wcwidth stack_data asttokens executing pure_eval \
#     ipython_pygments_lexers platformdirs entrypoints tenacity fastjsonschema jsonschema \
#     jsonschema_specifications referencing rpds_py orjson
#   device: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_nb/*.whl
#           && export PYTHONPATH=/tmp/site && bash scripts/gpu_check.sh -o $OUT notebooks
phase_notebooks() {
  python3 -c "import papermill, ipykernel" 2>/dev/null || {
    echo "papermill or ipykernel is not installed: pip install -e '.[notebooks]'"; return 1; }
  local nb="$OUT_DIR/notebooks" work=${NB_WORK:-/tmp/mtplab_nb} rc=0 deadline name left
  local kernels; kernels=$(mktemp -d)
  mkdir -p "$nb" "$work"
  # a kernelspec for this interpreter (the kernel inherits PYTHONPATH): no `python3`
  # kernelspec needs to be installed on the machine
  python3 -c "import sys; from mtplab.sweep.kernel import local_kernel; local_kernel(sys.argv[1])" \
    "$kernels" || return 1
  export JUPYTER_PATH="$kernels${JUPYTER_PATH:+:$JUPYTER_PATH}"
  local common=(-k mtplab-python --no-progress-bar --log-level WARNING
    -p device "${NB_DEVICE:-cuda}"
    -p prompt_len_tokens "${NB_PROMPT_LEN:-128}" -p output_len_tokens "${NB_OUTPUT_LEN:-128}")
  local reps=(-p repeats "${NB_REPEATS:-2}")
  deadline=$((SECONDS + ${NB_BUDGET_S:-520}))
  for n in ${@:-01 04 02}; do
    local found=(notebooks/"$n"_*.ipynb) args=() shapes=("")
    if [[ ! -f ${found[0]} ]]; then
      echo "notebooks: no notebook $n (have: $(cd notebooks && ls [0-9]*.ipynb | tr '\n' ' '))"
      rc=1; continue
    fi
    name=$(basename "${found[0]}" .ipynb)
    case $n in       # GPU-sized parameters; any other notebook runs with its defaults
      01) args=("${reps[@]}" -y "batch_sizes: ${NB_BS:-[1, 8, 32]}") ;;
      02) args=("${reps[@]}" -y "batch_sizes: ${NB_BS02:-[1, 32]}"
            -y "cuda_graphs: ${NB_GRAPHS02:-[true]}") ;;
      03) args=(-p batch_size 8 -y "page_sizes: [1, 16, 64]" -y "topks: [1, 4]") ;;
      04) args=(-p repeats "${NB_REPEATS04:-3}" -p batch_size "${NB_BS04:-8}") ;;
      08) args=(-p repeats "${NB_REPEATS08:-2}" -p ladder quick) ;;
    esac
    case $n in 01|02|04) read -ra shapes <<< "${NB_SHAPES:-tiny-code llama3-8b-like@16}" ;; esac
    for shape in "${shapes[@]}"; do
      local run=$name sargs=()
      if [[ -n $shape ]]; then
        run=$name-${shape//@/-}
        if [[ $shape == *@* ]]; then      # a shape preset: random weights, simulated acceptance
          sargs=(-p model "${shape%@*}" -p layers "${shape#*@}"
                 -p simulate_accept_len "${NB_SIM_ACCEPT:-3.0}" -p prompts random)
        else
          sargs=(-p model "$shape" -y "simulate_accept_len: null" -p prompts "${NB_PROMPTS:-code}")
        fi
      fi
      left=$((deadline - SECONDS))
      if ((left < 30)); then
        echo "== notebook $run: skipped, ${NB_BUDGET_S:-520} s budget spent"; rc=1; continue
      fi
      [[ $n == 08 ]] && sargs+=(-p budget_s "$((left - 40))")
      local t0=$SECONDS
      rm -rf "${work:?}/$run"
      echo "== notebook $run (at most $left s)"
      timeout -k 10 "$left" python3 -m papermill "notebooks/$name.ipynb" "$nb/$run.ipynb" \
        "${common[@]}" "${args[@]}" "${sargs[@]}" -p out_dir "$work/$run" \
        || { echo "$run failed"; rc=1; }
      echo "== notebook $run: $((SECONDS - t0)) s"
      if [[ -f $work/$run/answer.json ]]; then
        cat "$work/$run/answer.json"; echo
        python3 -c "import json, sys; print(json.load(open(sys.argv[1])).get('summary', ''))" \
          "$work/$run/answer.json"
      fi
    done
    # the small products of every notebook so far, in one file (bulky traces stay in $work)
    (cd "$work" && find . -maxdepth 3 \( -name answer.json -o -name '*.png' \
      -o -path '*/sweep/results.parquet' \) -print0 | tar czf "$nb/notebooks.tgz" --null -T -)
  done
  rm -rf "$kernels"
  return $rc
}

#: regime  the regime map's quick ladder (tiny-code bs 1, llama3-8b-like@4 bs 1, @16 bs 8; every
#:         arm, 2 rounds: 72 cells, about 12 s each on an H100; mtplab bench --groups regime
#:         --quick) within REGIME_BUDGET_S=470, then the map and the what-if validation
#:         -> regime.md, regime/regime.png, regime/results.parquet, regime/traces/<cell>/ (each
#:         cell's step profile); the same -o folder with its regime/results.jsonl and
#:         regime/traces carried back resumes the cells left (two runs cover the ladder);
#:         REGIME_QUICK=0 runs the whole ladder instead, REGIME_ONLY="AXIS=V,... ..." a subset
#:         of either (e.g. REGIME_QUICK=0 REGIME_ONLY="layers=32 batch_size=8 repeat=0,1")
phase_regime() {
  local quick=--quick
  [[ ${REGIME_QUICK:-1} == 0 ]] && quick=
  python3 -m mtplab.cli bench --no-progress --groups regime $quick \
    --budget-s "${REGIME_BUDGET_S:-470}" ${REGIME_ONLY:+--only $REGIME_ONLY} \
    --dir "$OUT_DIR" --out "$OUT_DIR/regime.md"
}

#: whatif  the what-if predictor both ways: the regime ladder's quick grid at its GPU-heavy
#:         rung (llama3-8b-like@16 bs 8; WHATIF_ONLY="AXIS=V,... ..." another), every arm
#:         (Frozen-KV on / zb folded and unfolded, each sub-knob off; target-only) x 2
#:         rounds within WHATIF_BUDGET_S=440; each arm predicted toward each knob it can
#:         flip, both ways, the error per direction -> whatif.md (its last table),
#:         regime/whatif_validation.csv, regime/traces/<cell>/ (every step profile)
phase_whatif() {
  python3 -m mtplab.cli bench --no-progress --groups regime --quick \
    --only ${WHATIF_ONLY:-model=llama3-8b-like layers=16 batch_size=8} \
    --budget-s "${WHATIF_BUDGET_S:-440}" --dir "$OUT_DIR" --out "$OUT_DIR/whatif.md"
}

#: schedule  the speculation schedule: its GPU tests (no capture after start, fp32 lossless
#:           across bucket switches), then `mtplab bench --groups schedule` (the break-even
#:           surface, the best schedule as YAML, its gain over the best static setting;
#:           tiny-code then llama3-8b-like@32) in what is left of SCHEDULE_BUDGET_S=520
#:           -> schedule.md, schedule/{results.json,grid.yaml,surface.png,*.schedule.yaml};
#:           `mtplab report spec_schedule --from OUT/schedule` writes its dated report; the
#:           same -o folder with schedule/results.json carried back resumes; SCHEDULE_TESTS=0
#:           skips the tests, SCHEDULE_QUICK=1 runs the group's quick variant
phase_schedule() {
  local t0=$SECONDS budget=${SCHEDULE_BUDGET_S:-520}
  if [[ ${SCHEDULE_TESTS:-1} != 0 ]]; then
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_spec_schedule_gpu.py || return 1
  fi
  python3 -m mtplab.cli bench --no-progress --groups schedule \
    ${SCHEDULE_QUICK:+--quick} --budget-s $(( budget - (SECONDS - t0) )) \
    --dir "$OUT_DIR" --out "$OUT_DIR/schedule.md"
}

#: determ  deterministic mode: the bf16 spec == target-only grid (bs 1/8/32) and the attention
#:         kernels (GPU tests), then its cost and the default mode's divergence
#:         -> bench_deterministic.md
phase_determ() {
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_deterministic_gpu.py \
    tests/gpu/test_triton_attention_gpu.py || return 1
  python3 -m benchmarks.bench_deterministic --out "$OUT_DIR/bench_deterministic.md"
}

#: dask2  examples/grids/gpu_dask2.yaml (8 cells) with `--executor dask` on 2 GPUs, then on 1:
#:        wall times and their ratio (a 2-GPU host with distributed installed) -> dask2.md
phase_dask2() {
    python3 -c "import distributed" 2>/dev/null || {
      echo "dask2: distributed is not installed: pip install -e '.[distributed]'"; return 2; }
    G=examples/grids/gpu_dask2.yaml; rm -rf /tmp/sw; : > "$OUT_DIR/dask2_sweeps.log"
    for n in 2 1; do
      t0=$(date +%s.%N)
      python3 -m mtplab.cli sweep "$G" --out /tmp/sw/w$n --executor dask --workers $n \
        --no-progress >> "$OUT_DIR/dask2_sweeps.log" 2>&1
      echo "$n $(date +%s.%N) $t0" >> /tmp/sw/walls
    done
    python3 - "$OUT_DIR/dask2.md" <<'PY'
import sys, pandas as pd
walls = {int(n): float(t1) - float(t0) for n, t1, t0 in
         (ln.split() for ln in open("/tmp/sw/walls"))}
two, one = (pd.read_parquet(f"/tmp/sw/w{n}/results.parquet").set_index("cell_id").sort_index()
            for n in (2, 1))
same = list(two.index) == list(one.index) and (two["status"] == one["status"]).all()
ok = two["status"] == "ok"
tok = (two.loc[ok, "decode_tok_per_s"] / one.loc[ok, "decode_tok_per_s"]).median()
lines = [f"# dask2: {len(two)} cells of examples/grids/gpu_dask2.yaml",
         f"- statuses (2 workers): {two['status'].value_counts().to_dict()}; same cells and "
         f"statuses on 1 worker: {same}",
         f"- workers used: 2 workers {sorted(two['worker'].unique())}, "
         f"1 worker {sorted(one['worker'].unique())}",
         f"- wall: 2 GPUs {walls[2]:.1f} s, 1 GPU {walls[1]:.1f} s, "
         f"ratio 1 GPU / 2 GPUs = {walls[1] / walls[2]:.2f} (ideal 2.00)",
         f"- median decode tok/s per cell, 2-GPU run / 1-GPU run = {tok:.3f} "
         "(1.00: concurrent cells do not disturb each other)"]
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
}

#: meter  bubble meter: GPU tests, then bench_meter (stamp resolution and wake-up latency, stamp
#:        device cost, planted delays in two regimes and against the profiler, meter vs
#:        profiler, overhead; PASS/MISS per target) -> bench_meter.md; plain PyTorch traces
#:        (transformers generate) with their cause split -> plain_*.pt.trace.json.gz
phase_meter() {
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_meter_gpu.py tests/gpu/test_graphs_gpu.py \
    tests/instrument/test_meter.py \
    || return 1
  python3 -m benchmarks.bench_meter --out "$OUT_DIR/bench_meter.md" || return 1
  python3 -m benchmarks.record_plain_trace --out-dir "$OUT_DIR"
}

#: kernels  fused kernels: GPU tests, then bench_kernels (HBM-floor ratios, kernels per layer,
#:          device busy per spec step fused vs unfused, preset build time, bf16 divergence;
#:          PASS/MISS per target) -> bench_kernels.md
phase_kernels() {
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fused_gpu.py || return 1
  timeout 400 python3 -m benchmarks.bench_kernels --budget-s 300 \
    --out "$OUT_DIR/bench_kernels.md"
}

#: moe    MoE target and reduced draft heads: GPU tests (compiled fused-MoE kernels, head_dim-512
#:        attention in graphs, deterministic bf16 spec == target-only), then bench_moe (experts
#:        per step, floor of the experts touched, spec speedup MoE vs dense, draft_vocab tok/s;
#:        needs about 110 GiB: an H200 at full depth) -> bench_moe.md
phase_moe() {
  python3 -m pytest -q -p no:cacheprovider tests/gpu/test_moe_gpu.py || return 1
  timeout 560 python3 -m benchmarks.bench_moe --budget-s 480 --out "$OUT_DIR/bench_moe.md"
}

#: reports  the dated reports whose runners write them (set MTP_GIT_COMMIT on a copied tree:
#:          a report names one clean commit): REPORTS="moe_floor floor health" by default,
#:          any of moe_floor (bench_moe_floor), floor (bench_long_context: the dense floor),
#:          spec8k / spec32k (bench_spec_batch at one context; the second adds its cells to
#:          the first's report when its json is in OUT/long_context_spec/), health
#:          (bench_health) -> OUT/<question>/<YYYY-MM-DD>_<device>_<commit>.{md,json}
phase_reports() {
  local r rc=0
  for r in ${REPORTS:-moe_floor floor health}; do
    case $r in
      moe_floor) timeout 560 python3 -m benchmarks.bench_moe_floor --budget-s 420 \
                   --out-dir "$OUT_DIR" ;;
      floor)     timeout 570 python3 -m benchmarks.bench_long_context --only short llama frozen hot gemm \
                   --budget-s 480 --out-dir "$OUT_DIR" ;;
      spec8k)    timeout 580 python3 -m benchmarks.bench_spec_batch --contexts 8192 \
                   --budget-s 500 --out-dir "$OUT_DIR" ;;
      spec32k)   timeout 580 python3 -m benchmarks.bench_spec_batch --contexts 32768 \
                   --budget-s 500 --out-dir "$OUT_DIR" ;;
      health)    python3 -m benchmarks.bench_health --out-dir "$OUT_DIR" ;;
      *) echo "reports: unknown report '$r' (moe_floor floor spec8k spec32k health)"; return 2 ;;
    esac || rc=1
  done
  return $rc
}

#: front  `mtplab demo` on the GPU, then `mtplab analyze` and `mtplab plot` of its run folder
#:        (one warm-up rule: the two must agree on steps and wall) -> demo.txt, analyze.txt,
#:        plot_run.png, demo_timeline.png
phase_front() {
  rm -rf /tmp/front && python3 -m mtplab.cli demo --trace-dir /tmp/front \
    > "$OUT_DIR/demo.txt" 2>&1 || { tail -20 "$OUT_DIR/demo.txt"; return 1; }
  local run; run=$(ls -d /tmp/front/demo-* | tail -1)
  python3 -m mtplab.cli analyze "$run" > "$OUT_DIR/analyze.txt" 2>&1 || return 1
  python3 -m mtplab.cli plot "$run" --out "$OUT_DIR/plot_run.png" || return 1
  cp "$run/timeline.png" "$OUT_DIR/demo_timeline.png"
  grep -E "profiled steps|device bubble|USDT" "$OUT_DIR/demo.txt"; head -4 "$OUT_DIR/analyze.txt"
}

usage() {
  echo "usage: bash scripts/gpu_check.sh [-o DIR] PHASE[:ARG,...] [PHASE...] | all"
  grep -E '^#: ' "$0" | sed 's/^#: /  /'
}

[[ $# -gt 0 ]] || { usage; exit 2; }
[[ $1 == all ]] && set -- "${ALL[@]}"
for spec in "$@"; do                              # every phase named must exist before any runs
  declare -F "phase_${spec%%:*}" >/dev/null || { echo "unknown phase '${spec%%:*}'"; usage; exit 2; }
done
mkdir -p "$OUT_DIR"; OUT_DIR=$(cd "$OUT_DIR" && pwd)     # only once a phase will run
python3 - <<'PY' | tee "$OUT_DIR/device.txt"
import datetime, torch
from mtplab.provenance import git_commit    # MTP_GIT_COMMIT where set, else this checkout's HEAD
dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(datetime.date.today(), "torch", torch.__version__, dev, "commit", git_commit() or "?")
PY
failed=()
for spec in "$@"; do
  name=${spec%%:*}; args=()
  [[ $spec == *:* ]] && IFS=, read -ra args <<< "${spec#*:}"
  echo "== $name ${args[*]:-}"
  t0=$SECONDS
  "phase_$name" "${args[@]}" 2>&1 | tee "$OUT_DIR/$name.log" | tail -40
  rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc, $((SECONDS - t0)) s, log $OUT_DIR/$name.log"
  [[ $rc == 0 ]] || failed+=("$name")
done
[[ ${#failed[@]} == 0 ]] || { echo "failed phases: ${failed[*]}"; exit 1; }
