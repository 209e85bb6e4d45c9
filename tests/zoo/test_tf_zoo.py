"""Every tiny TF zoo model: captured with one gradient all-reduce per variable,
read back by `disco-xla inspect`, and run for a step on 2 CPU devices."""

from __future__ import annotations

import json

import numpy as np
import pytest

from disco_xla import save_module
from disco_xla.runtime.xla_runner import ReplicatedProgram, random_arguments
from disco_xla.zoo.tf_steps import TF_MODELS, build_tf_step, capture_tf_step
from tests.conftest import assert_round_trip_is_lossless, run_cli


@pytest.fixture(scope="module")
def tf_captures():
    """name -> (step, module with all-reduces for 2 replicas)."""
    captures = {}
    for name in TF_MODELS:
        step = build_tf_step(name, "tiny", batch=2)
        captures[name] = (step, capture_tf_step(step, replicas=2))
    return captures


@pytest.mark.parametrize("name", TF_MODELS)
def test_tiny_capture_has_one_gradient_all_reduce_per_variable(tf_captures, name, tmp_path):
    step, module = tf_captures[name]
    assert_round_trip_is_lossless(
        step.fn.experimental_get_compiler_ir(*step.args)(stage="hlo_serialized")
    )
    assert_round_trip_is_lossless(module.to_bytes())  # after the pass too
    assert len(module.gradient_all_reduces) == len(step.variable_names)
    assert all(a.group_size == 2 and a.scope == "replica" for a in module.gradient_all_reduces)
    path = tmp_path / f"{name}.hlo.pb"
    save_module(module, path)
    result = run_cli("inspect", str(path), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["gradient_all_reduces"] == len(step.variable_names)
    assert summary["num_replicas"] == 2


def _run_two_replicas(module, data_parameters: int = 2):
    """One step on 2 devices: different data, the same variable values."""
    program = ReplicatedProgram(module, replicas=2)
    first = random_arguments(program.parameters, seed=0)
    second = random_arguments(program.parameters, seed=1)
    second = second[:data_parameters] + first[data_parameters:]
    return program.run([first, second])


@pytest.mark.parametrize("name", TF_MODELS)
def test_tiny_step_runs_on_two_devices_with_identical_parameters(tf_captures, name):
    step, module = tf_captures[name]
    outputs = _run_two_replicas(module)
    variables = len(step.variable_names)
    assert np.isfinite(outputs[0][0]) and np.isfinite(outputs[1][0])
    for index in range(1, 1 + 2 * variables):  # gradients, then updated variables
        assert np.array_equal(outputs[0][index], outputs[1][index]), step.variable_names[
            (index - 1) % variables
        ]
