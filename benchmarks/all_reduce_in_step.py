"""What a small all-reduce adds to a step, by how much the workers compute between
all-reduces: `disco-xla calibrate`'s in-step probe (`calibrate.in_step_probe`)
with more or less kernel work a round.

Each step runs 16 rounds of 8 elementwise kernels (`sin`, XLA's fusion off) on
each worker's vector; in the step with all-reduces each round ends with a psum of
the vector's first 4 KB. The two steps are timed in paired, alternating rounds
with the CPUs kept awake (`disco_xla.timing.cpus_kept_awake`). Each line prints
the kernel time of a round, what each all-reduce adds, and the worker lag that
line gives against the first (`calibrate.worker_lag`; calibrate uses the sizes
4 KB and 256 KB). A diagnostic for the simulator's validation (issue 4).

    .venv/bin/python benchmarks/all_reduce_in_step.py            # 2 devices, one process
    disco-xla launch -n 2 benchmarks/all_reduce_in_step.py       # 2 gloo processes
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kernel-kb", type=int, nargs="+", default=[4, 16, 64, 256, 1024], help="per worker"
    )
    args = parser.parse_args()

    import jax

    from disco_xla.runtime.launch import RANK_VARIABLE

    distributed = RANK_VARIABLE in os.environ  # run by `disco-xla launch`
    if not distributed:
        jax.config.update("jax_num_cpu_devices", 2)
    from jax.sharding import Mesh
    from validate_simulator import _placements

    from disco_xla.profiling import calibrate
    from disco_xla.timing import cpus_kept_awake

    mesh = Mesh(np.array(jax.devices() if distributed else jax.devices()[:2]), ("d",))
    _, place_split = _placements(mesh)
    runtime = f"{jax.process_count()} gloo processes" if distributed else "2 devices, one process"
    with cpus_kept_awake() as awake:
        found = [
            (kb, calibrate.collective_in_step(mesh, place_split, kb * 1024))
            for kb in args.kernel_kb
        ]
    if jax.process_index() == 0:
        print(f"{runtime}; idle CPUs kept polling: {awake}")
        print("| kernel KB per worker | kernel time a round, us | each all-reduce adds, us |")
        print("| ---: | ---: | ---: |")
        for kb, (all_reduce_s, round_s) in found:
            print(f"| {kb:,} | {round_s * 1e6:.0f} | {all_reduce_s * 1e6:.0f} |")
        first = found[0][1]
        lags = ", ".join(f"{kb} KB: {calibrate.worker_lag(first, m):.2f}" for kb, m in found[1:])
        print(f"worker lag against {found[0][0]} KB: {lags}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
