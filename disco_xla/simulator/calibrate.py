"""`disco-xla calibrate`: measure all-reduce times on the current runtime and fit
the ring model's alpha (latency per step) and B (bandwidth) by least squares.

T(S) = 2(p-1)·alpha + 2(p-1)/p · S/B is linear in (alpha, 1/B), so an ordinary
least-squares fit over sizes from 4 KB to 256 MB gives both. Two runtimes:
N CPU devices in one process, or N `jax.distributed` processes on loopback (gloo).
The same run measures this machine's f32 matmul rate and memory bandwidth, and
what each tensor of a tuple all-reduce (XLA:CPU's combined all-reduce) adds:
(T(tuple of k tensors) - T(their bytes as one tensor)) / (k - 1). It writes a
`cpu-threads` profile.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from disco_xla.timing import median_seconds

SIZES_BYTES = [4096 * 4**k for k in range(9)]  # 4 KB ... 256 MB
# The tuple all-reduce probe: 16 tensors of 16 KB against one of 256 KB.
TUPLE_TENSORS, TUPLE_TENSOR_BYTES = 16, 16 * 1024
_RESULT_MARK = "disco-xla-calibration: "


@dataclass(frozen=True)
class Fit:
    alpha_s: float
    bandwidth_bytes_per_s: float
    points: list[dict]  # bytes, measured_s, fitted_s, relative_residual

    @property
    def max_relative_residual(self) -> float:
        return max(abs(p["relative_residual"]) for p in self.points)


def fit_ring_model(measured: list[tuple[int, float]], workers: int) -> Fit:
    """Least squares of T = 2(p-1)·alpha + 2(p-1)/p·S·(1/B), weighted so that each
    point counts by its relative error (small messages matter as much as large)."""
    steps = 2 * (workers - 1)
    sizes = np.array([s for s, _ in measured], float)
    times = np.array([t for _, t in measured], float)
    design = np.stack([np.full_like(sizes, steps), steps / workers * sizes], axis=1)
    weights = 1.0 / times
    (alpha, inverse_bandwidth), *_ = np.linalg.lstsq(
        design * weights[:, None], times * weights, rcond=None
    )
    alpha = max(float(alpha), 0.0)
    inverse_bandwidth = max(float(inverse_bandwidth), 1e-15)
    fitted = design @ np.array([alpha, inverse_bandwidth])
    points = [
        {
            "bytes": int(s),
            "measured_s": float(t),
            "fitted_s": float(f),
            "relative_residual": float((f - t) / t),
        }
        for s, t, f in zip(sizes, times, fitted, strict=True)
    ]
    return Fit(alpha, 1.0 / inverse_bandwidth, points)


def _time_call(fn: Callable, argument, repeats: int) -> float:
    return median_seconds(lambda: fn(argument).block_until_ready(), repeats)


def measure_in_process(
    devices: int, sizes: list[int], repeats: int, tick: Callable[[], None] = lambda: None
) -> list[tuple[int, float]]:
    """All-reduce (psum) times over `devices` CPU devices of this process."""
    import jax
    import jax.numpy as jnp

    chosen = jax.devices("cpu")[:devices]
    if len(chosen) < devices:
        raise RuntimeError(f"need {devices} CPU devices, JAX has {len(chosen)}")
    reduce = jax.pmap(lambda x: jax.lax.psum(x, "d"), axis_name="d", devices=chosen)
    fill = jax.pmap(
        lambda i, n: jnp.full((n,), i, jnp.float32), static_broadcasted_argnums=1, devices=chosen
    )
    measured = []
    for size in sizes:
        data = fill(jnp.arange(devices, dtype=jnp.float32), size // 4)
        measured.append((size, _time_call(reduce, data, repeats)))
        tick()
    return measured


def _tuple_element_s(reduce_tuple: Callable, reduce_one: Callable, data, repeats: int) -> float:
    """Seconds each tensor after the first adds to a tuple all-reduce (>= 0)."""
    tuple_s = _time_call(reduce_tuple, data, repeats)
    one_s = _time_call(reduce_one, data, repeats)
    return max(0.0, (tuple_s - one_s) / (TUPLE_TENSORS - 1))


def _tuple_probe(axis: str) -> tuple[Callable, Callable]:
    """(psum of a tuple of TUPLE_TENSORS slices, psum of the whole) over `axis`;
    each takes a vector of TUPLE_TENSORS * TUPLE_TENSOR_BYTES bytes of f32."""
    import jax
    import jax.numpy as jnp

    length = TUPLE_TENSOR_BYTES // 4

    def as_tuple(x):
        parts = tuple(x[i * length : (i + 1) * length] for i in range(TUPLE_TENSORS))
        return jnp.concatenate(jax.lax.psum(parts, axis))

    return as_tuple, lambda x: jax.lax.psum(x, axis)


def measure_tuple_element_in_process(devices: int, repeats: int) -> float:
    """`_tuple_element_s` over `devices` CPU devices of this process."""
    import jax
    import jax.numpy as jnp

    chosen = jax.devices("cpu")[:devices]
    as_tuple, as_one = _tuple_probe("d")
    data = jnp.ones((devices, TUPLE_TENSORS * TUPLE_TENSOR_BYTES // 4), jnp.float32)
    return _tuple_element_s(
        jax.pmap(as_tuple, axis_name="d", devices=chosen),
        jax.pmap(as_one, axis_name="d", devices=chosen),
        data,
        repeats,
    )


def measure_device(repeats: int = 5) -> tuple[float, float]:
    """(f32 matmul FLOP/s, memory bandwidth bytes/s) of one CPU device."""
    import jax
    import jax.numpy as jnp

    n = 2048
    a = jnp.ones((n, n), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    flops = 2 * n**3 / median_seconds(lambda: matmul(a).block_until_ready(), repeats)
    big = jnp.ones((64 * 2**20,), jnp.float32)  # 256 MB
    scale = jax.jit(lambda x: x * 1.5)
    bandwidth = 2 * big.nbytes / median_seconds(lambda: scale(big).block_until_ready(), repeats)
    return flops, bandwidth


def measure_multi_process(
    processes: int, sizes: list[int], repeats: int, timeout_s: float = 900
) -> tuple[list[tuple[int, float]], float]:
    """All-reduce times over `processes` jax.distributed processes on loopback,
    and `_tuple_element_s` there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "disco_xla.simulator.calibrate", "--worker"]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    workers = [
        subprocess.Popen(
            [*command, str(rank), str(processes), str(port), str(repeats), *map(str, sizes)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in range(processes)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        outputs = [w.communicate(timeout=max(1.0, deadline - time.monotonic())) for w in workers]
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"the {processes} calibration processes did not finish in {timeout_s:.0f} s"
        ) from None
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    for rank, (worker, (_, err)) in enumerate(zip(workers, outputs, strict=True)):
        if worker.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"calibration process {rank} failed: {last}")
    # gloo prints its own status lines to stdout; ours is the marked one.
    marked = [line for line in outputs[0][0].splitlines() if line.startswith(_RESULT_MARK)]
    if not marked:
        raise RuntimeError("calibration process 0 reported no result")
    result = json.loads(marked[-1][len(_RESULT_MARK) :])
    return [tuple(point) for point in result["points"]], result["tuple_element_s"]


def _worker(rank: int, processes: int, port: int, repeats: int, sizes: list[int]) -> None:
    """One jax.distributed process: psum over a mesh of one CPU device per process."""
    import jax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=rank)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    reduce = jax.jit(
        jax.shard_map(lambda x: jax.lax.psum(x, "d"), mesh=mesh, in_specs=P("d"), out_specs=P())
    )
    sharding = NamedSharding(mesh, P("d"))
    measured = []
    for size in sizes:
        local = np.full((size // 4,), rank, np.float32)
        data = jax.make_array_from_process_local_data(sharding, local)
        measured.append((size, _time_call(reduce, data, repeats)))
    as_tuple, as_one = (
        jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P()))
        for f in _tuple_probe("d")
    )
    local = np.ones((TUPLE_TENSORS * TUPLE_TENSOR_BYTES // 4,), np.float32)
    data = jax.make_array_from_process_local_data(sharding, local)
    tuple_element_s = _tuple_element_s(as_tuple, as_one, data, repeats)
    jax.distributed.shutdown()
    if rank == 0:
        result = {"points": measured, "tuple_element_s": tuple_element_s}
        print(_RESULT_MARK + json.dumps(result), flush=True)


def cpu_profile(
    fit: Fit,
    workers: int,
    runtime: str,
    flops: float,
    bandwidth: float,
    tuple_element_s: float = 0.0,
) -> dict:
    """The `cpu-threads` profile of this machine as a plain mapping for YAML."""
    link = {"bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s, "latency_s": fit.alpha_s}
    return {
        "name": "cpu-local",
        "description": (
            f"this machine, calibrated by `disco-xla calibrate` ({runtime}, {workers} workers)"
        ),
        "execution": "cpu-threads",
        # The workers share this machine's cores: in one process all devices run
        # their kernels on one thread pool of a thread per core, and processes
        # compete for the same cores.
        "compute_threads": max(1, (os.cpu_count() or 1) // workers),
        "device": {
            "name": "host CPU",
            "peak_flops": {"f32": float(flops)},
            "memory_bandwidth_bytes_per_s": float(bandwidth),
            "kernel_launch_s": 2.0e-6,
        },
        "topology": {"devices_per_node": workers, "nodes": 1},
        "links": {"intra_node": dict(link), "inter_node": dict(link)},
        "all_reduce": "ring",
        "tuple_all_reduce_element_s": float(tuple_element_s),
        "calibration": {
            "runtime": runtime,
            "max_relative_residual": fit.max_relative_residual,
            "points": fit.points,
        },
    }


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    rank, processes, port, repeats, *sizes = map(int, sys.argv[2:])
    _worker(rank, processes, port, repeats, sizes)
