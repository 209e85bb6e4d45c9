"""Capturing pre-optimisation modules from JAX and TensorFlow, through the API."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from disco_xla import HloModule, capture_jax, capture_tf


def test_capture_jax_of_pmap_equals_the_framework_lowering(captured):
    raw, step, args = captured["jax_pmap_step"]
    module = capture_jax(step, *args)
    assert module.fingerprint == HloModule.from_bytes(raw).fingerprint
    assert len(module.gradient_all_reduces) == 4
    # A second lowering gets another module id from XLA's counter; the
    # fingerprint, which the plan cache and the ranks compare, ignores it.
    assert module.proto.id != HloModule.from_bytes(raw).proto.id


def test_capture_jax_of_jit_shard_map(captured):
    raw, fn, args = captured["jax_shard_map_step"]
    module = capture_jax(fn, *args)
    assert module.fingerprint == HloModule.from_bytes(raw).fingerprint
    assert module.device_counts()["num_partitions"] == 4


def test_capture_jax_wraps_a_plain_function_in_jit():
    def affine(x, w):
        return x @ w + 1.0

    module = capture_jax(affine, jnp.ones((4, 8)), jnp.ones((8, 2)))
    assert module.source == "<jax:affine>"
    (dot,) = [i for i in module.instructions() if i.opcode == "dot"]
    assert dot.flops == 2 * 4 * 2 * 8
    assert module.all_reduces == []


def test_capture_tf_of_a_keras_train_step(captured):
    raw, step, args = captured["tf_train_step"]
    module = capture_tf(step, *args)
    assert module.fingerprint == HloModule.from_bytes(raw).fingerprint
    dots = [i for i in module.instructions() if i.opcode == "dot"]
    assert len(dots) >= 4  # two forward matmuls and their input/weight gradients
    assert any("gradient_tape/" in i.op_name for i in module.instructions())


def test_capture_tf_wraps_a_plain_function():
    import tensorflow as tf

    def scale(x):
        return x * 3.0

    module = capture_tf(scale, tf.ones((2, 3)))
    assert module.opcode_histogram()["multiply"] == 1
    assert jax.tree_util.tree_leaves([module.entry.root.shape.dims]) == [2, 3]
