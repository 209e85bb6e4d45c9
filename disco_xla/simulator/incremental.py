"""Incremental re-simulation: the iteration time of a plan one local change away
from a loaded plan, without rebuilding the task graph or replaying every kernel.

A `PlanState` holds one plan's kernels, their order, durations and dependencies.
`evaluate(change)` gives the iteration time of the neighbouring plan that
`change` makes, equal to `simulate(build_task_graph(module, child_plan(change)))`
to the picosecond:

- the kernel order is Kahn's algorithm with the same priorities as
  `build_task_graph`; after a fusion or a split it is re-run only from the first
  changed kernel until the set of kernels run so far is the parent's again, from
  where both orders are the same;
- kernel durations come from the cost model once per fusion group and are cached,
  as is what a group's kernels are made of (atoms, edges, reads), so that loading
  a plan mostly joins cached parts;
- the `gpu-streams` timeline is computed by `streams_iteration_ps`, which visits
  only the kernels that read all-reduce results and the last producer of each
  bucket; between them the compute stream advances by differences of prefix sums;
- a fusion or split whose reordered stretch ends before the first of those
  kernels moves every later time by the same amount: the iteration time is the
  parent's plus the stretch's change in duration.

Profiles with the `cpu-threads` model have no such shortcut: `evaluate` builds the
child's task graph and simulates it in full.
"""

from __future__ import annotations

import bisect
import heapq
import weakref
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import NamedTuple

import numpy as np

from disco_xla.hlo_passes.graph import HloModule, collective_bytes, collective_kind
from disco_xla.plan import (
    Plan,
    bucket_kinds,
    buckets_follow_dependencies,
    gradient_dependencies,
)
from disco_xla.simulator.comm import CommCostFn, all_reduce_s
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import (
    PS_PER_S,
    communication_ps,
    simulate,
    streams_iteration_ps,
    to_ps,
)
from disco_xla.simulator.kernels import (
    CallKey,
    TaskGraph,
    build_task_graph,
    kernel_for,
    kernel_order,
    module_index,
)
from disco_xla.simulator.profiles import ClusterProfile


@dataclass(frozen=True)
class Fuse:
    """Fuse kernel `second` into kernel `first` (`second` reads `first` directly)."""

    first: int
    second: int


@dataclass(frozen=True)
class Split:
    """Split a kernel into the earlier and the later half of its instructions."""

    kernel: int


@dataclass(frozen=True)
class Rebucket:
    """Replace the plan's all-reduce buckets."""

    buckets: tuple[tuple[str, ...], ...]


Change = Fuse | Split | Rebucket
# Fusions of kernels further apart than this in the order are not evaluated: the
# order would change over a long stretch, and XLA never fuses such pairs either.
MAX_FUSE_DISTANCE = 64
# A change whose kernel order differs from the parent's over more kernels than
# this is not evaluated (a split half that could run much earlier, for one).
MAX_REORDER_KERNELS = 160


class KernelPart(NamedTuple):
    """One instance of a fusion group's kernel (one call site of its computation):
    what every plan with the group shares."""

    key: CallKey
    atoms: tuple[int, ...]  # in the group's order
    order_sources: frozenset[int]  # compute atoms outside it that it waits for (order)
    order_targets: frozenset[int]  # compute atoms outside it that wait for it (order)
    reads: frozenset[int]  # the all-reduce atoms it reads
    expensive: int  # dots and convolutions in it
    rank: int  # `ModuleIndex.kernel_rank`
    runs: int  # how many times this instance runs in one step (`ModuleIndex.runs`)


class CollectiveInfo(NamedTuple):
    """What a gradient all-reduce or another collective brings to a communication
    task, whatever the plan."""

    size: int  # bytes
    atoms: list[int]
    producer_atoms: tuple[int, ...]  # compute atoms it reads
    reads: frozenset[int]  # all-reduce atoms it reads
    elements: tuple[int, ...]  # tensor sizes of a tuple all-reduce, else ()
    runs: int  # how many times it runs in one step (`ModuleIndex.runs`)
    kind: str  # `graph.collective_kind`


class GroupCosts:
    """Kernel durations in picoseconds, cached by fusion group, and the other
    figures of a group's kernels and of the module's collectives that do not
    depend on the plan (shared by the states of one search)."""

    def __init__(self, module: HloModule, cost_model: CostModel, kernel_time_scale: float = 1.0):
        self.module = module
        self.index = module_index(module)
        self.by_name = self.index.by_name
        self.cost_model = cost_model
        # The profile's factor on every kernel time, applied as `simulate` does.
        self.kernel_time_scale = kernel_time_scale
        self.cache: dict[tuple[str, ...], int] = {}
        self.parts: dict[tuple[str, ...], tuple[KernelPart, ...]] = {}
        self._collectives: tuple | None = None
        self._halves: dict[tuple[str, ...], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def durations(self, groups: list[tuple[str, ...]]) -> list[int]:
        missing = list(dict.fromkeys(g for g in groups if g not in self.cache))
        if missing:
            kernels = [kernel_for([self.by_name[n] for n in g], None, self.index) for g in missing]
            seconds = self.cost_model.kernels_s(TaskGraph(kernels, [], [], []))
            scale = self.kernel_time_scale
            for group, value in zip(missing, seconds, strict=True):
                self.cache[group] = to_ps(value * scale if scale != 1.0 else value)
        return [self.cache[g] for g in groups]

    def kernel_parts(self, group: tuple[str, ...]) -> tuple[KernelPart, ...]:
        """The group's kernel in each instance of its computation, as
        `kernel_instances` numbers them (call keys in order)."""
        found = self.parts.get(group)
        if found is None:
            index, by_name = self.index, self.by_name
            order_inputs, inputs, is_compute = index.order_inputs, index.inputs, index.is_compute
            order_users = index.order_users
            is_expensive = index.is_expensive
            members = [id(by_name[name]) for name in group]
            computation = by_name[group[0]].computation
            parts = []
            for key in index.instances.get(computation.name, [()]):
                atoms = tuple(index.atom_of[(member, key)] for member in members)
                sources = {s for atom in atoms for s in order_inputs[atom]}
                sources.difference_update(atoms)
                targets = {u for atom in atoms for u in order_users[atom]}
                targets.difference_update(atoms)
                parts.append(
                    KernelPart(
                        key,
                        atoms,
                        frozenset(sources),
                        frozenset(targets),
                        frozenset(s for atom in atoms for s in inputs[atom] if not is_compute[s]),
                        sum(is_expensive[a] for a in atoms),
                        index.kernel_rank(atoms),
                        index.instance_runs(by_name[group[0]], key),
                    )
                )
            found = self.parts[group] = tuple(parts)
        return found

    def halves(self, group: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The group's instructions in module order, cut in the middle."""
        found = self._halves.get(group)
        if found is None:
            members = sorted(group, key=self.index.name_position.__getitem__)
            middle = len(members) // 2
            found = self._halves[group] = (tuple(members[:middle]), tuple(members[middle:]))
        return found

    def collectives(self) -> tuple:
        """(the atoms of collectives that are not gradients, in atom order;
        `CollectiveInfo` of each gradient all-reduce by name; of each other
        collective; the name of every all-reduce atom)."""
        if self._collectives is None:
            index = self.index
            gradients = {a.name for a in self.module.gradient_all_reduces}
            others = [
                atom
                for atom, compute in enumerate(index.is_compute)
                if not compute and index.atoms[atom][0].name not in gradients
            ]

            def info(atoms, instr) -> CollectiveInfo:
                # The last field: the tensor sizes when the instruction is a tuple
                # all-reduce (see `build_task_graph`), else ().
                leaves = tuple(leaf.bytes for leaf in instr.shape.leaves())
                producer_atoms, reads = [], set()
                for atom in atoms:
                    for source in index.inputs[atom]:
                        if index.is_compute[source]:
                            producer_atoms.append(source)
                        else:
                            reads.add(source)
                elements = leaves if len(leaves) > 1 else ()
                runs = sum(index.instance_runs(*index.atoms[atom]) for atom in atoms)
                return CollectiveInfo(
                    collective_bytes(instr),
                    atoms,
                    tuple(producer_atoms),
                    frozenset(reads),
                    elements,
                    runs,
                    collective_kind(instr),
                )

            gradient_info = {
                name: info(index.atoms_of_name[name], index.by_name[name]) for name in gradients
            }
            other_info = [info([a], index.atoms[a][0]) for a in others]
            name_of = {
                a: index.atoms[a][0].name
                for a in range(len(index.atoms))
                if not index.is_compute[a]
            }
            self._collectives = (others, gradient_info, other_info, name_of)
        return self._collectives


_DEPENDENCIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def gradient_dependencies_of(module: HloModule) -> dict[str, frozenset[str]]:
    """`plan.gradient_dependencies`, computed once per module."""
    found = _DEPENDENCIES.get(module)
    if found is None:
        found = _DEPENDENCIES[module] = gradient_dependencies(module)
    return found


_KINDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def bucket_kinds_of(module: HloModule) -> dict[str, tuple]:
    """`plan.bucket_kinds`, computed once per module."""
    found = _KINDS.get(module)
    if found is None:
        found = _KINDS[module] = bucket_kinds(module)
    return found


class PlanState:
    """One loaded plan, ready to evaluate its neighbours."""

    def __init__(
        self,
        module: HloModule,
        plan: Plan,
        profile: ClusterProfile,
        cost_model: CostModel,
        comm_cost: CommCostFn = all_reduce_s,
        costs: GroupCosts | None = None,
    ):
        self.module, self.plan, self.profile = module, plan, profile
        self.cost_model, self.comm_cost = cost_model, comm_cost
        if costs is None or costs.kernel_time_scale != profile.kernel_time_scale:
            costs = GroupCosts(module, cost_model, profile.kernel_time_scale)
        self.costs = costs
        # The host's cost of a step, added to every time as `simulate` adds it.
        self.step_ps = to_ps(profile.step_overhead_s)  # as `simulate` with no step buffers
        self.index = module_index(module)
        self.groups = list(plan.fusion_groups)
        # `kernel_instances` of the plan, from the parts cached by group.
        instances: list[tuple[int, CallKey]] = []
        kernel_of_atom: dict[int, int] = {}
        parts: list[KernelPart] = []
        single: list[bool] = []
        call_rank: list[int] = []  # the place of the part's call key among the group's
        duration: list[int | None] = []  # per kernel, from the costs cached by group
        kernel_parts, known_ps = self.costs.kernel_parts, self.costs.cache
        for group_index, group in enumerate(self.groups):
            group_parts = kernel_parts(group)
            if len(group_parts) == 1:
                (part,) = group_parts
                kernel = len(instances)
                for atom in part.atoms:
                    kernel_of_atom[atom] = kernel
                instances.append((group_index, part.key))
                parts.append(part)
                single.append(True)
                call_rank.append(0)
                duration.append(known_ps.get(group))
                continue
            for number, part in enumerate(group_parts):
                kernel_of_atom.update(zip(part.atoms, repeat(len(instances))))
                instances.append((group_index, part.key))
                call_rank.append(number)
            parts += group_parts
            single += [False] * len(group_parts)
            duration += [known_ps.get(group)] * len(group_parts)
        if None in duration:  # groups not costed yet
            duration = self.costs.durations([self.groups[g] for g, _ in instances])
        self.runs = [part.runs for part in parts]
        if any(runs != 1 for runs in self.runs):  # kernels in loop bodies: every trip
            duration = [d * runs for d, runs in zip(duration, self.runs, strict=True)]
        self.instances = instances
        self.kernel_of_atom = kernel_of_atom
        count = len(instances)
        self.atoms: list[list[int]] = [list(part.atoms) for part in parts]
        self.preds: list[set[int]] = []
        self.succs: list[set[int]] = [set() for _ in range(count)]
        self.reads: list[frozenset[int]] = [part.reads for part in parts]
        for kernel, part in enumerate(parts):
            preds = {kernel_of_atom[s] for s in part.order_sources}
            preds.discard(kernel)
            self.preds.append(preds)
            for pred in preds:
                self.succs[pred].add(kernel)
        self.single = single
        self.expensive = [part.expensive for part in parts]
        self.priority = [
            (bool(part.reads), part.rank, group, 0, key)
            for part, (group, key) in zip(parts, instances, strict=True)
        ]
        self.duration = duration
        # The priorities as integers in the same order, which compare faster: a
        # group's parts come in the order of their call keys (`kernel_parts`).
        rank_bound = 1 + max((part.rank for part in parts), default=0)
        group_bound = len(self.groups)
        call_bound = 1 + max(call_rank, default=0)
        priority_number = [
            ((bool(part.reads) * rank_bound + part.rank) * group_bound + group) * call_bound + call
            for part, (group, _), call in zip(parts, instances, call_rank, strict=True)
        ]
        self.order = kernel_order(priority_number, self.preds)
        pos = self.pos = [0] * count
        for position, kernel in enumerate(self.order):
            pos[kernel] = position
        self.prefix = list(accumulate(map(self.duration.__getitem__, self.order), initial=0))
        self.prefix_array = np.array(self.prefix, dtype=np.int64)
        preds = self.preds
        self.max_pred_position = np.array(
            [max(map(pos.__getitem__, preds[k]), default=-1) for k in self.order]
        )
        self._comm_cost_cache: dict[tuple, tuple[int, int]] = {}
        self._merged_cache: dict[tuple[int, int], tuple[str, ...]] = {}
        self._bucket_cache: dict[tuple[str, ...], tuple[int, int, int]] = {}
        self._collective_info()
        self.gradient_dependencies = gradient_dependencies_of(module)
        self.bucket_kinds = bucket_kinds_of(module)
        self._set_buckets(plan.all_reduce_buckets)
        self._rebucket_info()
        self.iteration_ps = self._time(None)

    # -- construction ---------------------------------------------------------
    def _collective_info(self) -> None:
        """What each gradient all-reduce and each other collective brings to a
        communication task, whatever the buckets: bytes, atoms, producing atoms
        and kernels, and the all-reduce atoms it reads."""
        others, gradient_info, other_info, self.name_of = self.costs.collectives()
        self.others = others
        kernel_of_atom = self.kernel_of_atom

        def info(found: CollectiveInfo) -> tuple:
            producers = {kernel_of_atom[a] for a in found.producer_atoms}
            return (
                found.size,
                found.atoms,
                found.producer_atoms,
                producers,
                found.reads,
                found.elements,
                found.runs,
                found.kind,
            )

        self.gradient_info = {name: info(found) for name, found in gradient_info.items()}
        self.other_info = [info(found) for found in other_info]
        self.waiting = [k for k, reads in enumerate(self.reads) if reads]

    def _rebucket_info(self) -> None:
        """What a bucket change needs, per gradient: its last producer's position,
        and per waiting kernel: the collectives it reads, by gradient name or by
        the other collective's task."""
        pos = self.pos
        name_of = self.name_of
        self.gradient_last = {
            name: max((pos[k] for k in info[3]), default=-1)
            for name, info in self.gradient_info.items()
        }
        other_names = {a: number for number, a in enumerate(self.others)}
        self.gradient_reads: dict[str, tuple[set[str], set[int]]] = {
            name: (
                {name_of[a] for a in info[4] if a not in other_names},
                {other_names[a] for a in info[4] if a in other_names},
            )
            for name, info in self.gradient_info.items()
        }
        self.gradients_read_collectives = any(g or o for g, o in self.gradient_reads.values())
        self.wait_reads = [
            (
                pos[k],
                sorted({name_of[a] for a in self.reads[k] if a not in other_names}),
                sorted({other_names[a] for a in self.reads[k] if a in other_names}),
            )
            for k in self.waiting
        ]
        # The common case apart: a kernel that reads one gradient and nothing else.
        self.wait_one_gradient = [
            (position, names[0])
            for position, names, others in self.wait_reads
            if len(names) == 1 and not others
        ]
        self.wait_other_reads = [
            entry for entry in self.wait_reads if len(entry[1]) != 1 or entry[2]
        ]

    def _rebucket_time(self, buckets) -> int:
        """Iteration ps of this plan's kernels with `buckets` (gpu-streams)."""
        streams = max(1, self.profile.communication_streams)
        bucket_of = {name: number for number, bucket in enumerate(buckets) for name in bucket}
        bucket_cache = self._bucket_cache
        known = [bucket_cache.get(bucket) or self._bucket_costs(bucket) for bucket in buckets]
        comm_ps = [entry[0] for entry in known]
        copy_ps = [entry[1] for entry in known]
        last = [entry[2] for entry in known]
        stream = [number % streams for number in range(len(buckets))]
        others_from = len(buckets)
        if self.gradients_read_collectives:
            comm_waits = []
            for number, bucket in enumerate(buckets):
                reads = set()
                for name in bucket:
                    gradients, others = self.gradient_reads[name]
                    reads.update(bucket_of[read] for read in gradients)
                    reads.update(others_from + other for other in others)
                reads.discard(number)
                comm_waits.append(sorted(reads))
        else:
            comm_waits = [()] * len(buckets)
        offset = len(self.buckets)
        for number in range(len(self.others)):
            task = offset + number
            comm_ps.append(self.comm_ps[task])
            copy_ps.append(self.copy_ps[task])
            stream.append(streams)
            last.append(self.last_producer[task])
            comm_waits.append(
                [c if c < offset else c - offset + others_from for c in self.comm_waits[task]]
                if all(c >= offset for c in self.comm_waits[task])
                else self._remapped_waits(task, bucket_of, others_from)
            )
        waits = {position: [bucket_of[name]] for position, name in self.wait_one_gradient}
        for position, names, others in self.wait_other_reads:
            comms = {bucket_of[n] for n in names}
            comms.update(others_from + o for o in others)
            waits[position] = sorted(comms)
        return self.step_ps + streams_iteration_ps(
            len(self.order),
            lambda positions: list(map(self.prefix.__getitem__, positions)),
            waits,
            comm_ps,
            copy_ps,
            stream,
            last,
            comm_waits,
            len(buckets),
        )

    def _bucket_costs(self, bucket: tuple[str, ...]) -> tuple[int, int, int]:
        """(all-reduce ps, copy ps, last producer's position) of a bucket, cached."""
        info = self.gradient_info
        size = sum(info[name][0] for name in bucket)
        producer = max(self.gradient_last[name] for name in bucket)
        elements = info[bucket[0]][5] if len(bucket) == 1 else ()
        kind = info[bucket[0]][7]  # a bucket holds one kind
        key = (size, len(bucket) > 1, elements, kind)
        costs = self._comm_cost_cache.get(key)
        if costs is None:
            costs = self._comm_cost_cache[key] = communication_ps(
                size, len(bucket), self.profile, self.comm_cost, elements, kind
            )
        runs = info[bucket[0]][6]
        found = self._bucket_cache[bucket] = (costs[0] * runs, costs[1] * runs, producer)
        return found

    def _remapped_waits(self, task: int, bucket_of: dict[str, int], others_from: int) -> list[int]:
        """Another collective's reads under new buckets (rare: a collective of a
        reduced gradient)."""
        found = set()
        for atom in self.comm_atoms_of(task):
            for source in self.index.inputs[atom]:
                if self.index.is_compute[source]:
                    continue
                name = self.index.atoms[source][0].name
                if name in bucket_of:
                    found.add(bucket_of[name])
                else:
                    found.add(others_from + self.others.index(source))
        return sorted(found)

    def comm_atoms_of(self, task: int) -> list[int]:
        return [a for a, c in self.comm_of_atom.items() if c == task]

    def _set_buckets(self, buckets) -> None:
        """Communication tasks as `build_task_graph` numbers them (the buckets in
        plan order, then every other collective in atom order), and what of them
        does not depend on the kernel order."""
        self.buckets = tuple(buckets)
        comm_of_atom: dict[int, int] = {}
        infos = []
        for number, bucket in enumerate(buckets):
            members = [self.gradient_info[name] for name in bucket]
            for member in members:
                for atom in member[1]:
                    comm_of_atom[atom] = number
            infos.append(members)
        for number, atom in enumerate(self.others, start=len(buckets)):
            comm_of_atom[atom] = number
        infos += [[member] for member in self.other_info]
        self.comm_of_atom = comm_of_atom
        streams = max(1, self.profile.communication_streams)
        self.comm_ps, self.copy_ps, self.stream, self.comm_waits = [], [], [], []
        self.producers: list[list[int]] = []  # kernels producing each task's inputs
        self.producer_atoms: list[list[int]] = []
        self.last_producer = []
        pos = self.pos
        for number, members in enumerate(infos):
            is_bucket = number < len(buckets)
            size = sum(m[0] for m in members)
            elements = members[0][5] if len(members) == 1 else ()
            kind = members[0][7]  # a bucket holds one kind
            key = (size, len(members) > 1, elements, kind)
            costs = self._comm_cost_cache.get(key)
            if costs is None:
                costs = self._comm_cost_cache[key] = communication_ps(
                    size, len(members), self.profile, self.comm_cost, elements, kind
                )
            runs = members[0][6]  # a bucket's gradients share their computation
            self.comm_ps.append(costs[0] * runs)
            self.copy_ps.append(costs[1] * runs)
            self.stream.append(number % streams if is_bucket else streams)
            if len(members) == 1:
                _, _, producer_atoms, producers, reads, _, _, _ = members[0]
            else:
                producer_atoms = [a for m in members for a in m[2]]
                producers = set().union(*(m[3] for m in members))
                reads = set().union(*(m[4] for m in members))
            comms = sorted({comm_of_atom[a] for a in reads} - {number})
            self.producers.append(producers)
            self.producer_atoms.append(producer_atoms)
            self.comm_waits.append(comms)
            self.last_producer.append(max((pos[k] for k in producers), default=-1))
        self.wait_comms = {
            kernel: sorted({comm_of_atom[a] for a in self.reads[kernel]}) for kernel in self.waiting
        }
        # Waiting kernels by position, and the tasks each kernel produces for.
        self.wait_list = sorted((pos[k], k, c) for k, c in self.wait_comms.items())
        self.wait_positions = [entry[0] for entry in self.wait_list]
        # The first position where the timeline meets communication: a kernel
        # that reads a collective, or the last producer of one (-1: a collective
        # with no producer).
        self.first_point = min(
            self.wait_positions[:1] + self.last_producer, default=len(self.order)
        )
        self.comms_of_kernel: dict[int, list[int]] = {}
        for number, kernels in enumerate(self.producers):
            for kernel in kernels:
                self.comms_of_kernel.setdefault(kernel, []).append(number)

    def _time(self, change) -> int:
        """Iteration ps of this plan (change None) or of a bucket change."""
        if self.profile.execution != "gpu-streams":
            plan = self.plan if change is None else self.child_plan(change)
            graph = build_task_graph(self.module, plan)
            result = simulate(graph, self.profile, self.cost_model, self.comm_cost)
            return to_ps(result.iteration_s)
        if change is not None:
            saved = {
                name: getattr(self, name)
                for name in (
                    "buckets",
                    "comm_of_atom",
                    "comm_ps",
                    "copy_ps",
                    "stream",
                    "comm_waits",
                    "producers",
                    "producer_atoms",
                    "last_producer",
                    "wait_comms",
                    "wait_list",
                    "wait_positions",
                    "first_point",
                    "comms_of_kernel",
                )
            }
            self._set_buckets(change.buckets)
        try:
            waits = {self.pos[k]: comms for k, comms in self.wait_comms.items()}
            return self.step_ps + streams_iteration_ps(
                len(self.order),
                lambda positions: list(map(self.prefix.__getitem__, positions)),
                waits,
                self.comm_ps,
                self.copy_ps,
                self.stream,
                self.last_producer,
                self.comm_waits,
                len(self.buckets),
            )
        finally:
            if change is not None:
                for name, value in saved.items():
                    setattr(self, name, value)

    # -- neighbours -----------------------------------------------------------
    def legal_fuse(self, first: int, second: int) -> bool:
        """Whether fusing `second` into `first` gives a plan `verify_plan` accepts:
        one instance each, the same computation, at most one dot or convolution,
        and no other path from one to the other (through kernels, all-reduces or
        plumbing)."""
        if first == second or not (self.single[first] and self.single[second]):
            return False
        if self.pos[first] > self.pos[second]:
            first, second = second, first
        index = self.index
        atoms_a, atoms_b = self.atoms[first], self.atoms[second]
        if index.atoms[atoms_a[0]][0].computation is not index.atoms[atoms_b[0]][0].computation:
            return False
        if self.expensive[first] + self.expensive[second] > 1:
            return False
        if self.pos[second] - self.pos[first] > MAX_FUSE_DISTANCE:
            return False
        # An edge from `first` to `second` through a non-compute instruction.
        inside_a = set(atoms_a)
        for atom in atoms_b:
            for source in index.indirect_inputs[atom]:
                if source in inside_a or (
                    not index.is_compute[source] and inside_a & index.through(source)
                ):
                    return False
        # A path first -> x -> ... -> second through another kernel.
        limit = self.pos[second]
        stack = [k for k in self.succs[first] if k != second and self.pos[k] < limit]
        seen = set(stack)
        while stack:
            kernel = stack.pop()
            if second in self.succs[kernel]:
                return False
            for user in self.succs[kernel]:
                if user not in seen and self.pos[user] < limit:
                    seen.add(user)
                    stack.append(user)
        return True

    def evaluate(self, change: Change) -> float | None:
        """Simulated iteration seconds of the plan `change` makes (None: illegal)."""
        if isinstance(change, Rebucket):
            if not buckets_follow_dependencies(change.buckets, self.gradient_dependencies):
                return None
            # A bucket is one all-reduce: one dtype, device groups and computation.
            kinds = self.bucket_kinds
            if any(len({kinds[name] for name in bucket}) > 1 for bucket in change.buckets):
                return None
            if self.profile.execution == "gpu-streams":
                return self._rebucket_time(change.buckets) / PS_PER_S
            return self._time(change) / PS_PER_S
        if self.profile.execution != "gpu-streams":
            if isinstance(change, Fuse) and not self.legal_fuse(change.first, change.second):
                return None
            if isinstance(change, Split) and not self.splittable(change.kernel):
                return None
            return self._time(change) / PS_PER_S
        child = self._reordered(change)
        return None if child is None else self._child_time(child) / PS_PER_S

    def splittable(self, kernel: int) -> bool:
        """Whether `Split(kernel)` is a move: a group of several instructions in a
        computation run once."""
        return self.single[kernel] and len(self.groups[self.instances[kernel][0]]) > 1

    def halves(self, kernel: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The group's instructions in module order, cut in the middle."""
        return self.costs.halves(self.groups[self.instances[kernel][0]])

    def _merged(self, first: int, second: int) -> tuple[str, ...]:
        """Both groups' instructions in module order."""
        key = (first, second) if first < second else (second, first)
        found = self._merged_cache.get(key)
        if found is None:
            names = self.groups[self.instances[first][0]] + self.groups[self.instances[second][0]]
            found = self._merged_cache[key] = tuple(
                sorted(names, key=self.index.name_position.__getitem__)
            )
        return found

    def _reordered(self, change):
        """The child's new kernels and its order from the first changed position
        until it meets the parent's order again."""
        count = len(self.order)
        if isinstance(change, Fuse):
            first, second = change.first, change.second
            if self.pos[first] > self.pos[second]:
                first, second = second, first
            if not self.legal_fuse(first, second):
                return None
            removed = (first, second)
            groups = [self._merged(first, second)]
            new_atoms = [self.atoms[first] + self.atoms[second]]
            ranks = [(min(self.instances[first][0], self.instances[second][0]), 0)]
            units = [2]
        else:
            if not self.splittable(change.kernel):
                return None
            removed = (change.kernel,)
            groups = list(self.halves(change.kernel))
            # A group run once has one part, in its computation's only instance.
            halves = [self.costs.kernel_parts(half)[0] for half in groups]
            new_atoms = [list(half.atoms) for half in halves]
            group_rank = self.priority[change.kernel][2]
            ranks = [(group_rank, 0), (group_rank, 1)]
            units = [0, 1]
        new_ids = list(range(count, count + len(groups)))
        kernel_of_atom = {}
        for kernel, atoms in zip(new_ids, new_atoms, strict=True):
            for atom in atoms:
                kernel_of_atom[atom] = kernel
        parent_kernel_of = self.kernel_of_atom

        def kernel_of(atom: int) -> int:
            found = kernel_of_atom.get(atom)
            return parent_kernel_of[atom] if found is None else found

        removed_set = set(removed)
        new_preds, new_reads, new_priority = {}, {}, {}
        new_succs: dict[int, set[int]] = {k: set() for k in new_ids}
        readers_of_new: dict[int, set[int]] = {}
        if len(removed) == 2:  # a fusion: the new kernel has both kernels' edges
            (merged,) = new_ids
            new_preds[merged] = (self.preds[removed[0]] | self.preds[removed[1]]) - removed_set
            users = (self.succs[removed[0]] | self.succs[removed[1]]) - removed_set
            new_succs[merged] = users
            for user in users:
                readers_of_new[user] = {merged}
            new_reads[merged] = self.reads[removed[0]] | self.reads[removed[1]]
            kernel_ranks = [self.index.kernel_rank(new_atoms[0])]
        else:  # a split: edges from the atoms of each half
            for kernel, half in zip(new_ids, halves, strict=True):
                preds = {kernel_of(s) for s in half.order_sources}
                preds.discard(kernel)
                new_preds[kernel] = preds
                for user_atom in half.order_targets:
                    user = kernel_of(user_atom)
                    if user != kernel:
                        new_succs[kernel].add(user)
                        if user < count:
                            readers_of_new.setdefault(user, set()).add(kernel)
                new_reads[kernel] = half.reads
            kernel_ranks = [half.rank for half in halves]
        for kernel, rank, kernel_rank in zip(new_ids, ranks, kernel_ranks, strict=True):
            new_priority[kernel] = (bool(new_reads[kernel]), kernel_rank, *rank, ())
        order, pos = self.order, self.pos
        # Nothing changes before the first removed kernel or the first step at
        # which a new kernel could be ready (it may rank above what ran there).
        start = min(pos[k] for k in removed)
        for kernel in new_ids:
            earliest = 1 + max((pos[p] for p in new_preds[kernel] if p < count), default=-1)
            start = min(start, earliest)
        if max(pos[k] for k in removed) - start > MAX_REORDER_KERNELS:
            return None  # the order would change over too long a stretch: not evaluated
        # Skip the steps where the child runs what the parent ran: until a removed
        # kernel, the parent's pick is ready in the child too and is the lowest
        # there, unless a new kernel is ready and ranks lower. The skipped steps
        # still count towards the reordering limit.
        skipped_from = start
        ready_from = {
            kernel: 1 + max((pos[p] for p in preds), default=-1)
            for kernel, preds in new_preds.items()
            if all(p < count for p in preds)
        }
        first_removed = min(pos[k] for k in removed)
        priority = self.priority
        while start < first_removed:
            here = priority[order[start]]
            if any(at <= start and new_priority[k] < here for k, at in ready_from.items()):
                break
            start += 1
        skipped = start - skipped_from

        def preds_of(kernel):
            if kernel >= count:
                return new_preds[kernel]
            extra = readers_of_new.get(kernel)
            if extra is None:
                return [p for p in self.preds[kernel] if p not in removed_set]
            return (self.preds[kernel] - removed_set) | extra

        new_readers_of = {}
        for kernel in new_ids:
            for pred in new_preds[kernel]:
                new_readers_of.setdefault(pred, []).append(kernel)

        def priority_of(kernel):
            return new_priority[kernel] if kernel in new_priority else self.priority[kernel]

        # The parent's kernels ready at `start` (all their inputs ran before it)
        # stay ready until they run, so the parent ran them in priority order: in
        # position order they are sorted, and they merge with the heap of the
        # kernels that become ready later without being pushed onto it.
        max_pred_position = self.max_pred_position

        def ready_at_start():
            for low in range(start, count, 256):
                chunk = max_pred_position[low : low + 256]
                for position in (np.flatnonzero(chunk < start) + low).tolist():
                    kernel = order[position]
                    if kernel not in removed_set:
                        yield kernel

        sorted_ready = ready_at_start()
        next_ready = next(sorted_ready, None)
        next_priority = None if next_ready is None else self.priority[next_ready]
        heap = [
            (priority_of(kernel), kernel)
            for kernel in new_ids
            if all(p not in new_preds and pos[p] < start for p in new_preds[kernel])
        ]
        heapq.heapify(heap)
        emitted: set[int] = set()
        remaining: dict[int, int] = {}
        unit_of = dict(zip(new_ids, units, strict=True))
        extra_child: set[int] = set()
        extra_parent: set[int] = set()
        child_units = parent_units = 0
        parent_at = start
        window: list[int] = []
        heappop, heappush = heapq.heappop, heapq.heappush
        while heap or next_ready is not None:
            if next_ready is not None and (not heap or next_priority < heap[0][0]):
                kernel = next_ready
                next_ready = next(sorted_ready, None)
                next_priority = None if next_ready is None else self.priority[next_ready]
            else:
                kernel = heappop(heap)[1]
            window.append(kernel)
            if len(window) + skipped > MAX_REORDER_KERNELS:
                return None  # the order changes over too long a stretch: not evaluated
            emitted.add(kernel)
            units = unit_of.get(kernel)
            if units is None:
                equivalents = (kernel,)
                child_units += 1
            else:
                equivalents = removed if units else ()
                child_units += units
            for item in equivalents:
                if item in extra_parent:
                    extra_parent.remove(item)
                else:
                    extra_child.add(item)
            while parent_units < child_units:
                item = order[parent_at]
                parent_at += 1
                parent_units += 1
                if item in extra_child:
                    extra_child.remove(item)
                else:
                    extra_parent.add(item)
            if not extra_child and not extra_parent and all(k in emitted for k in new_ids):
                break
            if kernel < count:
                users = self.succs[kernel]
                extra_users = new_readers_of.get(kernel)
                if extra_users:
                    users = list(users) + extra_users
            else:
                users = new_succs[kernel]
            for user in users:
                if user in emitted or user in removed_set:
                    continue
                left = remaining.get(user)
                if left is not None:
                    left -= 1
                else:
                    left = 0
                    for p in preds_of(user):
                        if p not in emitted and (p >= count or pos[p] >= start):
                            left += 1
                remaining[user] = left
                if left == 0:
                    heappush(heap, (priority_of(user), user))
        else:
            if len(window) != count - len(removed) + len(new_ids) - start:
                return None  # a cycle: not a legal plan
        # The new kernels' durations, once the change is known to be evaluated.
        runs = self.runs[removed[0]]  # a fused or split kernel is in one instance
        duration = {
            kernel: ps * runs
            for kernel, ps in zip(new_ids, self.costs.durations(groups), strict=True)
        }
        return _Child(
            change,
            removed,
            new_ids,
            groups,
            new_atoms,
            new_reads,
            duration,
            start,
            window,
            parent_at,
            kernel_of,
        )

    def _child_time(self, child: _Child) -> int:
        start, window, parent_at = child.start, child.window, child.parent_at
        if parent_at <= self.first_point and not any(child.reads.values()):
            # The change and its reordering end before the timeline first meets
            # communication, and the new kernels read none: every later time is
            # a max-plus expression of prefix sums past the window, so the whole
            # timeline after it moves by the window's change in duration.
            removed_ps = sum(self.duration[kernel] for kernel in child.removed)
            return self.iteration_ps + sum(child.duration.values()) - removed_ps
        prefix = self.prefix
        window_prefix = [prefix[start]]
        for kernel in window:
            duration = child.duration.get(kernel)
            window_prefix.append(
                window_prefix[-1] + (self.duration[kernel] if duration is None else duration)
            )
        end = start + len(window)
        shift = end - parent_at
        tail = window_prefix[-1] - prefix[parent_at]

        prefix_array = self.prefix_array

        def prefix_ps(positions: list[int]) -> list[int]:
            at = np.array(positions, dtype=np.int64)
            values = prefix_array[np.minimum(at, start)]
            inside = (at > start) & (at <= end)
            if inside.any():
                values[inside] = np.array(window_prefix, dtype=np.int64)[at[inside] - start]
            later = at > end
            values[later] = prefix_array[at[later] - shift] + tail
            return values.tolist()

        window_position = {k: start + n for n, k in enumerate(window)}
        pos = self.pos

        def position_of(kernel: int) -> int:
            found = window_position.get(kernel)
            if found is not None:
                return found
            position = pos[kernel]
            return position if position < start else position + shift

        comm_of = self.comm_of_atom
        removed = child.removed
        low = bisect.bisect_left(self.wait_positions, start)
        high = bisect.bisect_left(self.wait_positions, parent_at)
        waits = {position: comms for position, _, comms in self.wait_list[:low]}
        for _, kernel, comms in self.wait_list[low:high]:
            if kernel not in removed:
                waits[window_position[kernel]] = comms
        for position, _, comms in self.wait_list[high:]:
            waits[position + shift] = comms
        for kernel, reads in child.reads.items():
            if reads:
                waits[window_position[kernel]] = sorted({comm_of[a] for a in reads})
        last = list(self.last_producer)
        kernel_of = child.kernel_of
        touched = set()
        for kernel in removed:
            touched.update(self.comms_of_kernel.get(kernel, ()))
        for number, parent_last in enumerate(last):
            if number in touched or start <= parent_last < parent_at:
                last[number] = max(position_of(kernel_of(a)) for a in self.producer_atoms[number])
            elif parent_last >= parent_at:
                last[number] = parent_last + shift
        kernel_count = len(self.order) - len(removed) + len(child.new_ids)
        return self.step_ps + streams_iteration_ps(
            kernel_count,
            prefix_ps,
            waits,
            self.comm_ps,
            self.copy_ps,
            self.stream,
            last,
            self.comm_waits,
            len(self.buckets),
        )

    def child_plan(self, change: Change) -> Plan:
        """The neighbouring plan `change` makes: a fused group takes the place of
        the earlier of the two in the plan's list, split halves take the place of
        the group, so every other group keeps its priority."""
        plan = self.plan
        if isinstance(change, Rebucket):
            return Plan(plan.module_name, plan.fingerprint, plan.fusion_groups, change.buckets)
        groups = list(self.groups)
        if isinstance(change, Fuse):
            first, second = change.first, change.second
            if self.pos[first] > self.pos[second]:
                first, second = second, first
            merged = self._merged(first, second)
            a, b = self.instances[first][0], self.instances[second][0]
            low, high = min(a, b), max(a, b)
            groups[low] = merged
            del groups[high]
        else:
            g = self.instances[change.kernel][0]
            groups[g : g + 1] = list(self.halves(change.kernel))
        return Plan(plan.module_name, plan.fingerprint, tuple(groups), plan.all_reduce_buckets)


@dataclass
class _Child:
    change: object
    removed: tuple
    new_ids: list
    groups: list
    new_atoms: list
    reads: dict
    duration: dict
    start: int
    window: list
    parent_at: int
    kernel_of: object
