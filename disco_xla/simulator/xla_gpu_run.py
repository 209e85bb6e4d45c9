"""A task graph as XLA:GPU runs the program, beyond what the plan says: what its
compiler does to the collectives of any program it is given
(`hlo.xla_gpu_patterns`).

- **Its reduce-scatter creator** always runs. A communication task of one
  partitioner all-reduce + dynamic-slice pair is priced as the reduce-scatter
  XLA sends, half the bytes on the wire. A bucket of several is one only
  where XLA's own combiner made it (`XlaGpuRun.buckets_by_xla`): the creator
  runs before the combiners, so they combine reduce-scatters. A bucket the
  rewrite concatenates reads the all-reduce through slices, which the
  creator does not match: it stays an all-reduce.
- **Its collective pipeliner**, where the flags turn it on for a kind
  (`XlaGpuRun.pipelined`): a loop body's collective that XLA sinks into the
  next trip becomes two tasks, as a prefetched all-gather does
  (`graph_steps.CommunicationTasks.issue_ahead`): one trip that its readers wait
  for, and the other trips, which run beside the next trips' kernels and
  which no kernel waits for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.loops import loop_of_body
from disco_xla.hlo.xla_gpu_patterns import scattering_all_reduces, sinkable_collectives
from disco_xla.simulator.kernels import TaskGraph

PIPELINED_KINDS = ("reduce-scatter", "all-reduce")


@dataclass(frozen=True)
class XlaGpuRun:
    """What XLA:GPU does to a program's collectives when it compiles it."""

    # The plan's buckets were made by XLA's combiners (a baseline, or the
    # program of a set of flags), not concatenated by the rewrite.
    buckets_by_xla: bool = False
    # The kinds its collective pipeliner sinks a trip (of PIPELINED_KINDS).
    pipelined: frozenset[str] = frozenset()


def as_xla_gpu_runs(graph: TaskGraph, module: HloModule, run: XlaGpuRun) -> TaskGraph:
    """`graph` (of a plan over `module`) with its collectives as XLA:GPU sends
    them under `run` (the module's docstring)."""
    kinds = list(graph.communication_kinds) + ["all-reduce"] * (
        len(graph.communications) - len(graph.communication_kinds)
    )
    scattering = scattering_all_reduces(module)
    for task, (_, _, names) in enumerate(graph.communications):
        if names and set(names) <= scattering and (len(names) == 1 or run.buckets_by_xla):
            kinds[task] = "reduce-scatter"
    graph = replace(graph, communication_kinds=kinds)
    if run.pipelined:
        graph = _sunk(graph, module, run.pipelined)
    return graph


def _sunk(graph: TaskGraph, module: HloModule, pipelined: frozenset[str]) -> TaskGraph:
    """`graph` with each sunk collective split in two (the module's
    docstring). The split-off trips of a gradient bucket are buckets too, and
    go right after the plan's buckets (the streams issue buckets first, in
    plan order); those of another collective go last."""
    sinkable = sinkable_collectives(module)
    kernel_count = len(graph.kernels)
    count = len(graph.communications)

    def padded(values: list, default) -> list:
        return list(values) + [default] * (count - len(values))

    fields = {
        "is_bucket": padded(graph.is_bucket, False),
        "tuple_element_bytes": padded(graph.tuple_element_bytes, ()),
        "communication_runs": padded(graph.communication_runs, 1),
        "communication_kinds": padded(graph.communication_kinds, "all-reduce"),
        "communication_groups": padded(graph.communication_groups, ((), 0)),
    }
    runs, kinds = fields["communication_runs"], fields["communication_kinds"]
    buckets = next((t for t, bucket in enumerate(fields["is_bucket"]) if not bucket), count)
    order = list(range(count))  # new place -> old task (a copy: (old task,))
    split_runs: dict[int, int] = {}
    for task in range(count):
        _, _, names = graph.communications[task]
        if kinds[task] not in pipelined or not names or not set(names) <= sinkable:
            continue
        loop = loop_of_body(module.instruction(names[0]).computation)
        waited = max(1, runs[task] // loop.trips) if loop is not None else runs[task]
        if waited < runs[task]:
            split_runs[task] = waited
    if not split_runs:
        return graph
    copies = sorted(split_runs)
    order = [
        *range(buckets),
        *[(t,) for t in copies if t < buckets],
        *range(buckets, count),
        *[(t,) for t in copies if t >= buckets],
    ]
    place = {old: new for new, old in enumerate(order) if isinstance(old, int)}

    def moved(deps) -> list[int]:
        return [d if d < kernel_count else kernel_count + place[d - kernel_count] for d in deps]

    dependencies = [moved(deps) for deps in graph.dependencies[:kernel_count]]
    communications, new_fields = [], {key: [] for key in fields}
    for old in order:
        task = old if isinstance(old, int) else old[0]
        name, size, names = graph.communications[task]
        communications.append((name if isinstance(old, int) else f"{name}.sunk_trips", size, names))
        dependencies.append(moved(graph.dependencies[kernel_count + task]))
        for key, values in fields.items():
            new_fields[key].append(values[task])
        if task in split_runs:
            whole = runs[task]
            new_fields["communication_runs"][-1] = (
                split_runs[task] if isinstance(old, int) else whole - split_runs[task]
            )
    return replace(graph, communications=communications, dependencies=dependencies, **new_fields)
