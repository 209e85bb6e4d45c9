"""How a zoo step's time spreads over repeated runs, with this machine's idle CPUs
left to halt and kept polling (`disco_xla.timing.cpus_kept_awake`).

The step is XLA's own compile of the tiny `jit(shard_map)` training step on N CPU
devices in one process. Blocks of back-to-back runs alternate between the two
settings; each block prints the 10th, 25th, 50th, 75th and 90th percentiles of
its step times, in ms. A diagnostic for the simulator's validation (issue 4): a
median that flips between two values from one block to the next cannot be
predicted to 10%.

    .venv/bin/python benchmarks/step_time_spread.py MODEL [--devices 2] [--blocks 6]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--batch-per-device", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each setting")
    parser.add_argument("--runs", type=int, default=100, help="timed steps in a block")
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    from validate_simulator import compiled_zoo_step

    from disco_xla.timing import cpus_kept_awake

    run = compiled_zoo_step(args.model, args.devices, args.batch_per_device)

    for _ in range(10):
        run()
    print(f"{args.model} (tiny), {args.devices} devices, one process: step ms, percentiles")
    print("| block | idle CPUs | p10 | p25 | p50 | p75 | p90 |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for block in range(2 * args.blocks):
        awake = block % 2 == 1
        with cpus_kept_awake() if awake else contextlib.nullcontext(False) as held:
            if awake and not held:
                print("cannot write /dev/cpu_dma_latency: run as a user who may", file=sys.stderr)
                return 2
            run()
            times = []
            for _ in range(args.runs):
                started = time.perf_counter()
                run()
                times.append((time.perf_counter() - started) * 1e3)
        cells = " | ".join(f"{q:.2f}" for q in np.percentile(times, [10, 25, 50, 75, 90]))
        print(f"| {block // 2 + 1} | {'kept polling' if awake else 'may halt'} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
