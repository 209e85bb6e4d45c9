"""The runner is device-generic: the platform named reaches the devices and the
compiler, the combiner to disable is the platform's, and a platform without
devices is one line of bad input. Only the CPU can run here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.runtime.candidate_timing import time_candidates
from disco_xla.runtime.xla_runner import (
    NO_COMBINER,
    NO_COMBINER_BY_PLATFORM,
    DevicesUnavailable,
    PartitionedProgram,
    available_devices,
    compile_module,
    no_combiner,
    platform_devices,
    program_for,
    random_arguments,
)

no_gpu = pytest.mark.skipif(bool(available_devices("gpu")), reason="JAX sees a GPU here")


def _pmap_module(devices: int) -> tuple[HloModule, object]:
    """A tiny pmap'd step over `devices` CPU devices, and the function."""
    step = jax.pmap(
        lambda x: jax.lax.psum(jnp.tanh(x) * 2.0, "i"),
        axis_name="i",
        devices=jax.devices()[:devices],
    )
    raw = step.lower(jnp.ones((devices, 8))).compiler_ir("hlo").as_serialized_hlo_module_proto()
    return HloModule.from_bytes(raw, f"pmap over {devices}"), step


@no_gpu
def test_a_platform_without_devices_is_one_line_naming_it_and_the_count():
    with pytest.raises(DiscoInputError) as raised:
        platform_devices("gpu", 2)
    message = str(raised.value)
    assert isinstance(raised.value, DevicesUnavailable)
    assert isinstance(raised.value, RuntimeError)  # older callers catch RuntimeError
    assert "\n" not in message
    assert message.startswith("gpu: no GPU devices are available")
    assert "JAX has 0" in message and "needs 2" in message


@no_gpu
def test_a_gpu_program_is_refused_before_anything_compiles():
    module, _ = _pmap_module(2)
    with pytest.raises(DevicesUnavailable, match="gpu: no GPU devices"):
        program_for(module, disabled_passes=no_combiner("gpu"), platform="gpu")
    with pytest.raises(DevicesUnavailable, match="gpu: no GPU devices"):
        compile_module(module, no_combiner("gpu"), platform="gpu")


def test_too_few_cpu_devices_is_one_line_naming_the_counts():
    with pytest.raises(DevicesUnavailable) as raised:
        platform_devices("cpu", len(jax.devices("cpu")) + 1)
    assert str(raised.value).startswith("cpu: the module needs")
    assert "jax_num_cpu_devices" in str(raised.value)


def test_the_cpu_named_explicitly_compiles_and_runs_on_cpu_devices():
    module, step = _pmap_module(2)
    program = program_for(module, disabled_passes=no_combiner("cpu"), platform="cpu")
    assert program.platform == "cpu"
    assert [device.platform for device in program.devices] == ["cpu", "cpu"]
    x = random_arguments(program.parameters, seed=0)
    outputs = program.run(x)
    expected = np.asarray(step(x[0]))
    np.testing.assert_array_equal(np.concatenate([o[0] for o in outputs]), expected)


def test_a_one_device_pmap_module_runs_partitioned():
    """One GPU runs one replica: a pmap module over one device keeps Shardy's
    custom-calls, which compiled as a replica failed XLA's layout check."""
    module, step = _pmap_module(1)
    program = program_for(module, disabled_passes=NO_COMBINER, platform="cpu")
    assert isinstance(program, PartitionedProgram)
    x = random_arguments(program.parameters, seed=1)
    np.testing.assert_array_equal(program.run(x)[0][0], np.asarray(step(x[0])))


def test_the_combiner_to_disable_is_the_platforms():
    assert no_combiner() == no_combiner("cpu") == NO_COMBINER == ("cpu-all-reduce-combiner",)
    assert "gpu-all-reduce-combiner" in no_combiner("gpu")
    assert "all-reduce-combiner" in no_combiner("gpu")
    # XLA skips disabled names no pass has: the GPU names compile on the CPU.
    module, _ = _pmap_module(2)
    assert program_for(module, disabled_passes=NO_COMBINER_BY_PLATFORM["gpu"], platform="cpu")


def test_time_candidates_runs_on_the_platform_named():
    module, _ = _pmap_module(2)
    copy = HloModule.from_bytes(module.to_bytes(), "copy")
    original_s, results = time_candidates(module, {"copy": copy}, 2, rounds=1, platform="cpu")
    assert original_s > 0 and results["copy"].outputs.bit_equal
