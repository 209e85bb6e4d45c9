"""Calibration on N `jax.distributed` processes on loopback (gloo): each
process is started as `python -m disco_xla.profiling.calibrate_processes
--worker ...`, runs the same probes as one process does (`calibrate`) over a
mesh of one CPU device per process, and rank 0 reports the results on a marked
line of its output."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from disco_xla.profiling.calibrate import (
    StepCosts,
    measure_collectives,
    measure_step_costs,
    tuple_element_in_step,
)
from disco_xla.simulator.profiles import MEASURED_COLLECTIVE_KINDS

_RESULT_MARK = "disco-xla-calibration: "


def measure_multi_process(
    processes: int, sizes: list[int], repeats: int, timeout_s: float = 900
) -> tuple[dict[str, list[tuple[int, float]]], float, StepCosts]:
    """`measure_collectives` over `processes` jax.distributed processes on
    loopback, a tuple tensor's share of a separate all-reduce
    (`tuple_element_in_step`) and the `StepCosts` there."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "disco_xla.profiling.calibrate_processes", "--worker"]
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
    collectives = {
        kind: [tuple(point) for point in points] for kind, points in result["collectives"].items()
    }
    return collectives, result["tuple_share"], StepCosts(*result["step"])


def _worker(rank: int, processes: int, port: int, repeats: int, sizes: list[int]) -> None:
    """One jax.distributed process: psum and the other collectives over a mesh of
    one CPU device per process."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=rank)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharding = NamedSharding(mesh, P("d"))
    measured = measure_collectives(
        mesh,
        lambda x: jax.make_array_from_process_local_data(sharding, x),
        sizes,
        repeats,
        kinds=("all-reduce",),
    )
    tuple_share = tuple_element_in_step(
        mesh, lambda x: jax.make_array_from_process_local_data(sharding, x)
    )
    replicated = NamedSharding(mesh, P())
    step = measure_step_costs(
        mesh,
        lambda x: jax.make_array_from_process_local_data(replicated, x),
        lambda x: jax.make_array_from_process_local_data(sharding, x),
    )
    # After gloo has run the other collectives, its all-reduces time differently
    # (a tuple all-reduce's tensors came out free): they are timed last.
    measured.update(
        measure_collectives(
            mesh,
            lambda x: jax.make_array_from_process_local_data(sharding, x),
            sizes,
            repeats,
            kinds=MEASURED_COLLECTIVE_KINDS,
        )
    )
    jax.distributed.shutdown()
    if rank == 0:
        result = {
            "collectives": measured,
            "tuple_share": tuple_share,
            "step": [
                step.step_overhead_s,
                step.step_buffer_s,
                step.empty_step_s,
                step.kernel_time_scale,
                step.all_reduce_in_step_s,
                step.worker_lag,
                step.collective_in_step_s,
            ],
        }
        print(_RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    rank, processes, port, repeats, *sizes = map(int, sys.argv[2:])
    _worker(rank, processes, port, repeats, sizes)
