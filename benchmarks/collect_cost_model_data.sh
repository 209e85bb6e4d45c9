#!/usr/bin/env bash
# Collect the GNN cost model's data set on this machine's CPU: capture the JAX zoo
# models at the tiny size ("tiny": 2 examples per replica; "medium": the same tiny
# architecture with 16 examples per replica, since the zoo has no medium size),
# then `disco-xla profile` each module into its own data set under $OUT. On one
# GPU, with a time budget, see `benchmarks/gpu_profile.sh`.
#
#   benchmarks/collect_cost_model_data.sh [OUT_DIR] [PLANS] [MODELS...]
#   env: REPEATS (20) REPLICAS (2) PLATFORM (cpu) BIN (.venv/bin)
set -euo pipefail
OUT=${1:-build/costmodel-data}
PLANS=${2:-6}
REPEATS=${REPEATS:-20}
shift $(( $# > 2 ? 2 : $# )) || true
MODELS=${*:-"gpt2_small vgg19 bert_base resnet50 transformer_base bert_large inception_v3"}
BIN=${BIN:-.venv/bin}
REPLICAS=${REPLICAS:-2}
PLATFORM=${PLATFORM:-cpu}
mkdir -p "$OUT/modules"
start=$(date +%s)
for model in $MODELS; do
  for size in tiny medium; do
    per_replica=$([ "$size" = tiny ] && echo 2 || echo 16)
    module="$OUT/modules/$model.$size.hlo.pb"
    [ -f "$module" ] || "$BIN/disco-xla" capture --model "$model" --replicas "$REPLICAS" \
      --batch $((per_replica * REPLICAS)) -o "$module" --json
    [ -f "$OUT/$model.$size.npz" ] || "$BIN/disco-xla" profile "$module" --plans "$PLANS" \
      --repeats "$REPEATS" --platform "$PLATFORM" --out "$OUT/$model.$size.npz" --json
  done
done
echo "{\"collection_s\": $(( $(date +%s) - start ))}"
