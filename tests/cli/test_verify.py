"""`disco-xla verify` as a user runs it: modules that cannot be compared are
refused, and a step that assigns variables runs many times."""

from __future__ import annotations

import json

from disco_xla import save_module
from tests.conftest import run_cli


def test_verify_refuses_modules_with_different_parameters(module_files):
    result = run_cli(
        "verify",
        module_files["jax_pmap_step"],
        module_files["jax_shard_map_step"],
        "--devices",
        "4",
    )
    assert result.returncode == 2 and "different parameters" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_verify_refuses_a_device_count_the_module_was_not_made_for(module_files):
    result = run_cli(
        "verify", module_files["jax_pmap_step"], module_files["jax_pmap_step"], "--devices", "2"
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "runs on 4 devices, not 2" in result.stderr


def test_verify_runs_a_step_that_assigns_variables_many_times(tmp_path):
    """A TF step that assigns variables (batch norm's moving statistics) aliases
    those outputs to its inputs; the runners time it on the same arguments
    again and again, and no run may read a buffer an earlier one donated."""
    import keras
    import tensorflow as tf

    from disco_xla.capture import capture_tf
    from disco_xla.hlo_passes.insert_gradient_all_reduces import InsertGradientAllReduces

    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8), keras.layers.BatchNormalization()]
    )

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x, training=True) ** 2)
        return loss, *tape.gradient(loss, model.trainable_variables)

    module = capture_tf(step, tf.ones((4, 6)))
    assert module.proto.input_output_alias  # the moving statistics
    names = [v.name for v in model.trainable_variables]
    InsertGradientAllReduces(list(range(1, 1 + len(names))), 2, names).run(module)
    path = tmp_path / "bn.hlo.pb"
    save_module(module, path)
    result = run_cli("verify", str(path), str(path), "--devices", "2", "--rounds", "3", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["bit_equal"] is True
