#!/usr/bin/env bash
# Collect the GNN cost model's data set on this machine's CPU: capture each model
# at the tiny size ("tiny": 2 examples per replica; "medium": the same tiny
# architecture with 16 examples per replica, since the zoo has no medium size),
# then `disco-xla profile` each module into its own data set under $OUT. On one
# GPU, with a time budget, see `benchmarks/gpu_profile.sh`.
#
#   benchmarks/collect_cost_model_data.sh [OUT_DIR] [PLANS] [MODELS...]
#   env: REPEATS (20) REPLICAS (2) PLATFORM (cpu) BIN (.venv/bin) SIZES (tiny medium)
#        KERAS_IMAGE (96) CAPTURE_ONLY (0; 1: capture the modules, profile nothing)
#
# MODELS: JAX zoo names (`disco-xla capture --list`; `llama` is captured with
# --mode sharded), `tf:NAME` for a TF zoo step, `keras:NAME` for a
# keras.applications model (Keras on JAX: KERAS_BACKEND=jax, no weights,
# KERAS_IMAGE x KERAS_IMAGE images, 10 classes, a pmap'd SGD step whose
# gradients are pmean'd over the replicas); keras:ResNeXt26 is a ResNeXt-26
# (32x4d: grouped 3x3 convolutions, 32 groups) built from Keras layers, since
# keras.applications has no grouped convolutions. Module and data set files are named
# for the model with ':' as '_' (keras:MobileNetV2 -> keras_MobileNetV2.tiny.npz),
# the model names that `MODEL_FAMILIES` in disco_xla/costmodel/dataset.py maps
# to families for `benchmarks/gnn_cost_model.py --by family`.
set -euo pipefail
# Every family at least once: residual, plain, inception, encoder and decoder
# attention, depthwise/separable, dense, squeeze-excitation, grouped convolutions.
DEFAULT_MODELS="gpt2_small vgg19 bert_base resnet50 transformer_base bert_large inception_v3 keras:MobileNetV2 keras:Xception keras:DenseNet121 keras:EfficientNetB0 keras:MobileNetV3Small keras:ResNeXt26"
OUT=${1:-build/costmodel-data}
PLANS=${2:-6}
REPEATS=${REPEATS:-20}
shift $(( $# > 2 ? 2 : $# )) || true
MODELS=${*:-$DEFAULT_MODELS}
BIN=${BIN:-.venv/bin}
REPLICAS=${REPLICAS:-2}
PLATFORM=${PLATFORM:-cpu}
SIZES=${SIZES:-tiny medium}
KERAS_IMAGE=${KERAS_IMAGE:-96}
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

# keras.applications.NAME's data-parallel SGD step, lowered from shapes only.
capture_keras() {  # NAME REPLICAS PER_REPLICA IMAGE OUT
  KERAS_BACKEND=jax "$BIN/python" - "$@" <<'EOF'
import json, sys, time

name, replicas, per_replica, image, out = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
start = time.perf_counter()
import jax

jax.config.update("jax_num_cpu_devices", replicas)
import jax.numpy as jnp
import keras

from disco_xla.capture import capture_jax
from disco_xla.hlo_passes.hlo_io import save_module



def resnext26(input_shape, classes):
    """ResNeXt-26 (32x4d): four stages of two bottleneck blocks, grouped 3x3 convolutions."""
    layers = keras.layers

    def conv_bn(x, filters, kernel, strides=1, groups=1, relu=True):
        x = layers.Conv2D(filters, kernel, strides, "same", groups=groups, use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        return layers.ReLU()(x) if relu else x

    inputs = keras.Input(input_shape)
    x = layers.MaxPooling2D(3, 2, "same")(conv_bn(inputs, 64, 7, 2))
    for stage, width in enumerate((128, 256, 512, 1024)):
        for block in range(2):
            strides = 2 if stage and not block else 1
            shortcut = x if block else conv_bn(x, 2 * width, 1, strides, relu=False)
            y = conv_bn(x, width, 1)
            y = conv_bn(y, width, 3, strides, groups=32)
            y = conv_bn(y, 2 * width, 1, relu=False)
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.Dense(classes, "softmax")(layers.GlobalAveragePooling2D()(x))
    return keras.Model(inputs, x, name="resnext26")


build = resnext26 if name == "ResNeXt26" else getattr(keras.applications, name)
options = {} if name == "ResNeXt26" else {"weights": None}
model = build(input_shape=(image, image, 3), classes=10, **options)
trainable = [v.value for v in model.trainable_variables]
non_trainable = [v.value for v in model.non_trainable_variables]


def step(trainable, non_trainable, images, labels):
    def loss_fn(trainable):
        logits, state = model.stateless_call(trainable, non_trainable, images, training=True)
        return jnp.mean(keras.losses.sparse_categorical_crossentropy(labels, logits)), state

    (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
    grads = jax.lax.pmean(grads, "data")
    updated = [w - 0.01 * g for w, g in zip(trainable, grads)]
    return updated, state, jax.lax.pmean(loss, "data")


def shapes(values):
    return [jax.ShapeDtypeStruct((replicas, *v.shape), v.dtype) for v in values]


args = (
    shapes(trainable),
    shapes(non_trainable),
    jax.ShapeDtypeStruct((replicas, per_replica, image, image, 3), jnp.float32),
    jax.ShapeDtypeStruct((replicas, per_replica), jnp.int32),
)
module = capture_jax(jax.pmap(step, axis_name="data", devices=jax.devices()[:replicas]), *args)
save_module(module, out)
report = {"model": f"keras:{name}", "replicas": replicas, "batch": replicas * per_replica,
          "image": image, "output": out, "parameters": int(model.count_params()),
          "instructions": module.instruction_count, "capture_s": round(time.perf_counter() - start, 3)}
print(json.dumps(report))
EOF
}

capture() {  # MODEL PER_REPLICA OUT
  local model=$1 per_replica=$2 module=$3
  case "$model" in
    keras:*) capture_keras "${model#keras:}" "$REPLICAS" "$per_replica" "$KERAS_IMAGE" "$module" ;;
    tf:*) "$BIN/disco-xla" capture --model "${model#tf:}" --framework tf \
      --replicas "$REPLICAS" --batch $((per_replica * REPLICAS)) -o "$module" --json ;;
    llama) "$BIN/disco-xla" capture --model llama --mode sharded --replicas "$REPLICAS" \
      --batch $((per_replica * REPLICAS)) -o "$module" --json ;;
    *) "$BIN/disco-xla" capture --model "$model" --replicas "$REPLICAS" \
      --batch $((per_replica * REPLICAS)) -o "$module" --json ;;
  esac
}

mkdir -p "$OUT/modules"
start=$(date +%s)
for model in $MODELS; do
  stem=${model/:/_}
  for size in $SIZES; do
    per_replica=$([ "$size" = tiny ] && echo 2 || echo 16)
    module="$OUT/modules/$stem.$size.hlo.pb"
    [ -f "$module" ] || capture "$model" "$per_replica" "$module"
    [ "${CAPTURE_ONLY:-0}" = 1 ] || [ -f "$OUT/$stem.$size.npz" ] || "$BIN/disco-xla" profile "$module" --plans "$PLANS" \
      --repeats "$REPEATS" --platform "$PLATFORM" --out "$OUT/$stem.$size.npz" --json
  done
done
echo "{\"collection_s\": $(( $(date +%s) - start ))}"
