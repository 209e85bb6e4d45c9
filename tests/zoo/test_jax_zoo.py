"""Every tiny JAX zoo model: captured with one gradient all-reduce per parameter
tensor, read back by `disco-xla inspect`, and run for a step on 2 CPU devices."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from disco_xla import capture_jax, save_module
from disco_xla.zoo.jax_steps import JAX_MODELS, build_jax_step
from tests.conftest import assert_round_trip_is_lossless, run_cli


@pytest.mark.parametrize("mode", ["pmap", "shard_map"])
@pytest.mark.parametrize("name", JAX_MODELS)
def test_tiny_capture_has_one_gradient_all_reduce_per_parameter_tensor(name, mode, tmp_path):
    step = build_jax_step(name, "tiny", replicas=2, global_batch=4, mode=mode, concrete=False)
    module = capture_jax(step.fn, *step.args)
    assert_round_trip_is_lossless(
        step.fn.lower(*step.args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    )
    assert len(module.gradient_all_reduces) == step.parameter_tensors
    assert module.device_counts()["num_partitions"] == 2
    path = tmp_path / f"{name}.hlo.pb"
    save_module(module, path)
    result = run_cli("inspect", str(path), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["gradient_all_reduces"] == step.parameter_tensors


def _per_device(leaf, mode: str) -> list[np.ndarray]:
    if mode == "pmap":
        return list(np.asarray(leaf))
    return [np.asarray(shard.data) for shard in leaf.addressable_shards]


@pytest.mark.parametrize("mode", ["pmap", "shard_map"])
@pytest.mark.parametrize("name", JAX_MODELS)
def test_tiny_step_runs_on_two_devices_with_identical_parameters(name, mode):
    step = build_jax_step(name, "tiny", replicas=2, global_batch=4, mode=mode)
    params, _, _, loss = step.fn(*step.args)
    losses = _per_device(loss, mode)
    assert all(np.all(np.isfinite(value)) for value in losses)
    before = jax.tree_util.tree_leaves(step.args[0])
    after = jax.tree_util.tree_leaves(params)
    moved = False
    for old, new in zip(before, after, strict=True):
        copies = _per_device(new, mode)
        assert len(copies) == 2 and np.array_equal(copies[0], copies[1])
        reference = np.asarray(old)[0] if mode == "pmap" else np.asarray(old)
        moved |= not np.array_equal(copies[0], reference)
    assert moved  # the step did update the parameters
