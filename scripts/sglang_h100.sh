#!/usr/bin/env bash
# A real SGLang 0.5.17 server on the lent H100, staged over consecutive device calls.
# NOT RUN YET on a GPU (docs/sglang.md section 3 says why it is hard: ~463 MB of wheels,
# sglang-kernel alone 383 MB, 64 MiB per call, carried files live only while the machine is
# warm).
#
# Here (CPU, network):
#   for d in .sglang_wheels .sglang_carry .sglang_stage; do echo /$d/ >> .git/info/exclude; done
#   scripts/sglang_h100.sh stage          # download wheels, split into <= 60 MiB parts
#   scripts/sglang_h100.sh batches        # how many calls (N) the parts need
# Then for n in 1..N, back to back: here `scripts/sglang_h100.sh next n` (puts batch n in
# .sglang_carry/), and on the device, carry [".sglang_carry"]:
#   scripts/sglang_h100.sh receive        # copies this call's parts into .sglang_stage/
# After the last batch, in the next call:
#   scripts/sglang_h100.sh install && scripts/sglang_h100.sh pair
# `pair` prints one metrics JSON per arm (overlap on / off, simulated acceptance 2.5, EAGLE
# topk 1 steps 3 on a config-only Llama with dummy weights) and the bubble fraction of each
# arm's trace (traces/sglang_h100_{on,off}/analysis).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHEELS=$ROOT/.sglang_wheels          # here: the full wheels
CARRY=$ROOT/.sglang_carry            # carried to the device, one batch per call
STAGE=$ROOT/.sglang_stage            # on the device: parts accumulate here between calls
PART=60m
PIP_PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64)
# What a server needs beyond the GPU image (torch 2.11, triton 3.6, numpy, transformers,
# torchvision, safetensors, tokenizers, sentencepiece, tiktoken, huggingface_hub): sglang's
# own pins, then the packages requirements/sglang-ref.txt found for its imports.
SERVER_WHEELS=(
  sglang==0.5.17 sglang-kernel==0.4.5 xgrammar==0.2.1 apache-tvm-ffi==0.1.11
  transformers==5.12.1 openai==2.6.1
  aiohappyeyeballs aiohttp aiosignal compressed-tensors dill einops fastapi frozenlist gguf
  loguru msgspec multidict opentelemetry-api partial-json-parser propcache pybase64
  setproctitle sniffio starlette uvicorn yarl pyzmq uvloop orjson psutil interegular
  python-multipart prometheus-client
)

stage() {
  mkdir -p "$WHEELS" "$CARRY"
  python3 -m pip download --no-deps "${PIP_PLATFORM[@]}" -d "$WHEELS" "${SERVER_WHEELS[@]}"
  rm -rf "$WHEELS"/parts && mkdir -p "$WHEELS"/parts
  (cd "$WHEELS" && sha256sum ./*.whl > "$WHEELS"/parts/MANIFEST.sha256)
  for w in "$WHEELS"/*.whl; do
    split -b "$PART" -d -a 3 "$w" "$WHEELS/parts/$(basename "$w").part-"
  done
  du -sh "$WHEELS"/parts
}

batches() {
  # Greedy packing of parts into calls of <= 62 MiB (the working tree rides along too).
  python3 - "$WHEELS/parts" "${1:-0}" <<'EOF'
import os, sys
d, want = sys.argv[1], int(sys.argv[2])
parts = sorted(f for f in os.listdir(d) if ".part-" in f)
batch, size, n = [], 0, 1
for f in parts:
    s = os.path.getsize(os.path.join(d, f))
    if batch and size + s > 62 * 2**20:
        if want in (0, n):
            print(f"call {n}: " * (want == 0) + " ".join(batch))
        batch, size, n = [], 0, n + 1
    batch.append(f); size += s
if want in (0, n):
    print(f"call {n}: " * (want == 0) + " ".join(batch + ["MANIFEST.sha256"]))
EOF
}

next_batch() {
  rm -rf "$CARRY"/parts && mkdir -p "$CARRY"/parts
  for f in $(batches "$1"); do cp "$WHEELS/parts/$f" "$CARRY/parts/"; done
  du -sh "$CARRY"/parts
}

receive() {
  mkdir -p "$STAGE"
  cp -n "$CARRY"/parts/* "$STAGE"/
  ls "$STAGE" | wc -l
}

install() {
  mkdir -p "$STAGE/wheels" "$STAGE/site"
  for first in "$STAGE"/*.whl.part-000; do
    w=$(basename "${first%.part-000}")
    cat "$STAGE/$w".part-* > "$STAGE/wheels/$w"
  done
  (cd "$STAGE/wheels" && sha256sum -c "$STAGE/MANIFEST.sha256")
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$STAGE/site" "$STAGE"/wheels/*.whl
  PYTHONPATH=$STAGE/site python3 -c "import sgl_kernel, sglang.srt.server_args; print('sglang ok')"
}

model_dirs() {
  # Config-only Llama target + EAGLE draft (dummy weights): the shapes of a 1B model.
  mkdir -p "$STAGE/models/target" "$STAGE/models/draft"
  python3 - "$STAGE/models" <<'EOF'
import json, sys
root = sys.argv[1]
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
       "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
       "num_hidden_layers": 16, "vocab_size": 32000, "max_position_embeddings": 4096,
       "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}
json.dump(cfg, open(f"{root}/target/config.json", "w"))
json.dump({**cfg, "num_hidden_layers": 1, "architectures": ["LlamaForCausalLMEagle"]},
          open(f"{root}/draft/config.json", "w"))
EOF
}

pair() {
  model_dirs
  export PYTHONPATH=$STAGE/site:$ROOT
  for arm in on off; do
    flag=--overlap; [ "$arm" = off ] && flag=--no-overlap
    python3 -m mtplab.cli sglang launch --model-path "$STAGE/models/target" \
      --draft eagle --draft-model-path "$STAGE/models/draft" --num-steps 3 --topk 1 \
      --dummy-weights --simulate-accept-len 2.5 $flag --prompts 32 --prompt-len 256 \
      --max-new-tokens 128 --concurrency 16 --profile-steps 20 \
      --run-name "sglang_h100_$arm" --extra-args "--sampling-backend pytorch --mem-fraction-static 0.6"
  done
}

case "${1:-}" in
  stage) stage ;; batches) batches ;; next) next_batch "$2" ;; receive) receive ;;
  install) install ;; pair) pair ;;
  *) echo "usage: $0 stage|batches|next N|receive|install|pair" >&2; exit 2 ;;
esac
