"""TensorFlow (Keras 3) training steps for the zoo, captured as single-device HLO.

Models: ResNet50, VGG16 and InceptionV3 from `keras.applications` (weights=None),
and a BERT-like encoder built from Keras layers. The step is a
`tf.function(jit_compile=True)` returning `(loss, *gradients, *updated_variables)`
(plain SGD). Its HLO is one device's program; `capture_tf_step` then inserts one
gradient all-reduce per variable, as Horovod's DistributedOptimizer would, so TF
steps enter the pipeline in the same data-parallel form as JAX ones.

`size="tiny"` keeps each application's layers but uses the smallest input it
accepts (32x32, 75x75 for InceptionV3) and 10 classes; the encoder gets small
widths and depths.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from disco_xla.capture import capture_tf
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.insert_gradient_all_reduces import InsertGradientAllReduces

# TensorFlow and Keras are optional (the `tf` extra): imported where used.

_APPLICATIONS = {"resnet50": "ResNet50", "vgg16": "VGG16", "inception_v3": "InceptionV3"}
_IMAGE_SIDE = {"resnet50": (224, 32), "vgg16": (224, 32), "inception_v3": (299, 75)}
TF_MODELS = (*_APPLICATIONS, "bert_encoder")


@dataclass(frozen=True)
class TfStep:
    fn: Any  # the tf.function
    args: tuple  # (inputs, labels) for one replica
    variable_names: list[str]
    parameter_count: int


def _bert_encoder(size: str):
    import keras

    vocab, hidden, layers, heads, feedforward, sequence = (
        (30522, 768, 12, 12, 3072, 128) if size == "full" else (128, 32, 2, 2, 64, 16)
    )
    tokens = keras.Input((sequence,), dtype="int32")
    x = keras.layers.Embedding(vocab, hidden)(tokens)
    x = PositionEmbedding(sequence, hidden)(x)
    x = keras.layers.LayerNormalization(epsilon=1e-12)(x)
    for _ in range(layers):
        attended = keras.layers.MultiHeadAttention(heads, hidden // heads)(x, x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + attended)
        inner = keras.layers.Dense(feedforward, activation="gelu")(x)
        x = keras.layers.LayerNormalization(epsilon=1e-12)(x + keras.layers.Dense(hidden)(inner))
    pooled = keras.layers.Dense(hidden, activation="tanh")(x[:, 0])
    logits = keras.layers.Dense(2)(pooled)
    return keras.Model(tokens, logits), (sequence,), vocab, 2


def _position_embedding_class():
    import keras

    class _PositionEmbedding(keras.layers.Layer):
        """Adds a learned embedding per position, as BERT does."""

        def __init__(self, length: int, width: int, **kwargs):
            super().__init__(**kwargs)
            self.table = self.add_weight(shape=(length, width), initializer="glorot_uniform")

        def call(self, x):
            return x + self.table[None, : x.shape[1]]

    return _PositionEmbedding


def PositionEmbedding(length: int, width: int):  # noqa: N802 - a layer constructor
    return _position_embedding_class()(length, width)


def build_tf_step(name: str, size: str = "tiny", batch: int = 2, seed: int = 0) -> TfStep:
    """The single-replica training step of TF zoo model `name`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    if name in _APPLICATIONS:
        side = _IMAGE_SIDE[name][0 if size == "full" else 1]
        classes = 1000 if size == "full" else 10
        model = getattr(keras.applications, _APPLICATIONS[name])(
            weights=None,
            input_shape=(side, side, 3),
            classes=classes,
            classifier_activation=None,
        )
        inputs = rng.standard_normal((batch, side, side, 3)).astype(np.float32)
    elif name == "bert_encoder":
        model, input_shape, vocab, classes = _bert_encoder(size)
        inputs = rng.integers(0, vocab, (batch, *input_shape), dtype=np.int32)
    else:
        raise KeyError(name)
    labels = rng.integers(0, classes, (batch,), dtype=np.int32)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    variables = model.trainable_variables

    @tf.function(jit_compile=True)
    def train_step(inputs, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(inputs, training=True))
        # Embedding gradients come as IndexedSlices; all-reduce needs them dense.
        gradients = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
        updated = [v - 0.01 * g for v, g in zip(variables, gradients, strict=True)]
        return (loss, *gradients, *updated)

    return TfStep(
        fn=train_step,
        args=(tf.constant(inputs), tf.constant(labels)),
        variable_names=[v.path for v in variables],
        parameter_count=int(sum(np.prod(v.shape) for v in variables)),
    )


def capture_tf_step(step: TfStep, replicas: int) -> HloModule:
    """The step's HLO with one mean all-reduce over `replicas` per gradient."""
    module = capture_tf(step.fn, *step.args)
    gradients = len(step.variable_names)
    InsertGradientAllReduces(list(range(1, 1 + gradients)), replicas, step.variable_names).run(
        module
    )
    return module
