"""Training scripts written the way users write them (`benchmarks/clients/`) run
unmodified, plain and under `DISCO_XLA_FLAGS`, and train to the same results;
the hook's report says what ran. The speed check is off here, so that the
rewritten program is what runs under the hook (timing is the benchmark's job)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.real_clients import CLIENTS, hook_flags, run_client

# The step each client trains with, as the hook's report names it, and whether
# it donates its state.
TRAIN_STEPS = {
    "sharded_jit_mnist": ("update", True),
    "keras_fit": ("train_step", True),  # Keras's trainer donates its state
    "flax_nnx": ("train_step", False),  # nnx.jit donates nothing unless asked
    "pmap_donate": ("step", True),
    "distributed_mlp": ("train_step", True),
    "flax_linen_checkpoint": ("train_step", True),
    "optax_multisteps": ("train_step", False),  # as Optax's examples jit it: no donation
    "ragged_last_batch": ("train_step", True),
}


def _hooked_flags(name: str, tmp_path) -> str:
    cluster = "cpu-local" if CLIENTS[name].processes > 1 else "cpu-local-inprocess"
    return hook_flags(
        cluster,
        str(tmp_path / "cache"),
        str(tmp_path / "report.json"),
        # The whole trial in the first call (the background is tested with
        # disco_xla.jit, where the test can wait for it).
        ("--nodisco_check_speed", "--nodisco_background", "--disco_max_evaluations=20"),
    )


def _assert_same_training(plain: dict, hooked: dict) -> None:
    metric = next(key for key in plain if key not in ("params", "step_s", "epoch_s"))
    np.testing.assert_allclose(hooked[metric], plain[metric], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(hooked["params"], plain["params"], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", list(CLIENTS))
def test_a_client_trains_the_same_under_the_hook_and_runs_the_rewritten_step(name, tmp_path):
    plain = run_client(name, None)
    hooked = run_client(name, _hooked_flags(name, tmp_path))
    _assert_same_training(plain.result, hooked.result)
    assert "DiscoFallbackWarning" not in hooked.stderr, hooked.stderr[-2000:]
    step_name, donates = TRAIN_STEPS[name]
    steps = hooked.report["steps"]
    optimized = [step for step in steps if any(s.startswith("optimized") for s in step["status"])]
    assert optimized, steps  # the training step ran rewritten
    if step_name is not None:
        assert [step["name"] for step in optimized] == [step_name], steps
    for step in optimized:
        assert all(status.startswith("optimized") for status in step["status"]), step
        # A signature whose arrays JAX had to move first (pmap's first call on
        # one device's arrays) consumes nothing: at least one says it donates.
        assert any("; donates " in status for status in step["status"]) == donates, step
        for measurement in step["measurements"]:
            chosen = next(label for label, entry in measurement.items() if entry["chosen"])
            # XLA's memory count of both programs (the rewritten one is refused
            # unless it reuses donated buffers as the original does).
            assert measurement[chosen]["peak_bytes"] > 0 < measurement["original"]["peak_bytes"]


_INJECTED = """
import runpy, sys
import disco_xla.driver.trial

def fails(*args, **kwargs):
    raise RuntimeError("injected failure")

disco_xla.driver.trial.rotating_median_seconds = fails  # after the original consumed its state
sys.argv = [{script!r}, "--epochs", "2"]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.parametrize("failure", ["unknown cluster", "after the donation"])
def test_a_failure_under_the_hook_runs_the_original_with_one_warning(failure, tmp_path):
    import json
    import os
    import subprocess
    import sys

    from benchmarks.real_clients import CLIENTS_DIR, DEVICES

    script = os.path.join(CLIENTS_DIR, "sharded_jit_mnist.py")
    cluster = "no-such-cluster" if failure == "unknown cluster" else "cpu-local-inprocess"
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}")
    env["DISCO_XLA_FLAGS"] = hook_flags(
        cluster, str(tmp_path / "cache"), str(tmp_path / "report.json"), ("--nodisco_background",)
    )
    if failure == "unknown cluster":
        command = [sys.executable, script, "--epochs", "2"]
    else:
        command = [sys.executable, "-c", _INJECTED.format(script=script)]
    hooked = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert hooked.returncode == 0, hooked.stderr[-3000:]
    assert hooked.stderr.count("DiscoFallbackWarning") == 1, hooked.stderr[-3000:]
    plain = run_client("sharded_jit_mnist", None)
    _assert_same_training(plain.result, json.loads(hooked.stdout.splitlines()[-1]))
    with open(tmp_path / "report.json") as file:
        (step,) = [s for s in json.load(file)["steps"] if s["name"] == "update"]
    assert all(status.startswith("original: ") for status in step["status"]), step
    words = "no-such-cluster" if failure == "unknown cluster" else "injected failure"
    assert words in step["status"][0]
