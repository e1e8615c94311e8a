#!/usr/bin/env bash
# SGLang 0.5.17 on a GPU machine without network: stage it here, carry it there, run on it.
# A machine with SGLang installed needs none of this: it runs `mtplab sglang launch` and
# `python -m benchmarks.bench_peer_sglang` directly (docs/sglang.md, docs/peers.md).
#
# The machine this was written for (an H100 without network, image 'cuda'): Python 3.12.3, torch
# 2.11.0+cu130, triton 3.6, transformers 5.17, tokenizers 0.23.2, torchvision 0.26,
# cuda-bindings, nvidia-ml-py, aiohttp, uvloop, requests, psutil, einops, nvcc 13.0; no
# network; each call carries at most 64 MiB of files (the checkout's tracked tree, ~18 MB, rides
# along, so one carry folder holds at most 46 MiB: PART_BYTES); /tmp survives between calls
# only while the machine stays warm (30 s idle); $OUT returns at most 8 files of 16 MiB, two
# folders deep, named in [A-Za-z0-9._-].
#
# Here (CPU, PyPI):
#   scripts/sglang_h100.sh stage     # build + pack + extras: download the wheels (WHEELS), install
#                                    # them for cp312 into one site tree, trim it (TRIM), tar.xz
#                                    # it (xz -9e, ~4 min on 2 cores), split it into carry folders
#                                    # $MTP_SGL_CARRY_ROOT/.sgl_c1 .. .sgl_cN (each part + one
#                                    # MANIFEST.sha256); .sgl_cx: the extras (below). The folders
#                                    # /.sgl_c*/ and /.sgl_build/ belong in .git/info/exclude.
#   scripts/sglang_h100.sh dry       # the exact `mtplab sglang launch --dry-run` of pair's arms
# On the device, carry [".sgl_cK"] in call K, back to back:
#   bash scripts/sglang_h100.sh receive .sgl_cK     # adds call K's parts to $MTP_SGL_TMP/stage
# and in the call that brings the last part (or any later call while the machine is warm):
#   bash scripts/sglang_h100.sh install             # reassemble, sha256-check, extract (5 s; on
#                                                   # a warm machine holding it: nothing)
#   bash scripts/sglang_h100.sh overlay .sgl_cx     # the extras over the site (carry it too)
#   bash scripts/sglang_h100.sh check               # import probe only (every missing piece)
#   bash scripts/sglang_h100.sh warm                # probe + one short server run (compiles
#                                                   # SGLang's nvcc JIT and Triton kernels)
#   bash scripts/sglang_h100.sh pair                # probe, then overlap on / off HTTP arms
#   bash scripts/sglang_h100.sh peer [FLAGS]        # probe, then the peer harness (both
#                                                   # engines in-process; FLAGS are its own)
#   bash scripts/sglang_h100.sh moe [FLAGS]         # bench_moe_floor with the staged SGLang
#                                                   # importable: its `library` phase times
#                                                   # SGLang's fused MoE beside mtplab's; the
#                                                   # report goes to $OUT/results/moe_floor/
# Device commands write under $OUT (else $MTP_SGL_TMP/out): sgl.log (this script's output),
# arm_<warm|on|off>.log (client + server output), from `pair` summary.json and results.tgz
# (each arm's metrics.json, analysis/ and trace), from `peer` peer_results.json (the harness's
# resumable results), peer_table.md, peer_logs.tgz (each worker's output) and peer_traces.tgz
# (the profiled traces and their analysis; over OUT_BYTES, 15 MiB, in up to three parts
# peer_traces.tgz.part-0 .. -2 to be joined with cat; over three parts, without the raw
# traces). Every wait
# has a timeout; `warm`, `pair` and `peer` end within $MTP_SGL_DEADLINE seconds (default 480)
# of their start; a TERM or INT (the call's own timeout) stops the running arm's whole session
# before exiting. The probe runs once per installed payload (a marker in the site).
#
# A `peer` run resumes: its results stay in $MTP_SGL_TMP/peer while the machine is warm; on a
# cold one, put the peer_results.json a call returned into a carried folder as results.json
# and name it in MTP_PEER_FROM (e.g. .sgl_cresults: /.sgl_c*/ keeps it out of git).
# Its dated report (docs/results/peers/) is written here from what a call returned: set
# MTP_GIT_COMMIT on the device to the commit the carried tree was made from (each cell records
# it), copy peer_results.json to DIR/results.json and run `python -m
# benchmarks.bench_peer_sglang --out DIR --table-only --out-dir docs/results` with the flags
# the device run got (add --reanalyze after `tar -xzf peer_traces.tgz -C DIR` to read the
# traces again with this checkout's analyser).
#
# What is carried and why (the server's and sglang.Engine's import path beyond the image, found
# by scripts/sglang_probe.py --fake-cuda in a Python 3.12 environment of the image's packages
# plus the payload; every import below is at module level on that path, no flag avoids it):
#   sglang 0.5.17, sglang-kernel 0.4.5 (trimmed)  the engine, its compiled ops
#   flashinfer-python 0.6.15.post1 (trimmed)      fp8_utils (bmm_fp8) and sampler
#                                                 (flashinfer.sampling) under is_cuda(): not
#                                                 avoided by --attention-backend triton
#                                                 --sampling-backend pytorch
#   xgrammar 0.2.1 (trimmed)                      the function-call parser's StructuralTag: not
#                                                 avoided by --grammar-backend none
#   apache-tvm-ffi 0.1.11                         all_reduce; SGLang's JIT kernels (nvcc) build
#                                                 through it
#   transformers 5.12.1, tokenizers 0.22.2        SGLang's pin; the image's 5.17 ships qwen3_asr,
#                                                 which SGLang registers again (raises)
#   fastapi .. opentelemetry-api                  the HTTP server (and mtplab's orjson)
#   orjson .. dill, openai .. rpds-py,            utils, detokenizer, OpenAI protocol and chat,
#   compressed-tensors gguf loguru, soundfile     the quantization registry, realtime session,
#   cffi, ipython traitlets                       sglang/utils.py (IPython.display)
# Trimmed (TRIM, with the reason beside each path): 1.57 GB installed -> 232 MB; the payload
# sglang-site.tar.xz is 42.2 MB (40.2 MiB): one carry folder, .sgl_c1. The 37 wheels are 491 MB
# (sglang-kernel 383 MB, of it the 1.12 GB-installed FA3 library); carried as they are they
# would take 8 calls. sgl_kernel keeps sm90/common_ops (capability 9.0 loads it), which needs
# libnvrtc.so.13 and libcublas.so.13: device_env puts torch's nvidia/*/lib on LD_LIBRARY_PATH.
#
# The extras folder .sgl_cx (4.9 MB; `overlay .sgl_cx` after `install`), both pieces found by
# the first H100 calls:
#   flashinfer-data.tar.xz   flashinfer's data/ (JIT sources, 76 MB unpacked): sgl_kernel's
#                            rmsnorm builds flashinfer's norm module with nvcc at the first
#                            forward (without it the first graph capture dies on norm.cu)
#   deep_gemm-stub.tar.xz    an empty deep_gemm (not on PyPI): the DSA backend imports it at
#                            module level and the EAGLE v2 worker imports that backend while
#                            capturing its draft graphs; device_env turns DeepGEMM use off
#
# Checking the payload here: in a Python 3.12 venv with the image's versions (torch==2.11.0
# triton==3.6.0 transformers==5.17.0 tokenizers==0.23.2 timm cuda-bindings cuda-pathfinder
# nvidia-ml-py aiohttp uvloop requests psutil einops scipy xxhash ..., without pydantic,
# pydantic-core, annotated-types, typing-inspection, which the image lacks):
#   PYTHON=venv/bin/python MTP_SGL_TMP=/tmp/sgl_local MTP_SGL_PROBE_ARGS=--fake-cuda \
#     scripts/sglang_h100.sh receive .sgl_c1 && ... install && ... check
#
# The calls (kind nvidia-h100-x1, carry [".sgl_c1", ".sgl_cx"], 42.2 + 4.9 MB beside the
# tracked tree; timeout 600 s each; add overlay .sgl_cx after install on a machine gone cold):
#   1. receive .sgl_c1 && install && overlay .sgl_cx && warm
#   2. receive .sgl_c1 && install && pair          (or peer FLAGS, see docs/peers.md)
# If call 1's probe reports missing modules, add them to WHEELS, stage again and repeat; a
# first server on a cold machine recompiles the JIT kernels (about a minute).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MTP_SGL_TMP=${MTP_SGL_TMP:-/tmp/sgl}               # device: stage/, site/, models/, traces/
STAGE=$MTP_SGL_TMP/stage
SITE=$MTP_SGL_TMP/site
WORK=${MTP_SGL_WORK:-$ROOT/.sgl_build}         # here: wheels/, site/, the payload (git-ignored)
CARRY_ROOT=${MTP_SGL_CARRY_ROOT:-$ROOT}        # here: where .sgl_c1 .. go (the checkout that travels)
PART_BYTES=${MTP_SGL_PART_BYTES:-48234496}     # 46 MiB per carry folder (the tree rides along)
PAYLOAD=sglang-site.tar.xz
OUT_BYTES=${MTP_SGL_OUT_BYTES:-15728640}        # one file back from $OUT: at most 15 MiB
PY=${PYTHON:-python3}
PIP=${PIP:-$PY -m pip}
PIP_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# What the server imports beyond the GPU image (torch 2.11, triton 3.6, numpy, aiohttp, uvloop,
# requests, psutil, einops, cuda-bindings, nvidia-ml-py, ...), found by
# scripts/sglang_probe.py --fake-cuda in an environment holding only the image's packages.
# transformers/tokenizers: SGLang 0.5.17 pins transformers 5.12.1; the image's 5.17 already
# ships `qwen3_asr`, which SGLang registers again (AutoConfig.register raises); 5.12.1 wants
# tokenizers <= 0.23.0.
WHEELS=(
  sglang==0.5.17 sglang-kernel==0.4.5 flashinfer-python==0.6.15.post1 xgrammar==0.2.1
  apache-tvm-ffi==0.1.11 transformers==5.12.1 tokenizers==0.22.2
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 python-multipart==0.0.34
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5
  openai==2.6.1 distro==1.9.0 sniffio==1.3.1 orjson==3.13.0 msgspec==0.22.0 pyzmq==27.3.0
  pybase64==1.5.1 setproctitle==1.3.8 partial-json-parser==0.2.1.1.post7 dill==0.4.1
  compressed-tensors==0.20.0 gguf==0.19.0 loguru==0.7.3 opentelemetry-api==1.45.2
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  soundfile==0.14.0 cffi==2.1.1 ipython==9.18.1 traitlets==5.16.1
)
# Removed from the installed tree (paths under site/): nothing an H100 server with the triton
# attention backend, pytorch sampling and no grammar backend loads.
TRIM=(
  sgl_kernel/flash_ops.abi3.so                      # FA3 (--attention-backend fa3), 1.1 GB
  sgl_kernel/flashmla_ops.abi3.so                   # FlashMLA (MLA models)
  sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so   # InfLLM-v2 sparse attention
  sgl_kernel/sm100                                  # common_ops for every GPU but sm_90
  flashinfer/data                                   # JIT sources/headers (cutlass, csrc)
  xgrammar/lib                                      # libxgrammar.a, a static archive
  sglang/srt/server/_core.cpython-312-x86_64-linux-gnu.so      # Rust server (SGLANG_RUST_SERVER)
  sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so        # native gRPC (--grpc-port)
  sglang/srt/multimodal/_core.cpython-312-x86_64-linux-gnu.so  # Inkling image preprocessing
  bin                                               # console scripts
)

# ---------------------------------------------------------------- here: build and pack
build() {
  mkdir -p "$WORK/wheels"
  $PIP download -q --no-deps "${PIP_PLATFORM[@]}" -d "$WORK/wheels" "${WHEELS[@]}" || return 1
  local want=() w
  for w in "${WHEELS[@]}"; do want+=("$WORK/wheels/$(wheel_file "$w")"); done
  rm -rf "$WORK/site"
  $PIP install -q --no-deps --no-compile "${PIP_PLATFORM[@]}" --target "$WORK/site" \
    "${want[@]}" || return 1
  for w in "${TRIM[@]}"; do rm -rf "${WORK:?}/site/$w"; done
  find "$WORK/site" -name __pycache__ -prune -exec rm -rf {} +
  du -sb "$WORK/site"
  # xz -9e: ~6 min on 2 cores for ~265 MB; python's tarfile reads it on the device.
  tar -C "$WORK/site" --sort=name --owner=0 --group=0 --numeric-owner -cf - . \
    | xz -9e -T2 > "$WORK/$PAYLOAD.tmp" && mv "$WORK/$PAYLOAD.tmp" "$WORK/$PAYLOAD"
  ls -l "$WORK/$PAYLOAD"
}

wheel_file() {   # the downloaded file of requirement NAME==VERSION (names normalise to _)
  local name=${1%%==*} ver=${1##*==}
  name=$(echo "$name" | tr 'A-Z-' 'a-z_')
  (cd "$WORK/wheels" && ls | grep -i "^${name}-${ver}-" | head -1)
}

pack() {         # split $1 (default the payload) into carry folders with one MANIFEST
  local payload=${1:-$WORK/$PAYLOAD} name n i d
  name=$(basename "$payload")
  rm -rf "$WORK/parts" && mkdir -p "$WORK/parts"
  split -b "$PART_BYTES" -d -a 3 "$payload" "$WORK/parts/$name.part-"
  n=$(ls "$WORK/parts" | wc -l)
  {
    echo "# payload $name $(stat -c %s "$payload") bytes, $n parts"
    (cd "$(dirname "$payload")" && sha256sum "$name")
    (cd "$WORK/parts" && sha256sum ./*)
  } > "$WORK/MANIFEST.sha256"
  rm -rf "$CARRY_ROOT"/.sgl_c[0-9]*
  i=0
  for f in "$WORK/parts"/*; do
    i=$((i + 1)); d=$CARRY_ROOT/.sgl_c$i
    mkdir -p "$d" && cp "$f" "$WORK/MANIFEST.sha256" "$d/"
    echo "$d $(du -sb "$d" | cut -f1) bytes"
  done
  echo "$n carry folder(s); ignored by git: $(cd "$CARRY_ROOT" && git check-ignore -q .sgl_c1/x \
    && echo yes || echo 'NO: add /.sgl_c*/ to .git/info/exclude')"
}

extras() {       # $CARRY_ROOT/.sgl_cx: what the payload leaves out but a server run needs,
  local d=$CARRY_ROOT/.sgl_cx t=$WORK/extras     # unpacked over the site by `overlay .sgl_cx`
  rm -rf "$t" "$d" && mkdir -p "$t/deep_gemm" "$d"
  # flashinfer/data: JIT sources; sgl_kernel's rmsnorm builds flashinfer's norm module with
  # nvcc at the first forward (about 5 MB as xz, versus 76 MB unpacked)
  (cd "$t" && unzip -q "$WORK/wheels/$(wheel_file flashinfer-python==0.6.15.post1)" \
    'flashinfer/data/*') || return 1
  tar -C "$t" --sort=name --owner=0 --group=0 --numeric-owner -cf - flashinfer \
    | xz -6 -T2 > "$d/flashinfer-data.tar.xz" || return 1
  # deep_gemm: not on PyPI; SGLang's DSA backend imports it at module level, and the EAGLE v2
  # worker imports that backend while capturing graphs. An empty module satisfies the import;
  # device_env turns SGLang's DeepGEMM use off.
  cat > "$t/deep_gemm/__init__.py" <<'PYEOF'
"""A stand-in for DeepGEMM (not on PyPI, not in the carried payload), written by mtplab's
scripts/sglang_h100.sh: SGLang 0.5.17 imports `deep_gemm` at module level in its DSA
attention backend, which the EAGLE v2 worker imports while capturing its graphs even for a
Llama target. The module is empty (every attribute is missing), and the script turns
SGLang's DeepGEMM use off (SGLANG_ENABLE_JIT_DEEPGEMM=0, SGLANG_DEEPGEMM_PDL=0)."""
PYEOF
  tar -C "$t" --owner=0 --group=0 --numeric-owner -cJf "$d/deep_gemm-stub.tar.xz" deep_gemm
  (cd "$d" && sha256sum ./*.tar.xz > MANIFEST.sha256)
  echo "$d $(du -sb "$d" | cut -f1) bytes"
}

dry() {          # the launch lines `pair` (and `warm`) run, from the same function
  local arm a args
  # the model dirs `prepare` writes (config only): the launch checks them even in a dry run
  $PY -m mtplab.cli sglang models --out "$MTP_SGL_TMP/models" --model "${MTP_SGL_MODEL:-random-medium}" \
    > /dev/null || return 1
  for arm in warm on off; do
    args=()
    while IFS= read -r -d '' a; do args+=("$a"); done < <(
      launch_args "$arm" "$MTP_SGL_TMP/models/target" "$MTP_SGL_TMP/models/draft" "$MTP_SGL_TMP/traces")
    echo "# $arm"
    $PY -m mtplab.cli sglang launch --dry-run "${args[@]}" || return 1
  done
}

# ---------------------------------------------------------------- device
device_env() {
  export PYTHONPATH=$SITE:$ROOT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  # flashinfer is imported unconditionally on CUDA (fp8_utils, sampler) but its JIT sources
  # are trimmed: keep SGLang from choosing it anywhere it is optional.
  export SGLANG_IS_FLASHINFER_AVAILABLE=false
  export SGLANG_ENABLE_JIT_DEEPGEMM=0 SGLANG_DEEPGEMM_PDL=0   # DeepGEMM is not carried (a stub)
  # every SGLang engine start imports the package in three processes: keep the bytecode the
  # first one compiles (an image may turn writing it off)
  unset PYTHONDONTWRITEBYTECODE
  # sgl_kernel's common_ops needs libnvrtc.so.13 / libcublas.so.13: torch's nvidia wheels.
  local libs
  libs=$($PY - <<'EOF' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except Exception:
    roots = []
print(":".join(sorted({os.path.dirname(p) for r in roots
                       for p in glob.glob(f"{r}/**/lib/lib*.so*", recursive=True)})))
EOF
)
  [ -n "$libs" ] && export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # SGLang's JIT kernels build with tvm-ffi: nvcc (CUDA_HOME from its path), c++ and ninja.
  command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH; }
  if ! command -v ninja >/dev/null; then
    local nb
    nb=$($PY -c 'import ninja; print(ninja.BIN_DIR)' 2>/dev/null) && export PATH=$nb:$PATH
  fi
  return 0
}

receive() {
  local src=${1:?usage: receive .sgl_cK}
  [ -d "$src" ] || { echo "receive: $src is not here (was it in this call's carry?)"; return 2; }
  mkdir -p "$STAGE"
  cp -f "$src"/*.part-* "$src"/MANIFEST.sha256 "$STAGE"/ || return 1
  echo "receive: $(ls "$STAGE" | grep -c '\.part-') part(s) staged in $STAGE: $(ls "$STAGE" | tr '\n' ' ')"
}

install() {
  local man=$STAGE/MANIFEST.sha256 name missing=() f sha
  [ -f "$man" ] || { echo "install: no $man (run receive first)"; return 2; }
  name=$(sed -n '2p' "$man" | awk '{print $2}')
  sha=$(sed -n '2p' "$man" | awk '{print $1}')
  if [ -f "$SITE/.payload_sha256" ] && [ "$(cat "$SITE/.payload_sha256")" = "$sha" ]; then
    echo "install: $SITE already holds payload $sha"; return 0
  fi
  while read -r _ f; do
    f=${f#./}; [ -f "$STAGE/$f" ] || missing+=("$f")
  done < <(grep '\.part-' "$man")
  if [ ${#missing[@]} -gt 0 ]; then
    echo "install: missing ${#missing[@]} part(s): ${missing[*]} (receive each .sgl_cK first)"
    return 3
  fi
  (cd "$STAGE" && grep '\.part-' "$man" | sha256sum -c --quiet -) || { echo "install: a part is corrupt"; return 4; }
  cat $(grep '\.part-' "$man" | awk '{print $2}' | sed "s#^\./#$STAGE/#") > "$STAGE/$name"
  (cd "$STAGE" && sed -n '2p' "$man" | sha256sum -c --quiet -) || { echo "install: reassembled payload is corrupt"; return 4; }
  rm -rf "$SITE.tmp" && mkdir -p "$SITE.tmp"
  $PY - "$STAGE/$name" "$SITE.tmp" <<'EOF' || return 5
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], filter="data")
EOF
  rm -rf "$SITE" && mv "$SITE.tmp" "$SITE" && echo "$sha" > "$SITE/.payload_sha256"
  rm -f "$STAGE/$name"
  echo "install: $(du -sb "$SITE" | cut -f1) bytes in $SITE ($(ls "$SITE" | grep -c dist-info) dists)"
}

overlay() {      # overlay DIR: its verified tarballs unpacked over the installed site
  local src=${1:?usage: overlay .sgl_cK} t    # (flashinfer's JIT sources: norm kernels build at run time)
  [ -f "$SITE/.payload_sha256" ] || { echo "overlay: install first"; return 2; }
  (cd "$src" && sha256sum -c --quiet MANIFEST.sha256) || { echo "overlay: $src is corrupt"; return 4; }
  for t in "$src"/*.tar.xz; do
    $PY -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
      "$t" "$SITE" || return 5
    echo "overlay: $(basename "$t") unpacked into $SITE"
  done
}

check() {        # the import probe; a pass is marked in the site (a new payload clears it)
  device_env
  echo "== check: $(nvidia-smi -L 2>/dev/null | head -1)"
  timeout 300 $PY "$ROOT/scripts/sglang_probe.py" ${MTP_SGL_PROBE_ARGS:-} || return $?
  [ -d "$SITE" ] && sha256sum "$ROOT/scripts/sglang_probe.py" > "$SITE/.probe_ok"
  return 0
}

probed() {       # the probe passed on this site with this probe script
  [ -f "$SITE/.probe_ok" ] && (cd / && sha256sum -c --quiet "$SITE/.probe_ok" 2>/dev/null)
}

launch_args() {  # NUL-separated arguments of `mtplab sglang launch` for arm on|off|warm
  local arm=$1 target=$2 draft=$3 traces=$4 port=${MTP_SGL_PORT:-30000} ov=true
  local work=(--prompts 32 --max-new-tokens 128 --profile true --profile-active 20)
  [ "$arm" = off ] && port=$((port + 1)) ov=false
  [ "$arm" = warm ] && port=$((port + 2)) work=(--prompts 8 --max-new-tokens 16 --profile false)
  printf '%s\0' --model "$target" --draft eagle --draft-model "$draft" \
    --num-steps 3 --topk 1 --simulate-accept-len 2.5 --dummy-weights true --overlap "$ov" \
    --max-running-requests 8 --cuda-graph-max-bs 8 --concurrency 8 --prompt-len 256 \
    "${work[@]}" --port "$port" --run-name "sglang_h100_$arm" --trace-dir "$traces" \
    --python "${MTP_SGL_SERVER_PYTHON:-$PY}" \
    --extra-args "--sampling-backend pytorch --grammar-backend none --mem-fraction-static 0.6 --watchdog-timeout 600"
}

run_arm() {      # run_arm ARM SECONDS: one `mtplab sglang launch` in its own session
  local arm=$1 cap=$2 log=$OUTDIR/arm_$1.log rc a args=()
  while IFS= read -r -d '' a; do args+=("$a"); done < <(
    launch_args "$arm" "$MTP_SGL_TMP/models/target" "$MTP_SGL_TMP/models/draft" "$MTP_SGL_TMP/traces")
  if [ "$cap" -lt 1 ]; then     # the deadline went on the steps before: launch nothing
    echo "arm $arm: TIMEOUT before launch (${cap}s of MTP_SGL_DEADLINE left); raise it"
    return 124
  fi
  echo "== arm $arm: at most ${cap}s, log $log"
  capped "arm $arm" "$cap" "$log" $PY -m mtplab.cli sglang launch "${args[@]}"; rc=$?
  echo "arm $arm: exit $rc after ~${WAITED}s"
  if [ "$rc" -ne 0 ]; then echo "---- tail of $log"; tail -n 80 "$log"; echo "----"; fi
  return "$rc"
}

capped() {       # capped LABEL SECONDS LOG CMD...: CMD in a session of its own (ARM_PID, so
                 # on_signal stops it), its output to LOG (-: ours), its process group stopped
                 # at SECONDS and again once it exits (children left behind); -> CMD's exit
                 # status, the seconds waited in WAITED (2 s steps)
  local label=$1 cap=$2 log=$3 pid rc; shift 3
  if [ "$log" = - ]; then setsid "$@" & else setsid "$@" > "$log" 2>&1 & fi
  pid=$! ARM_PID=$!
  WAITED=0
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$WAITED" -ge "$cap" ]; then
      echo "$label: TIMEOUT after ${cap}s; stopping its process group"
      pkill_group "$pid"; break
    fi
    sleep 2; WAITED=$((WAITED + 2))
  done
  wait "$pid"; rc=$?
  pkill_group "$pid"
  ARM_PID=
  return "$rc"
}

ARM_PID=          # the session of the arm running now (capped), if any
on_signal() {    # TERM/INT (the call's timeout, ^C): stop the running arm's session first
  if [ -n "$ARM_PID" ]; then
    echo "stopped by a signal: stopping arm session $ARM_PID"
    pkill_group "$ARM_PID"
  fi
  exit 143
}

pkill_group() {  # TERM then KILL process group $1 (the session capped started), never ours
  [ "$1" = "$(ps -o pgid= -p $$ | tr -d ' ')" ] && return 0
  kill -TERM -- "-$1" 2>/dev/null || return 0
  local i
  for i in 1 2 3 4 5 6 7 8 9 10; do
    sleep 1; kill -0 -- "-$1" 2>/dev/null || return 0
  done
  kill -KILL -- "-$1" 2>/dev/null
  return 0
}

prepare() {      # environment, model dirs, import probe: what every server run needs first
  device_env
  [ -f "$SITE/.payload_sha256" ] || { echo "$SITE is empty: run receive + install first"; return 2; }
  $PY -m mtplab.cli sglang models --out "$MTP_SGL_TMP/models" --model "${MTP_SGL_MODEL:-random-medium}" \
    || return 2
  if probed; then
    echo "== check: the probe passed on this site already"
  else
    check || { echo "the import probe failed; not launching (see above)"; return 3; }
  fi
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null
  return 0
}

warm() {         # one short server run: compiles SGLang's JIT (nvcc) and Triton kernels
  local start=$SECONDS deadline=${MTP_SGL_DEADLINE:-480}
  prepare || return $?
  run_arm warm $((deadline - (SECONDS - start)))
}

pair() {         # overlap on, then off; after `warm` each takes a minute or two
  local start=$SECONDS deadline=${MTP_SGL_DEADLINE:-480} left cap rc_on rc_off
  prepare || return $?
  rm -rf "$MTP_SGL_TMP/traces"
  left=$((deadline - (SECONDS - start)))
  cap=$((left - 120)); [ "$cap" -gt 300 ] && cap=300
  run_arm on "$cap"; rc_on=$?
  left=$((deadline - (SECONDS - start) - 10)); [ "$left" -lt 60 ] && left=60
  run_arm off "$left"; rc_off=$?
  summarize
  echo "pair: on exit $rc_on, off exit $rc_off, $((SECONDS - start))s"
  [ "$rc_on" -eq 0 ] && [ "$rc_off" -eq 0 ]
}

peer() {         # the peer harness (benchmarks/bench_peer_sglang.py); "$@" are its flags
  local start=$SECONDS deadline=${MTP_SGL_DEADLINE:-480} work=$MTP_SGL_TMP/peer cap rc
  prepare || return $?
  mkdir -p "$work"
  if [ -n "${MTP_PEER_FROM:-}" ] && [ ! -f "$work/results.json" ]; then
    if [ -f "$MTP_PEER_FROM/results.json" ]; then
      cp "$MTP_PEER_FROM/results.json" "$work/" && echo "peer: resuming $MTP_PEER_FROM/results.json"
    else
      echo "peer: MTP_PEER_FROM=$MTP_PEER_FROM holds no results.json (carried?); starting afresh"
    fi
  fi
  cap=$((deadline - (SECONDS - start) - 30))     # 30 s: stopping its engines, packing $OUT
  if [ "$cap" -lt 60 ]; then
    echo "peer: TIMEOUT before launch (${cap}s of MTP_SGL_DEADLINE left); raise it"
    return 124
  fi
  echo "== peer: at most ${cap}s, results in $work"
  # the harness stops starting work 20 s before the cap; at the cap it gets a TERM (it kills
  # its engines' sessions and writes what finished)
  capped peer "$cap" - $PY -m benchmarks.bench_peer_sglang --out "$work" \
    --deadline-s $((cap - 20)) "$@"; rc=$?
  peer_pack "$work"
  echo "peer: exit $rc, $((SECONDS - start))s"
  return "$rc"
}

moe() {          # bench_moe_floor, SGLang on the path (its `library` phase); "$@": its flags
  local start=$SECONDS rc
  device_env
  [ -f "$SITE/.payload_sha256" ] || { echo "$SITE is empty: run receive + install first"; return 2; }
  $PY -m benchmarks.bench_moe_floor --out-dir "$OUTDIR/results" "$@"; rc=$?
  echo "moe: exit $rc, $((SECONDS - start))s"
  return "$rc"
}

peer_pack() {    # the harness's folder -> at most 7 files under $OUT (its limits: see the top)
  local work=$1 f t=$OUTDIR/peer_traces.tgz size
  rm -f "$t" "$t".part-*          # what an earlier `peer` of this call packed
  for f in results.json table.md; do
    [ -f "$work/$f" ] && cp "$work/$f" "$OUTDIR/peer_$f"
  done
  [ -d "$work/logs" ] && tar -C "$work" -czf "$OUTDIR/peer_logs.tgz" logs
  if [ -d "$work/traces" ]; then
    tar -C "$work" -czf "$t" traces
    size=$(stat -c %s "$t")
    if [ "$size" -gt $((3 * OUT_BYTES)) ]; then
      echo "peer_traces.tgz > 3 x $OUT_BYTES bytes: leaving the raw traces out"
      tar -C "$work" -czf "$t" --exclude='*.trace.json*' traces
    elif [ "$size" -gt "$OUT_BYTES" ]; then
      split -b "$OUT_BYTES" -d -a 1 "$t" "$t.part-" && rm -f "$t"
      echo "peer_traces.tgz in $(ls "$t".part-* | wc -l) parts: cat peer_traces.tgz.part-* > peer_traces.tgz"
    fi
  fi
  ls -l "$OUTDIR"
}

summarize() {
  $PY - "$MTP_SGL_TMP/traces" "$OUTDIR/summary.json" <<'EOF'
import json, pathlib, sys
root, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
res = {}
for arm in ("on", "off"):
    m = root / f"sglang_h100_{arm}" / "metrics.json"
    res[f"overlap_{arm}"] = json.loads(m.read_text()) if m.is_file() else None
on, off = res["overlap_on"], res["overlap_off"]
if on and off and off.get("tok_per_s"):
    res["tok_per_s_on_over_off"] = on["tok_per_s"] / off["tok_per_s"]
out.write_text(json.dumps(res, indent=2))
keys = ("tok_per_s", "tpot_ms", "itl_p50_ms", "itl_p99_ms", "ttft_ms", "accept_len", "bubble_frac")
for arm in ("on", "off"):
    r = res[f"overlap_{arm}"]
    print(f"overlap {arm}: " + (", ".join(f"{k} {r.get(k)}" for k in keys) if r else "no metrics"))
print("on/off tok/s:", res.get("tok_per_s_on_over_off"))
EOF
  if [ -d "$MTP_SGL_TMP/traces" ]; then
    tar -C "$MTP_SGL_TMP" -czf "$OUTDIR/results.tgz" traces
    if [ "$(stat -c %s "$OUTDIR/results.tgz")" -gt 15728640 ]; then
      echo "results.tgz > 15 MiB: leaving the raw traces out"
      tar -C "$MTP_SGL_TMP" -czf "$OUTDIR/results.tgz" --exclude='*.trace.json*' traces
    fi
    ls -l "$OUTDIR/results.tgz"
  fi
}

# ---------------------------------------------------------------- dispatch
cmd=${1:-}; shift || true
case "$cmd" in
  receive|install|overlay|check|warm|pair|peer|moe)
    OUTDIR=${OUT:-$MTP_SGL_TMP/out}; mkdir -p "$OUTDIR"
    exec > >(tee -a "$OUTDIR/sgl.log") 2>&1
    TEE_PID=$!
    trap 'rc=$?; exec >&- 2>&-; wait "$TEE_PID" 2>/dev/null; exit $rc' EXIT
    trap on_signal TERM INT
    echo "== $cmd $* ($(date -u +%FT%TZ))" ;;
esac
case "$cmd" in
  build) build ;;
  pack) pack "$@" ;;
  stage) build && pack && extras ;;
  dry) dry ;;
  receive) receive "$@" ;;
  overlay) overlay "$@" ;;
  install) install ;;
  check) check ;;
  warm) warm ;;
  pair) pair ;;
  peer) peer "$@" ;;
  moe) moe "$@" ;;
  *) echo "usage: $0 build|pack [PAYLOAD]|stage|dry  (here);" \
       "receive DIR|install|overlay DIR|check|warm|pair|peer [FLAGS]|moe [FLAGS]  (device)" >&2
     exit 2 ;;
esac
