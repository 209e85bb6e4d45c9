"""How each plan dimension enters the simulator's task graph: `GRAPH_STEPS`,
one row a dimension of `plan.DIMENSIONS`, each holding the step it adds to
`kernels.build_task_graph` and whether the incremental simulator follows its
moves.

`build_task_graph` runs the rows in three stages, each in `DIMENSIONS` order:
the `kernels` steps (the fusion groups become kernels), then, once the
communication tasks are numbered after the kernels, the `communication` steps
(buckets, the other collectives, prefetches), and once the graph is assembled,
the `graph` steps (chunked collectives split their tasks). A new dimension adds
one row here (`tests/test_plan_dimensions.py` fails while it is missing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.loops import loop_of_body
from disco_xla.plan import DIMENSIONS, Plan
from disco_xla.simulator.chunks import with_chunks
from disco_xla.simulator.module_index import ModuleIndex
from disco_xla.simulator.plan_kernels import (
    CollectiveInfo,
    OtherTasks,
    PlanKernels,
    module_collectives,
    other_tasks,
    plan_kernels,
)

if TYPE_CHECKING:  # `kernels` builds its graphs through this module
    from disco_xla.simulator.kernels import TaskGraph

KERNELS, COMMUNICATION, GRAPH = "kernels", "communication", "graph"
STAGES = (KERNELS, COMMUNICATION, GRAPH)  # in the order `build_task_graph` runs them


@dataclass
class GraphParts:
    """What the rows build for one plan on one module: the plan's kernels
    (`kernels` stage), its communication tasks (`communication` stage: the
    all-reduce buckets, then every other collective, `others`)."""

    module: HloModule
    index: ModuleIndex
    plan: Plan
    tuple_buckets: bool
    kernels: PlanKernels | None = None
    communication: CommunicationTasks | None = None
    others: OtherTasks | None = None


@dataclass(frozen=True)
class GraphStep:
    """One dimension's row: the `stage` its step runs in, the step (`add`,
    which fills `GraphParts` in the first two stages; `split`, which returns a
    new graph in the last), and whether `simulator.incremental` follows the
    dimension's moves (`incremental`); where it does not, a plan that uses the
    dimension is simulated in full on every evaluation."""

    stage: str
    add: Callable[[GraphParts], None] | None = None
    split: Callable[[TaskGraph, GraphParts], TaskGraph] | None = None
    incremental: bool = True


class CommunicationTasks:
    """The communication tasks of a task graph, numbered from `kernel_count` on:
    the plan's buckets in order, then every other collective in atom order
    (`plan_kernels.module_collectives`). `task_of_atom` gets the task of each
    collective atom."""

    def __init__(self, index: ModuleIndex, kernel_count: int, task_of_atom: dict[int, int]):
        self.index, self.kernel_count, self.task_of_atom = index, kernel_count, task_of_atom
        self.gradient_info = module_collectives(index).gradient_info
        self.communications: list[tuple[str, int, tuple[str, ...]]] = []
        self.is_bucket: list[bool] = []
        self.tuple_element_bytes: list[tuple[int, ...]] = []
        self.runs: list[int] = []
        self.kinds: list[str] = []
        self.groups: list[tuple[tuple[int, ...], int]] = []
        self.later_trips_of: dict[int, int] = {}  # `issue_ahead`: task -> its first trip

    def add_bucket(self, bucket: tuple[str, ...], tuple_buckets: bool) -> None:
        task = self.kernel_count + len(self.communications)
        infos = [self.gradient_info[name] for name in bucket]
        for info in infos:
            for atom in info.atoms:
                self.task_of_atom[atom] = task
        label = bucket[0] if len(bucket) == 1 else f"bucket[{bucket[0]}..{bucket[-1]}]"
        self.communications.append((label, sum(info.size for info in infos), tuple(bucket)))
        self.runs.append(infos[0].runs)  # a bucket's gradients share their computation
        self.kinds.append(infos[0].kind)  # one kind a bucket
        self.groups.append((infos[0].group, infos[0].devices))  # and one device group
        self.is_bucket.append(True)
        if len(bucket) == 1:
            self.tuple_element_bytes.append(infos[0].elements)
        elif tuple_buckets:
            by_name = self.index.by_name
            elements = [leaf.bytes for n in bucket for leaf in by_name[n].shape.leaves()]
            self.tuple_element_bytes.append(tuple(elements))
        else:
            self.tuple_element_bytes.append(())

    def add_other(self, atoms: tuple[int, ...], info: CollectiveInfo) -> None:
        """One task of `plan_kernels.other_tasks`: a collective, or a bucket of
        all-gathers (in one instance of their computation)."""
        for atom in atoms:
            self.task_of_atom[atom] = self.kernel_count + len(self.communications)
        names = tuple(self.index.atoms[atom][0].name for atom in atoms)
        key = self.index.atoms[atoms[0]][1]
        label = names[0] if len(names) == 1 else f"bucket[{names[0]}..{names[-1]}]"
        label += f"@{key[-1]}" if key else ""
        self.communications.append((label, info.size, names))
        self.runs.append(info.runs)
        self.kinds.append(info.kind)
        self.groups.append((info.group, info.devices))
        self.is_bucket.append(False)
        self.tuple_element_bytes.append(info.elements)

    def issue_ahead(self, prefetched: set[str]) -> None:
        """Model the prefetched all-gathers (`Plan.prefetched_all_gathers`) of a
        loop body. Their loop's trips run as one task each (`TaskGraph`), so a
        prefetched one becomes two: its first trip, which its readers wait for,
        and its later trips, which no kernel waits for. Each later trip's
        gather runs during the trip before, beside its kernels: they never wait
        for it, and it still takes its time on its stream."""
        for number in range(len(self.communications)):
            name, size, names = self.communications[number]
            if self.is_bucket[number] or not names or not set(names) <= prefetched:
                continue
            loop = loop_of_body(self.index.by_name[names[0]].computation)
            runs = self.runs[number]
            first_runs = max(1, runs // loop.trips) if loop is not None else runs
            if first_runs >= runs:
                continue
            self.runs[number] = first_runs
            self.later_trips_of[self.kernel_count + len(self.communications)] = (
                self.kernel_count + number
            )
            self.communications.append((f"{name}.later_trips", size, names))
            self.runs.append(runs - first_runs)
            self.kinds.append(self.kinds[number])
            self.groups.append(self.groups[number])
            self.is_bucket.append(False)
            self.tuple_element_bytes.append(self.tuple_element_bytes[number])


def _fused_kernels(parts: GraphParts) -> None:
    parts.kernels = plan_kernels(parts.index, parts.plan.fusion_groups)


def _all_reduce_buckets(parts: GraphParts) -> None:
    for bucket in parts.plan.all_reduce_buckets:
        parts.communication.add_bucket(bucket, parts.tuple_buckets)


def _other_collectives(parts: GraphParts) -> None:
    """Every collective that is no gradient all-reduce, the plan's all-gather
    buckets each one task."""
    parts.others = other_tasks(parts.index, parts.plan.all_gather_buckets)
    for atoms, info in zip(parts.others.atoms, parts.others.info, strict=True):
        parts.communication.add_other(atoms, info)


def _issue_prefetches_ahead(parts: GraphParts) -> None:
    if parts.plan.prefetched_all_gathers:
        parts.communication.issue_ahead(set(parts.plan.prefetched_all_gathers))


def _split_into_chunks(graph: TaskGraph, parts: GraphParts) -> TaskGraph:
    if not parts.plan.chunked_collectives:
        return graph
    return with_chunks(graph, parts.module, parts.plan.chunked_collectives)


def untracked_dimensions(plan: Plan) -> list[str]:
    """The dimensions `plan` uses whose moves the incremental simulator does
    not follow (where any is, each evaluation simulates the plan in full)."""
    return [
        d.name for d in DIMENSIONS if not GRAPH_STEPS[d.name].incremental and getattr(plan, d.field)
    ]


# One row a plan dimension, by its name (`plan.DIMENSIONS`).
GRAPH_STEPS: dict[str, GraphStep] = {
    "fusion": GraphStep(KERNELS, add=_fused_kernels),
    "all-reduce buckets": GraphStep(COMMUNICATION, add=_all_reduce_buckets),
    "all-gather buckets": GraphStep(COMMUNICATION, add=_other_collectives),
    "chunks": GraphStep(GRAPH, split=_split_into_chunks, incremental=False),
    "prefetch": GraphStep(COMMUNICATION, add=_issue_prefetches_ahead, incremental=False),
}

# Each stage's rows, in `plan.DIMENSIONS` order: what `build_task_graph` runs.
STEPS_BY_STAGE: dict[str, tuple[GraphStep, ...]] = {
    stage: tuple(
        GRAPH_STEPS[d.name]
        for d in DIMENSIONS
        if d.name in GRAPH_STEPS and GRAPH_STEPS[d.name].stage == stage
    )
    for stage in STAGES
}
