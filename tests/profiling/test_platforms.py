"""GPU readiness of the profiling path, tested on the CPU: the platform named
reaches the runner and the trace's planes, `profile --platform gpu` without a GPU
is one line and exit code 2, and `benchmarks/gpu_profile.sh` stops at once,
with a clear message, where there is no GPU."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import time

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.profiling.kernel_times import (
    KERNEL_PLANES,
    NO_COMMAND_BUFFERS,
    command_buffers,
    hlo_op,
    instruction_runs,
    kernels_one_by_one,
)
from disco_xla.profiling.sample_plans import measure_xla_compiled
from disco_xla.runtime.xla_runner import available_devices
from tests.conftest import REPO_ROOT, run_cli

no_gpu = pytest.mark.skipif(bool(available_devices("gpu")), reason="JAX sees a GPU here")
SCRIPT = os.path.join(REPO_ROOT, "benchmarks", "gpu_profile.sh")


def test_profiling_on_the_cpu_named_explicitly_measures_its_kernels(captured):
    module = HloModule.from_bytes(captured["jax_shard_map_step"][0])
    samples = measure_xla_compiled(module, "sm.tiny", "sm", repeats=2, platform="cpu")
    assert samples and all(s.time_s > 0 for s in samples)
    assert {s.plan_kind for s in samples} == {"xla-compiled"}


@no_gpu
def test_profiling_on_a_gpu_without_one_is_refused_in_one_line(captured):
    module = HloModule.from_bytes(captured["jax_shard_map_step"][0])
    with pytest.raises(DiscoInputError, match="^gpu: no GPU devices are available"):
        measure_xla_compiled(module, "sm.tiny", "sm", repeats=2, platform="gpu")


def test_gpu_kernels_are_named_by_their_thunks_annotation():
    assert KERNEL_PLANES["gpu"] == ("/device:GPU:",)
    annotation = "jit_step:#hlo_module=jit_step#::Thunk:#hlo_op=custom-call.3,hlo_module=jit_step#"
    assert hlo_op("sm90_xmma_gemm_f32", {"kernel_annotation": annotation}, "gpu") == "custom-call.3"
    assert hlo_op("loop_add_fusion", {}, "gpu") == "loop_add_fusion"
    assert hlo_op("fusion.2", {"hlo_op": "fusion.2"}, "cpu") == "fusion.2"
    assert hlo_op("ThreadpoolListener", {}, "cpu") is None


def test_consecutive_kernels_of_one_instruction_are_one_run_on_a_gpu_only():
    gemm = {"kernel_annotation": "Thunk:#hlo_op=dot.1#"}
    events = [("k1", gemm, 1.0), ("k2", gemm, 2.0), ("f", {}, 0.5), ("k1", gemm, 1.5)]
    assert instruction_runs(events, "gpu") == [("dot.1", 3.0), ("f", 0.5), ("dot.1", 1.5)]
    cpu_events = [("dot.1", {"hlo_op": "dot.1"}, 1.0), ("dot.1", {"hlo_op": "dot.1"}, 2.0)]
    assert instruction_runs(cpu_events, "cpu") == [("dot.1", 1.0), ("dot.1", 2.0)]


def test_gpu_profiling_turns_command_buffers_off_unless_the_user_chose():
    environ = {"XLA_FLAGS": "--xla_gpu_autotune_level=2"}
    assert kernels_one_by_one(environ)
    assert environ["XLA_FLAGS"] == "--xla_gpu_autotune_level=2 " + NO_COMMAND_BUFFERS
    assert not kernels_one_by_one(environ)  # once is enough
    chosen = {"XLA_FLAGS": "--xla_gpu_enable_command_buffer=FUSION"}
    assert not kernels_one_by_one(chosen)
    assert chosen["XLA_FLAGS"] == "--xla_gpu_enable_command_buffer=FUSION"
    empty: dict[str, str] = {}
    assert kernels_one_by_one(empty) and empty["XLA_FLAGS"] == NO_COMMAND_BUFFERS


def test_a_command_buffer_is_told_apart_from_the_kernels_it_hides():
    names = ["command_buffer_1", "fusion.2", "command_buffer", "my_command_buffer_op"]
    assert command_buffers(names) == ["command_buffer", "command_buffer_1"]


def test_a_gpu_planes_stream_lines_alone_are_read_where_it_has_them():
    """A line that repeats the kernels per HLO op must not count them twice."""
    events = [
        ("k1", {"hlo_op": "dot.1", "line": "Stream #7(Compute)"}, 1.0),
        ("dot.1", {"hlo_op": "dot.1", "line": "XLA Ops"}, 1.2),
        ("k2", {"hlo_op": "fusion", "line": "Stream #7(Compute)"}, 0.5),
    ]
    assert instruction_runs(events, "gpu") == [("dot.1", 1.0), ("fusion", 0.5)]
    unnamed = [(name, {**stats, "line": "0"}, s) for name, stats, s in events]
    # Without stream lines every line is read (consecutive runs of dot.1 merge).
    assert [name for name, _ in instruction_runs(unnamed, "gpu")] == ["dot.1", "fusion"]
    assert sum(s for _, s in instruction_runs(unnamed, "gpu")) == pytest.approx(2.7)


def _run_script(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", SCRIPT, str(tmp_path / "model")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        env={**os.environ, "DATA": str(tmp_path / "data"), **env},
    )


def test_gpu_profile_script_without_nvidia_smi_stops_at_once(tmp_path):
    start = time.perf_counter()
    result = _run_script(tmp_path, NVIDIA_SMI=str(tmp_path / "no-such-nvidia-smi"))
    assert time.perf_counter() - start < 30
    assert result.returncode == 2
    assert "no GPU is present" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "model").exists() and not (tmp_path / "data").exists()


@no_gpu
def test_gpu_profile_script_stops_where_jax_sees_no_gpu(tmp_path):
    """nvidia-smi may list a GPU that JAX cannot use (a jaxlib without CUDA)."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H200 (UUID: GPU-test)"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    start = time.perf_counter()
    result = _run_script(tmp_path, NVIDIA_SMI=str(fake))
    assert time.perf_counter() - start < 30
    assert result.returncode == 2
    assert "JAX sees no GPU devices" in result.stderr
    assert not (tmp_path / "model").exists()


def test_gpu_profile_script_runs_the_source_tree_where_there_is_no_venv(tmp_path):
    """On a GPU machine the script runs under that machine's own Python (the one
    with a CUDA jaxlib), from the source tree. Here: the same steps on the CPU,
    one small model, to a trained model directory."""
    model = tmp_path / "model"
    result = subprocess.run(
        ["bash", SCRIPT, str(model)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        env={
            **os.environ,
            "PLATFORM": "cpu",
            "BIN": str(tmp_path / "no-venv"),
            "PYTHON": sys.executable,
            "MODELS": "vgg19",
            "PLANS": "1",
            "REPEATS": "2",
            "EPOCHS": "3",
            "BUDGET_S": "400",
            "TRAIN_S": "120",
            "DATA": str(tmp_path / "data"),
        },
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "running the source tree under" in result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["platform"] == "cpu" and report["data_sets"] == 2
    assert report["training"]["models"] == ["vgg19"]
    assert (model / "config.json").exists() and (model / "params.npz").exists()


def test_gpu_profile_script_passes_only_flags_the_commands_take():
    """Every `--flag` the script gives `disco-xla capture`, `profile` and
    `train-cost-model` is one that command's --help lists."""
    lines = open(SCRIPT).read().replace("\\\n", " ").splitlines()
    for command in ("capture", "profile", "train-cost-model"):
        calls = [m for line in lines if (m := re.search(rf'disco\[@]}}"\s+{command}\s.*', line))]
        assert len(calls) == 1, command
        flags = re.findall(r"\s(--[a-z-]+)", calls[0].group(0))
        assert flags, command
        help_text = run_cli(command, "--help").stdout
        for flag in flags:
            assert flag in help_text, (command, flag)
