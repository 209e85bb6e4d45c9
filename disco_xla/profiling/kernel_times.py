"""Per-kernel times of a compiled program, from the JAX profiler's trace.

On XLA:CPU the profiler's `/host:CPU` plane has one event per thunk, named after the
HLO instruction it runs, with the stats `hlo_op` and `hlo_module`. A thunk that
XLA:CPU runs asynchronously (the convolutions it hands to Eigen) counts until its
completion event (`timing.thunk_seconds`): its own event ends when the work is
launched.

On a GPU the kernels are on the `/device:GPU:N` planes, one line per stream;
XLA:GPU runs each thunk under the annotation `Thunk:#hlo_op=NAME,hlo_module=...#`,
which the profiler keeps on its kernels (stat `kernel_annotation`), and a thunk
may launch several kernels (a cuBLAS gemm): consecutive kernels of one
instruction on a line count as one run of it (their durations summed). Where a
device plane has lines named "Stream ...", only those are read: the profiler may
add lines that repeat the kernels per HLO op or per step.

Seen on one H200 with jaxlib 0.11.2 (benchmarks/BENCHMARKS.md): the kernel events
carry the instruction in the stat `hlo_op`, on one line "Stream #14(Compute)".
XLA:GPU runs most thunks inside command buffers (CUDA graphs) by default; the
trace then names one event per graph (`hlo_op` "command_buffer_1") and the
instructions in it are not timed one by one. Profiling therefore compiles with
command buffers off (`kernels_one_by_one`): the kernels are the same, only
their launch is not batched.

We run the program a few times under the profiler (each run blocks until its
results are back) and take each instruction's median duration over all runs and
devices. Profiling adds overhead (30-60% measured with the Python tracer on; it
is off here), so these times are for ranking and for the table cost model, not
for wall-clock claims.
"""

from __future__ import annotations

import logging
import os
import re
import statistics
from collections.abc import Callable, Iterable, MutableMapping

import jax

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.timing import thunk_seconds, traced_events

# The trace planes that hold kernel events, per platform. On the CPU, one event
# per thunk with the stat `hlo_op`; on a GPU, the device planes' kernel events
# (see the module docstring; untested here).
KERNEL_PLANES = {"cpu": ("/host:CPU",), "gpu": ("/device:GPU:",)}
_HLO_OP_IN_ANNOTATION = re.compile(r"hlo_op=([^,#:\s]+)")
# XLA:GPU's flag with the kinds of thunk it records into command buffers; empty,
# none is (each kernel is launched, and traced, on its own).
NO_COMMAND_BUFFERS = "--xla_gpu_enable_command_buffer="
_COMMAND_BUFFER = re.compile(r"command_buffer(\.\d+|_\d+)?$")

log = logging.getLogger(__name__)


def kernels_one_by_one(environ: MutableMapping[str, str] = os.environ) -> bool:
    """Turn XLA:GPU's command buffers off in `environ`'s XLA_FLAGS, so that a
    trace times each kernel. XLA reads the flags once, when its GPU backend
    starts: call this before then. True where the flags changed."""
    flags = environ.get("XLA_FLAGS", "")
    if "--xla_gpu_enable_command_buffer" in flags:
        return False  # the caller chose; theirs is kept
    environ["XLA_FLAGS"] = f"{flags} {NO_COMMAND_BUFFERS}".strip()
    return True


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
    # Each run is blocked on: results still in flight when the trace stops are
    # not in it (seen on jax.distributed runs, where dispatch returns at once).
    jax.block_until_ready(run())  # compile caches warm, first-run effects out of the trace
    samples: dict[str, list[float]] = {}
    events = traced_events(lambda: jax.block_until_ready(run()), repeats, KERNEL_PLANES[platform])
    for name, seconds in instruction_runs(events, platform):
        samples.setdefault(name, []).append(seconds)
    graphs = command_buffers(samples)
    if platform != "cpu" and graphs:
        log.warning(
            "XLA:GPU ran kernels inside command buffers (%s): they are timed as one; "
            "set XLA_FLAGS=%s before JAX starts (kernel_times.kernels_one_by_one)",
            ", ".join(graphs[:3]),
            NO_COMMAND_BUFFERS,
        )
    return {name: statistic(times) for name, times in samples.items()}


def command_buffers(names: Iterable[str]) -> list[str]:
    """The names among `names` of XLA:GPU command buffers (a CUDA graph of many
    kernels, timed as one), sorted."""
    return sorted(name for name in names if _COMMAND_BUFFER.match(name))


def instruction_runs(
    events: Iterable[tuple[str, dict, float]], platform: str = "cpu"
) -> list[tuple[str, float]]:
    """(HLO instruction, seconds) of each run of an instruction in the trace's
    `events` (`timing.traced_events`, in plane and line order): on the CPU one
    event is one run, until its completion (`timing.thunk_seconds`); on a GPU
    consecutive kernels of one instruction are one run (see the module
    docstring). Events of no instruction are left out."""
    events = list(events)
    if platform == "cpu":
        events = thunk_seconds(events)
    else:
        # Kernels run on the stream lines; other lines of a device plane (the
        # profiler's derived "XLA Ops" or "Steps", where present) repeat them.
        on_streams = [e for e in events if str(e[1].get("line", "")).startswith("Stream")]
        events = on_streams or events
    runs: list[tuple[str, float]] = []
    previous = None
    for event_name, stats, seconds in events:
        name = hlo_op(event_name, stats, platform)
        if name is None:
            previous = None
            continue
        if platform != "cpu" and name == previous:
            runs[-1] = (name, runs[-1][1] + seconds)
        else:
            runs.append((name, seconds))
        previous = name
    return runs


def hlo_op(event_name: str, stats: dict, platform: str = "cpu") -> str | None:
    """The HLO instruction a trace event ran: its `hlo_op` stat; on a GPU, else
    the `hlo_op=` of its annotation (the innermost, last one), else the kernel's
    own name (XLA names a fusion's kernel after the fusion)."""
    name = stats.get("hlo_op")
    if isinstance(name, str) and name:
        return name
    if platform == "cpu":
        return None
    for key in ("kernel_annotation", *stats):
        found = _HLO_OP_IN_ANNOTATION.findall(str(stats.get(key, "")))
        if found:
            return found[-1]
    return event_name or None


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
