#!/usr/bin/env bash
# The GNN kernel cost model of one NVIDIA H200, into configs/costmodels/h200/, within
# a hard budget of 10 minutes (BUDGET_S, default 570 s for all the steps together):
#   1. check for a GPU (nvidia-smi, then JAX); without one, stop at once (exit 2);
#   2. capture tiny and medium (16 examples) JAX zoo modules for one device, on the
#      CPU (the module before optimisation does not depend on the platform);
#   3. `disco-xla profile --platform gpu` them one by one while the profiling
#      budget (BUDGET_S - TRAIN_S) lasts; a module cut off by it is dropped;
#   4. `disco-xla train-cost-model --max-seconds` on the data sets collected, into
#      a new directory that replaces MODEL_DIR only once training has succeeded.
# Every step runs under `timeout` with what is left of its budget. The last line on
# stdout is one JSON object; progress goes to stderr.
#
#   benchmarks/gpu_profile.sh [MODEL_DIR]      (from the repository root)
#   env: BUDGET_S (570) TRAIN_S (150) PLANS (4) REPEATS (10) EPOCHS (60)
#        MODELS DATA (build/gpu-costmodel-data) BIN (.venv/bin) NVIDIA_SMI
#        PLATFORM (gpu; cpu runs the same steps on the CPU, MODEL_DIR then
#        defaults to $DATA/cpu-model)
#        PYTHON (python3): where $BIN has no disco-xla (a GPU machine whose own
#        Python holds a CUDA jaxlib, say), the source tree runs under it.
# The models whose steps XLA:GPU compiled come first: on jaxlib 0.11.2, with its
# command buffers on, bert_base's and bert_large's aborted XLA:GPU's compiler
# (BENCHMARKS, session 29; not yet tried with them off), about 20 s each.
set -euo pipefail
PLATFORM=${PLATFORM:-gpu}
BUDGET_S=${BUDGET_S:-570}
TRAIN_S=${TRAIN_S:-150}
PLANS=${PLANS:-4}
REPEATS=${REPEATS:-10}
EPOCHS=${EPOCHS:-60}
MODELS=${MODELS:-"gpt2_small resnet50 transformer_base vgg19 bert_base bert_large"}
DATA=${DATA:-build/gpu-costmodel-data}
BIN=${BIN:-.venv/bin}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
if [ "$PLATFORM" = gpu ]; then default_model=configs/costmodels/h200; else
  default_model="$DATA/cpu-model"; fi
MODEL_DIR=${1:-$default_model}
start=$(date +%s)
say() { echo "gpu_profile.sh: $*" >&2; }
if [ -x "$BIN/disco-xla" ]; then
  python=("$BIN/python"); disco=("$BIN/disco-xla")
else
  python=("${PYTHON:-python3}"); disco=("${python[@]}" -m disco_xla.cli)
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
left() { echo $(( BUDGET_S - ($(date +%s) - start) )); }
profile_left() { echo $(( $(left) - TRAIN_S )); }

if [ "$PLATFORM" = gpu ]; then
  gpus=$("$NVIDIA_SMI" -L 2>/dev/null | grep '^GPU' || true)
  if [ -z "$gpus" ]; then
    say "no GPU is present ($NVIDIA_SMI lists none); this script profiles an NVIDIA" \
      "GPU (PLATFORM=cpu runs the same steps on the CPU)"
    exit 2
  fi
  jax_gpus=$(timeout 120 "${python[@]}" -c \
    "import jax; print(len(jax.devices('gpu')))" 2>/dev/null | tail -n 1 || true)
  if ! [[ "$jax_gpus" =~ ^[1-9][0-9]*$ ]]; then
    say "$NVIDIA_SMI lists a GPU, but JAX sees no GPU devices (a jaxlib without CUDA?" \
      "install jax[cuda12] into the venv)"
    exit 2
  fi
  grep -q H200 <<<"$gpus" || say "warning: not an H200 ($(head -n 1 <<<"$gpus")):" \
    "the model still goes to $MODEL_DIR"
fi

[ -x "$BIN/disco-xla" ] || say "no $BIN/disco-xla: running the source tree under ${python[*]}"
mkdir -p "$DATA/modules"
data_sets=()
for model in $MODELS; do
  for size in tiny medium; do
    per_replica=$([ "$size" = tiny ] && echo 2 || echo 16)
    module="$DATA/modules/$model.$size.hlo.pb"
    data="$DATA/$PLATFORM.$model.$size.npz"
    if [ ! -f "$data" ]; then
      [ "$(profile_left)" -gt 20 ] || break 2
      [ -f "$module" ] || JAX_PLATFORMS=cpu timeout "$(profile_left)" "${disco[@]}" \
        capture --model "$model" --replicas 1 --batch "$per_replica" -o "$module" --json \
        >/dev/null || { say "capture of $model.$size failed or ran out of budget"; break 2; }
      [ "$(profile_left)" -gt 20 ] || break 2
      status=0
      timeout "$(profile_left)" "${disco[@]}" profile "$module" --platform "$PLATFORM" \
        --plans "$PLANS" --repeats "$REPEATS" --out "$data.part" --json >&2 || status=$?
      if [ "$status" = 124 ]; then say "$model.$size cut off by the budget"; break 2; fi
      # Exit 2 is bad input (no devices of the platform, say): stop at once.
      if [ "$status" = 2 ]; then say "profile of $model.$size refused (exit 2)"; exit 2; fi
      if [ "$status" != 0 ]; then say "profile of $model.$size failed (exit $status)"; continue; fi
      mv "$data.part" "$data"
    fi
    data_sets+=("$data")
  done
done
profile_s=$(( $(date +%s) - start ))
if [ ${#data_sets[@]} -eq 0 ]; then
  say "no data set was collected in $profile_s s; nothing to train on"
  exit 1
fi

train_s=$(( $(left) - 15 ))
if [ "$train_s" -lt 20 ]; then say "no budget left to train ($train_s s)"; exit 1; fi
rm -rf "$MODEL_DIR.new"
report=$(timeout "$train_s" "${disco[@]}" train-cost-model "${data_sets[@]}" \
  --out "$MODEL_DIR.new" --epochs "$EPOCHS" --max-seconds $(( train_s * 2 / 3 )) --json) || {
  say "training failed or ran out of its $train_s s"; exit 1; }
rm -rf "$MODEL_DIR"
mv "$MODEL_DIR.new" "$MODEL_DIR"
echo "{\"platform\": \"$PLATFORM\", \"data_sets\": ${#data_sets[@]}, \"profile_s\": $profile_s," \
  "\"elapsed_s\": $(( $(date +%s) - start )), \"budget_s\": $BUDGET_S," \
  "\"model_dir\": \"$MODEL_DIR\", \"training\": $report}"
