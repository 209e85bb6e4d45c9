"""One zoo step as XLA compiles it, on 1 CPU device and on N in one process.

The same per-device batch on each: how the step's wall time and each device's
kernel and all-reduce times (JAX profiler trace, mean over runs and devices)
change when N devices share this machine's cores. A diagnostic for the
simulator's validation (issue 4), where one device's timeline is simulated.

    .venv/bin/python benchmarks/devices_share_cores.py MODEL DEVICES
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("devices", type=int)
    parser.add_argument("--batch-per-device", type=int, default=4)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    from validate_simulator import compiled_zoo_step

    from disco_xla.profiling.kernel_times import profile_kernel_times

    run = compiled_zoo_step(args.model, args.devices, args.batch_per_device)

    for _ in range(5):
        run()
    times = []
    for _ in range(args.runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    kernels = profile_kernel_times(run, repeats=5, statistic=statistics.mean)
    collective_s = sum(s for name, s in kernels.items() if name.startswith("all-reduce"))
    compute_s = sum(kernels.values()) - collective_s
    print(
        f"{args.model} (tiny), {args.devices} device(s), {args.batch_per_device} examples each: "
        f"step {statistics.median(times) * 1e3:.2f} ms; per device: kernels "
        f"{compute_s * 1e3:.2f} ms, all-reduces {collective_s * 1e3:.2f} ms (trace means)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
