"""Shared fixtures: real modules captured live from JAX and TensorFlow.

JAX gets 4 CPU devices before anything touches its backend.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile


def _share_compiles_within_the_run() -> str | None:
    """JAX's persistent compilation cache, in a directory of this run's own,
    set before JAX starts: the pytest workers and every process a test starts
    read the programs one of them compiled (the tiny zoo models, compiled by
    many test files, and the rewritten programs disco-xla compiles from HLO).
    Returns the directory where this process made it, to remove at the end."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run:  # a worker started without the controller's environment
        directory = os.path.join(tempfile.gettempdir(), f"disco_xla_test_compiles_{run}")
        os.makedirs(directory, exist_ok=True)
        made = None
    else:
        directory = made = tempfile.mkdtemp(prefix="disco_xla_test_compiles_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    return made


_COMPILE_CACHE_MADE = _share_compiles_within_the_run()

import jax  # noqa: E402  (after the cache's environment is set)
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)


def pytest_unconfigure(config) -> None:
    if _COMPILE_CACHE_MADE and not os.environ.get("PYTEST_XDIST_WORKER"):
        shutil.rmtree(_COMPILE_CACHE_MADE, ignore_errors=True)


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run the installed `disco-xla` command the way a user would."""
    command = os.path.join(os.path.dirname(sys.executable), "disco-xla")
    return subprocess.run(
        [command, *args], capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT
    )


def simulate_plans(path: str, cluster: str, plans, timeout_s: float = 300) -> dict[str, dict]:
    """`disco-xla simulate PATH --plan A --plan B ... --json` in one run: each
    plan's summary, by plan name (the command must succeed)."""
    flags = [flag for plan in plans for flag in ("--plan", plan)]
    result = run_cli("simulate", path, "--cluster", cluster, *flags, "--json", timeout_s=timeout_s)
    assert result.returncode == 0, result.stderr[-1500:]
    summaries = [json.loads(line) for line in result.stdout.splitlines()]
    assert [s["plan"] for s in summaries] == list(plans)
    return {s["plan"]: s for s in summaries}


def assert_round_trip_is_lossless(raw: bytes) -> None:
    """Our parse and re-serialise gives the same HLO text and StableHLO as XLA's bytes."""
    from jax._src.lib import _jax, xla_client

    from disco_xla.hlo.graph import HloModule

    again = HloModule.from_bytes(raw, "round-trip").to_bytes()
    assert xla_client.XlaComputation(again).as_hlo_text() == (
        xla_client.XlaComputation(raw).as_hlo_text()
    )
    assert _jax.mlir.hlo_to_stablehlo(again) == _jax.mlir.hlo_to_stablehlo(raw)


def _pmap_training_step():
    from disco_xla.demo import build_step

    step, args, parameter_tensors = build_step()
    return step, args, parameter_tensors


def _shard_map_step():
    import jax.numpy as jnp
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(jax.devices(), ("data",))

    def step(w, x):
        grad = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        return w - 0.1 * grad

    fn = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P()))
    return fn, (jnp.ones((8, 4)), jnp.ones((16, 8)))


def _conv_dot_sort():
    import jax.numpy as jnp

    def f(images, kernel, w):
        y = jax.lax.conv_general_dilated(images, kernel, (1, 1), "VALID")  # NCHW, OIHW
        flat = y.reshape(y.shape[0], -1)
        return jnp.sort(flat @ w, axis=-1)

    args = (jnp.ones((2, 3, 10, 10)), jnp.ones((5, 3, 3, 3)), jnp.ones((5 * 8 * 8, 7)))
    return jax.jit(f), args


def _tf_train_step():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(4)]
    )

    @tf.function(jit_compile=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        updated = [v - 0.1 * g for v, g in zip(model.trainable_variables, grads, strict=True)]
        return loss, grads, updated

    return train_step, (tf.ones((5, 8)), tf.ones((5, 4))), len(model.trainable_variables)


@pytest.fixture(scope="session")
def captured():
    """name -> (raw serialized bytes from the framework, function, args)."""
    modules = {}
    step, args, _ = _pmap_training_step()
    modules["jax_pmap_step"] = (_lower(step, args), step, args)
    fn, args = _shard_map_step()
    modules["jax_shard_map_step"] = (_lower(fn, args), fn, args)
    fn, args = _conv_dot_sort()
    modules["jax_conv_dot_sort"] = (_lower(fn, args), fn, args)
    fn, args, _ = _tf_train_step()
    raw = fn.experimental_get_compiler_ir(*args)(stage="hlo_serialized")
    modules["tf_train_step"] = (raw, fn, args)
    return modules


def _lower(fn, args) -> bytes:
    return fn.lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()


@pytest.fixture(scope="session")
def module_files(captured, tmp_path_factory):
    """Each captured module written as a .pb file: name -> path."""
    directory = tmp_path_factory.mktemp("captured")
    paths = {}
    for name, (raw, _, _) in captured.items():
        path = directory / f"{name}.hlo.pb"
        path.write_bytes(raw)
        paths[name] = str(path)
    return paths


@pytest.fixture(scope="session")
def fsdp_step():
    """The tiny Llama step on a 4-device mesh that shards every parameter 4
    ways, captured after XLA's partitioning: a module with FSDP all-gathers (in
    the layers' loop bodies and outside them) and gradient all-reduces."""
    from disco_xla.zoo import capture_model

    return capture_model("llama", "jax", 4, mode="sharded", fsdp=4).module


@pytest.fixture(scope="session")
def fsdp_step_file(fsdp_step, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fsdp") / "llama_fsdp.hlo.pb"
    path.write_bytes(fsdp_step.to_bytes())
    return str(path)
