#!/usr/bin/env bash
# The cost-model data set on one NVIDIA GPU, within a time budget (default 8 min):
# capture tiny and medium (16 examples per replica) zoo modules for one device,
# then `disco-xla profile --platform gpu` them one by one until the budget is
# spent. Without a GPU (nvidia-smi fails) it runs the same steps on the CPU.
#
#   benchmarks/gpu_profile.sh [OUT_DIR]      env: BUDGET_S PLANS REPEATS MODELS PLATFORM REPLICAS
set -euo pipefail
OUT=${1:-build/gpu-costmodel-data}
BUDGET_S=${BUDGET_S:-480}
PLANS=${PLANS:-4}
REPEATS=${REPEATS:-20}
MODELS=${MODELS:-"gpt2_small bert_base resnet50 vgg19 transformer_base bert_large"}
BIN=${BIN:-.venv/bin}
if [ -z "${PLATFORM:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then PLATFORM=gpu; else PLATFORM=cpu; fi
fi
# One GPU: one replica. On the CPU, two (the runner cannot yet compile a one-device
# pmap module for the CPU).
REPLICAS=${REPLICAS:-$([ "$PLATFORM" = gpu ] && echo 1 || echo 2)}
mkdir -p "$OUT/modules"
start=$(date +%s)
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
done_files=()
for model in $MODELS; do
  for size in tiny medium; do
    per_replica=$([ "$size" = tiny ] && echo 2 || echo 16)
    module="$OUT/modules/$model.$size.hlo.pb"
    data="$OUT/$model.$size.npz"
    [ "$(left)" -gt 20 ] || break 2
    [ -f "$module" ] || timeout "$(left)" "$BIN/disco-xla" capture --model "$model" \
      --replicas "$REPLICAS" --batch $((per_replica * REPLICAS)) -o "$module" --json \
      >/dev/null || break 2
    [ "$(left)" -gt 20 ] || break 2
    if [ ! -f "$data" ]; then
      timeout "$(left)" "$BIN/disco-xla" profile "$module" --platform "$PLATFORM" \
        --plans "$PLANS" --repeats "$REPEATS" --out "$data" --json >/dev/null || break 2
    fi
    done_files+=("$data")
  done
done
elapsed=$(( $(date +%s) - start ))
samples=$("$BIN/python" -c "
import sys
from disco_xla.profiling.dataset import load_datasets
print(len(load_datasets(sys.argv[1:])) if sys.argv[1:] else 0)" "${done_files[@]}")
echo "{\"platform\": \"$PLATFORM\", \"data_sets\": ${#done_files[@]}, \"samples\": $samples," \
  "\"elapsed_s\": $elapsed, \"budget_s\": $BUDGET_S, \"out\": \"$OUT\"}"
