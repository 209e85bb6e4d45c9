"""Per-kernel times of a compiled program, from the JAX profiler's trace.

On XLA:CPU the profiler's `/host:CPU` plane has one event per thunk, named after
the HLO instruction it runs, with the stats `hlo_op` and `hlo_module` (design notes
§2). We run the program a few times under the profiler (each run blocks until its
results are back) and take each instruction's median duration over all runs and
devices. Profiling adds overhead (30-60% measured with the Python tracer on; it is
off here), so these times are for ranking and for the table cost model, not for
wall-clock claims.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.timing import traced_events

# The trace planes that hold kernel events, per platform. On the CPU, one event
# per thunk with the stat `hlo_op`; on a GPU, the device planes' kernel events
# (named after the kernel when they carry no `hlo_op` stat: untested here).
KERNEL_PLANES = {"cpu": ("/host:CPU",), "gpu": ("/device:GPU:",)}


def profile_kernel_times(
    run: Callable[[], object],
    repeats: int = 5,
    platform: str = "cpu",
    statistic: Callable[[list[float]], float] = statistics.median,
) -> dict[str, float]:
    """Seconds of each HLO instruction that `run` executes: the `statistic` (by
    default the median) of its durations over all runs and devices. The mean is
    the one whose sum predicts a step of many kernels (the sum's median tends to
    the sum of the means), where the machine's load stretches some of them."""
    import jax

    # Each run is blocked on: results still in flight when the trace stops are
    # not in it (seen on jax.distributed runs, where dispatch returns at once).
    jax.block_until_ready(run())  # compile caches warm, first-run effects out of the trace
    samples: dict[str, list[float]] = {}
    events = traced_events(lambda: jax.block_until_ready(run()), repeats, KERNEL_PLANES[platform])
    for event_name, stats, seconds in events:
        name = stats.get("hlo_op") or (event_name if platform != "cpu" else None)
        if name:
            samples.setdefault(name, []).append(seconds)
    return {name: statistic(times) for name, times in samples.items()}


def kernel_time_table(compiled: HloModule, times_s: dict[str, float]) -> dict[str, float]:
    """{structural hash: seconds} for each kernel of a compiled module (each of its
    top-level instructions is a kernel), the table cost model's format. Kernels the
    trace did not show are left out, so the table model falls back to the roofline."""
    graph = build_task_graph(compiled, Plan.unfused(compiled))
    table: dict[str, list[float]] = {}
    for kernel in graph.kernels:
        if kernel.name in times_s:
            table.setdefault(kernel.structural_hash, []).append(times_s[kernel.name])
    return {key: statistics.median(values) for key, values in table.items()}
