"""`disco-xla profile` as a user runs it: a data set written, bad counts and
platforms refused, the CPU named explicitly."""

from __future__ import annotations

import json
import os

import pytest

from disco_xla.costmodel.dataset import load_dataset
from disco_xla.runtime.xla_runner import available_devices
from tests.conftest import run_cli

no_gpu = pytest.mark.skipif(bool(available_devices("gpu")), reason="JAX sees a GPU here")


def test_profile_command_writes_a_data_set(module_files, tmp_path):
    from disco_xla.timing import CPU_LATENCY_DEVICE

    out = tmp_path / "demo.npz"
    # Where this test may hold the CPUs awake, it measures so (as the shipped data
    # set's collection may); elsewhere as the default does.
    awake = os.access(CPU_LATENCY_DEVICE, os.W_OK)
    result = run_cli(
        "profile", module_files["jax_pmap_step"], "--plans", "2", "--repeats", "2",
        "--out", str(out), "--json", *(["--keep-cpus-awake"] if awake else []), timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cpus_kept_awake"] is awake
    dataset = load_dataset(str(out))
    assert report["samples"] == len(dataset) > 0
    assert set(dataset.model.tolist()) == {"jax_pmap_step"}
    assert set(dataset.plan_kind.tolist()) == {"xla-compiled", "xla-like", "unfused"}


def test_profile_command_rejects_a_bad_plan_count(module_files, tmp_path):
    result = run_cli(
        "profile", module_files["jax_pmap_step"], "--plans", "0", "--out", str(tmp_path / "x.npz")
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


@no_gpu
def test_profile_command_on_a_gpu_without_one_exits_2_in_one_line(module_files, tmp_path):
    out = tmp_path / "gpu.npz"
    result = run_cli(
        "profile", module_files["jax_pmap_step"], "--platform", "gpu", "--out", str(out)
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("disco-xla: error: gpu: no GPU devices are available")
    assert "JAX has 0" in lines[0] and "needs 4" in lines[0]
    assert not out.exists()


def test_profile_command_on_the_cpu_named_explicitly_and_learning(module_files, tmp_path):
    """`--learn CLUSTER` keeps each distinct kernel's measured time in the plan
    cache, under that profile's machine key, for the next search there."""
    from disco_xla.costmodel.dataset import load_dataset
    from disco_xla.driver.plan_cache import PlanCache, machine_key
    from disco_xla.simulator.profiles import load_profile

    out = tmp_path / "cpu.npz"
    result = run_cli(
        "profile", module_files["jax_shard_map_step"], "--platform", "cpu", "--plans", "1",
        "--repeats", "1", "--out", str(out), "--learn", "cpu-local",
        "--cache-dir", str(tmp_path / "cache"), "--json", timeout_s=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["platform"] == "cpu" and report["samples"] > 0
    dataset = load_dataset(str(out))
    learned = PlanCache(tmp_path / "cache").kernel_times(machine_key(load_profile("cpu-local")))
    pairs = zip(dataset.structural_hash, dataset.time_s, strict=True)
    measured = {str(h) for h, s in pairs if s > 0}
    assert report["learned_kernels"] == len(learned) > 0 and set(learned) == measured
    refused = run_cli(
        "profile", module_files["jax_shard_map_step"], "--learn", "no-such-cluster",
        "--out", str(out),
    )  # fmt: skip
    assert refused.returncode == 2 and "no-such-cluster" in refused.stderr
