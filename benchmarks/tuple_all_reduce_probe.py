"""XLA:CPU's tuple all-reduce alone, against the simulator's model of it.

On 2 CPU devices in one process, with the shapes of a zoo model's gradients:
a step that only psums them as one tuple, a step that psums their concatenation,
and the sum of steps that each psum one tensor. The model is the profile's: one
all-reduce of all the bytes, plus `tuple_all_reduce_element_s` for each tensor
after the first, plus the host's cost of the step (`step_overhead_s`, and
`step_buffer_s` for each argument and result).

    .venv/bin/python benchmarks/tuple_all_reduce_probe.py MODEL [--cluster NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def median_step_s(function, arguments, runs: int) -> float:
    """Median wall time of `function(*arguments)`, blocked on, after 5 warm-ups."""
    import jax

    for _ in range(5):
        jax.block_until_ready(function(*arguments))
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        jax.block_until_ready(function(*arguments))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="zoo model whose gradient shapes to use")
    parser.add_argument("--cluster", default="cpu-local-inprocess")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()

    import jax

    jax.config.update("jax_num_cpu_devices", 2)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from disco_xla.simulator.comm import all_reduce_s
    from disco_xla.simulator.profiles import load_profile
    from disco_xla.zoo import capture_model

    module = capture_model(args.model, "jax", replicas=2).module
    gradients = {a.name for a in module.gradient_all_reduces}
    shapes = [tuple(i.shape.dims) for i in module.instructions() if i.name in gradients]
    total_bytes = sum(int(np.prod(shape)) * 4 for shape in shapes)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    split = NamedSharding(mesh, P("d"))

    def place(shape):
        return jax.device_put(np.ones((2, *shape), np.float32), split)

    def per_device(function):
        return jax.jit(jax.shard_map(function, mesh=mesh, in_specs=P("d"), out_specs=P("d")))

    as_tuple = per_device(lambda *xs: jax.lax.psum(xs, "d"))
    as_one = per_device(lambda x: jax.lax.psum(x, "d"))
    tensors = [place(shape) for shape in shapes]
    tuple_s = median_step_s(as_tuple, tensors, args.runs)
    one_s = median_step_s(as_one, [place((total_bytes // 4,))], args.runs)
    singles_s = sum(median_step_s(as_one, [t], max(args.runs // 3, 5)) for t in tensors)

    profile = load_profile(args.cluster)
    modelled_s = (
        all_reduce_s(total_bytes, profile)
        + (len(shapes) - 1) * profile.tuple_all_reduce_element_s
        + profile.step_overhead_s
        + 2 * len(shapes) * profile.step_buffer_s
    )
    print(f"{args.model}: {len(shapes)} gradients, {total_bytes / 1e6:.3f} MB")
    print(f"step of one tuple psum: {tuple_s * 1e3:.3f} ms (modelled {modelled_s * 1e3:.3f} ms)")
    print(f"step of one psum of the concatenation: {one_s * 1e3:.3f} ms")
    print(f"steps of one psum per tensor, summed: {singles_s * 1e3:.3f} ms")
    extra_us = (tuple_s - one_s) / max(len(shapes) - 1, 1) * 1e6
    print(
        f"each tensor after the first: {extra_us:.1f} us measured here, "
        f"{profile.tuple_all_reduce_element_s * 1e6:.1f} us in {args.cluster}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
