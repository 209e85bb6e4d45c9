"""Incremental re-simulation: the iteration time of a plan one local change away
from a loaded plan, without rebuilding the task graph or replaying every kernel.

A `PlanState` holds one plan's kernels, their order, durations and dependencies.
`evaluate_fuse`, `evaluate_split` and `evaluate_buckets` give the iteration time
of the neighbouring plan that the fusion of two kernels, the split of one, or
other buckets make, equal to `simulate(build_task_graph(module, child))` for
that plan (`fused_plan`, `split_plan`, `rebucketed_plan`) to the picosecond:

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

Profiles with the `cpu-threads` model have no such shortcut: the child's task
graph is built and simulated in full.
"""

from __future__ import annotations

import bisect
import heapq
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate, repeat
from typing import NamedTuple

import numpy as np

from disco_xla.hlo.collectives import collective_bytes, collective_kind
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import (
    Plan,
    bucket_kinds,
    buckets_follow_dependencies,
    gradient_dependencies,
)
from disco_xla.simulator.comm import CommCostFn, all_reduce_s
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import PS_PER_S, communication_ps, simulate, to_ps
from disco_xla.simulator.kernels import (
    TaskGraph,
    build_task_graph,
    group_kernel,
    kernel_order,
    tuple_element_sizes,
)
from disco_xla.simulator.module_index import CallKey, ModuleIndex, module_index
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.streams import bucket_streams, streams_iteration_ps

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
    kind: str  # `collectives.collective_kind`


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
            kernels = [group_kernel(self.index, g, g[0]) for g in missing]
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
                producer_atoms, reads = [], set()
                for atom in atoms:
                    for source in index.inputs[atom]:
                        if index.is_compute[source]:
                            producer_atoms.append(source)
                        else:
                            reads.add(source)
                elements = tuple_element_sizes(instr)  # () unless a tuple collective
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
    """One loaded plan, ready to evaluate its neighbours: the fusion of two
    kernels (`evaluate_fuse`), the split of one (`evaluate_split`) and other
    buckets (`evaluate_buckets`), each with the plan it makes (`fused_plan`,
    `split_plan`, `rebucketed_plan`). Kernels are numbered as `kernel_instances`
    numbers them; positions are places in the kernel order."""

    module: HloModule
    plan: Plan
    profile: ClusterProfile
    cost_model: CostModel
    comm_cost: CommCostFn
    costs: GroupCosts
    index: ModuleIndex
    step_ps: int  # the host's cost of a step, added to every time as `simulate` adds it
    groups: list[tuple[str, ...]]
    # Per kernel (`_load_kernels`, `_link_kernels`).
    instances: list[tuple[int, CallKey]]  # (group number, call key)
    kernel_of_atom: dict[int, int]
    runs: list[int]  # times it runs in one step
    duration: list[int]  # ps, for all its runs
    single: list[bool]  # its group's computation has one instance
    atoms: list[list[int]]
    preds: list[set[int]]  # the kernels it waits for
    succs: list[set[int]]  # the kernels that wait for it
    reads: list[frozenset[int]]  # the collective atoms it reads
    expensive: list[int]  # its dots and convolutions
    priority: list[tuple]  # the order's priority, as `build_task_graph` gives it
    # The kernel order (`_order_kernels`).
    order: list[int]  # kernels by position
    pos: list[int]  # positions by kernel
    prefix: list[int]  # durations summed in order: prefix[i] is the sum below position i
    prefix_array: np.ndarray
    max_pred_position: np.ndarray  # per position, the latest position of an input
    # The collectives, whatever the buckets (`_collective_info`).
    name_of: dict[int, str]  # collective atom -> instruction name
    others: list[int]  # atoms of the collectives that are not gradients
    gradient_info: dict[str, tuple]  # `_collective_info`'s tuple, by gradient name
    other_info: list[tuple]
    waiting: list[int]  # the kernels that read a collective
    gradient_dependencies: dict[str, frozenset[str]]
    bucket_kinds: dict[str, tuple]
    # The communication tasks of this plan's buckets (`_set_buckets`).
    buckets: tuple[tuple[str, ...], ...]
    buckets_hash: int  # hash(buckets): the seen-set key's bucket part, for the search
    comm_of_atom: dict[int, int]
    comm_ps: list[int]
    copy_ps: list[int]
    stream: list[int]
    comm_waits: list[list[int]]
    producers: list[set[int]]  # the kernels producing each task's inputs
    producer_atoms: list[list[int]]
    last_producer: list[int]  # positions
    wait_comms: dict[int, list[int]]  # kernel -> the tasks it reads
    wait_list: list[tuple[int, int, list[int]]]  # (position, kernel, tasks) by position
    wait_positions: list[int]
    first_point: int  # the first position where the timeline meets communication
    comms_of_kernel: dict[int, list[int]]  # kernel -> the tasks it produces for
    # What other buckets need (`_rebucket_info`).
    gradient_last: dict[str, int]
    gradient_reads: dict[str, tuple[set[str], set[int]]]
    gradients_read_collectives: bool
    wait_reads: list[tuple[int, list[str], list[int]]]
    wait_one_gradient: list[tuple[int, str]]
    wait_other_reads: list[tuple[int, list[str], list[int]]]
    iteration_ps: int

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
        self.step_ps = to_ps(profile.step_overhead_s)  # as `simulate` with no step buffers
        self.index = module_index(module)
        self.groups = list(plan.fusion_groups)
        parts, call_rank = self._load_kernels()
        self._link_kernels(parts)
        self._order_kernels(parts, call_rank)
        self._comm_cost_cache: dict[tuple, tuple[int, int]] = {}
        self._merged_cache: dict[tuple[int, int], tuple[str, ...]] = {}
        self._bucket_cache: dict[tuple[str, ...], tuple[int, int, int]] = {}
        self._stream_cache: dict[int, list[int]] = {}
        self._collective_info()
        self.gradient_dependencies = gradient_dependencies_of(module)
        self.bucket_kinds = bucket_kinds_of(module)
        self._set_buckets(plan.all_reduce_buckets)
        self._rebucket_info()
        self.iteration_ps = self._iteration_ps()

    # -- construction ---------------------------------------------------------
    def _load_kernels(self) -> tuple[list[KernelPart], list[int]]:
        """`kernel_instances` of the plan, from the parts cached by group: each
        kernel's group and call key, atoms, runs and duration. Returns each
        kernel's part and that part's place among its group's call keys."""
        instances: list[tuple[int, CallKey]] = []
        kernel_of_atom: dict[int, int] = {}
        parts: list[KernelPart] = []
        single: list[bool] = []
        call_rank: list[int] = []
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
        self.instances, self.kernel_of_atom = instances, kernel_of_atom
        self.single, self.duration = single, duration
        return parts, call_rank

    def _link_kernels(self, parts: list[KernelPart]) -> None:
        """Each kernel's atoms, the kernels it waits for and that wait for it, what
        it reads, and its priority in the order."""
        kernel_of_atom = self.kernel_of_atom
        self.atoms = [list(part.atoms) for part in parts]
        self.preds = []
        self.succs = [set() for _ in parts]
        self.reads = [part.reads for part in parts]
        for kernel, part in enumerate(parts):
            preds = {kernel_of_atom[s] for s in part.order_sources}
            preds.discard(kernel)
            self.preds.append(preds)
            for pred in preds:
                self.succs[pred].add(kernel)
        self.expensive = [part.expensive for part in parts]
        self.priority = [
            (bool(part.reads), part.rank, group, 0, key)
            for part, (group, key) in zip(parts, self.instances, strict=True)
        ]

    def _order_kernels(self, parts: list[KernelPart], call_rank: list[int]) -> None:
        """The kernel order (Kahn's algorithm by priority, as `build_task_graph`),
        positions, prefix sums of the durations, and each position's latest input."""
        # The priorities as integers in the same order, which compare faster: a
        # group's parts come in the order of their call keys (`kernel_parts`).
        rank_bound = 1 + max((part.rank for part in parts), default=0)
        group_bound = len(self.groups)
        call_bound = 1 + max(call_rank, default=0)
        priority_number = [
            ((bool(part.reads) * rank_bound + part.rank) * group_bound + group) * call_bound + call
            for part, (group, _), call in zip(parts, self.instances, call_rank, strict=True)
        ]
        self.order = kernel_order(priority_number, self.preds)
        pos = self.pos = [0] * len(parts)
        for position, kernel in enumerate(self.order):
            pos[kernel] = position
        self.prefix = list(accumulate(map(self.duration.__getitem__, self.order), initial=0))
        self.prefix_array = np.array(self.prefix, dtype=np.int64)
        preds = self.preds
        self.max_pred_position = np.array(
            [max(map(pos.__getitem__, preds[k]), default=-1) for k in self.order]
        )

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
        bucket_of = {name: number for number, bucket in enumerate(buckets) for name in bucket}
        bucket_cache = self._bucket_cache
        known = [bucket_cache.get(bucket) or self._bucket_costs(bucket) for bucket in buckets]
        comm_ps = [entry[0] for entry in known]
        copy_ps = [entry[1] for entry in known]
        last = [entry[2] for entry in known]
        stream = self._streams(len(buckets))
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
        self.buckets_hash = hash(self.buckets)
        self.stream = self._streams(len(buckets))
        self.comm_ps, self.copy_ps, self.comm_waits = [], [], []
        self.producers, self.producer_atoms, self.last_producer = [], [], []
        pos = self.pos
        for number, members in enumerate(infos):
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
        self.comms_of_kernel = {}
        for number, kernels in enumerate(self.producers):
            for kernel in kernels:
                self.comms_of_kernel.setdefault(kernel, []).append(number)

    def _streams(self, bucket_count: int) -> list[int]:
        """`bucket_streams` of `bucket_count` buckets and the other collectives
        (cached by count; the lists are shared, never changed)."""
        found = self._stream_cache.get(bucket_count)
        if found is None:
            is_bucket = [True] * bucket_count + [False] * len(self.others)
            found = bucket_streams(is_bucket, self.profile.communication_streams)
            self._stream_cache[bucket_count] = found
        return found

    def _iteration_ps(self) -> int:
        """Iteration ps of this plan."""
        if self.profile.execution != "gpu-streams":
            return self._simulated_ps(self.plan)
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

    def _simulated_ps(self, plan: Plan) -> int:
        """Iteration ps of `plan` by a full simulation (the `cpu-threads` model,
        which has no incremental form)."""
        graph = build_task_graph(self.module, plan)
        result = simulate(graph, self.profile, self.cost_model, self.comm_cost)
        return to_ps(result.iteration_s)

    # -- neighbours -----------------------------------------------------------
    def evaluate_buckets(self, buckets: tuple[tuple[str, ...], ...]) -> float | None:
        """Simulated iteration seconds of this plan with `buckets` instead of its
        own (None: not a legal bucketing)."""
        if not buckets_follow_dependencies(buckets, self.gradient_dependencies):
            return None
        # A bucket is one all-reduce: one dtype, device groups and computation.
        kinds = self.bucket_kinds
        if any(len({kinds[name] for name in bucket}) > 1 for bucket in buckets):
            return None
        if self.profile.execution == "gpu-streams":
            return self._rebucket_time(buckets) / PS_PER_S
        return self._simulated_ps(self.rebucketed_plan(buckets)) / PS_PER_S

    def evaluate_fuse(self, first: int, second: int) -> float | None:
        """Simulated iteration seconds of the plan that fuses kernels `first` and
        `second` (None: not legal, or not evaluated: see `legal_fuse` and
        MAX_REORDER_KERNELS)."""
        if self.profile.execution != "gpu-streams":
            if not self.legal_fuse(first, second):
                return None
            return self._simulated_ps(self.fused_plan(first, second)) / PS_PER_S
        change = self._fusion(first, second)
        child = None if change is None else self._child(change)
        return None if child is None else self._child_time(child) / PS_PER_S

    def evaluate_split(self, kernel: int) -> float | None:
        """Simulated iteration seconds of the plan that splits `kernel` into the
        earlier and the later half of its instructions (None: not `splittable`, or
        not evaluated: MAX_REORDER_KERNELS)."""
        if self.profile.execution != "gpu-streams":
            if not self.splittable(kernel):
                return None
            return self._simulated_ps(self.split_plan(kernel)) / PS_PER_S
        change = self._split(kernel)
        child = None if change is None else self._child(change)
        return None if child is None else self._child_time(child) / PS_PER_S

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

    def _fusion(self, first: int, second: int) -> _KernelChange | None:
        """Fusing two kernels, as a change of kernels (None: not legal)."""
        if self.pos[first] > self.pos[second]:
            first, second = second, first
        if not self.legal_fuse(first, second):
            return None
        group_rank = min(self.instances[first][0], self.instances[second][0])
        return _KernelChange(
            (first, second),
            [self._merged(first, second)],
            [self.atoms[first] + self.atoms[second]],
            [(group_rank, 0)],
            [2],
            (),
        )

    def _split(self, kernel: int) -> _KernelChange | None:
        """Splitting a kernel, as a change of kernels (None: not `splittable`)."""
        if not self.splittable(kernel):
            return None
        groups = list(self.halves(kernel))
        # A group run once has one part, in its computation's only instance.
        kernel_parts = self.costs.kernel_parts
        halves = (kernel_parts(groups[0])[0], kernel_parts(groups[1])[0])
        group_rank = self.priority[kernel][2]
        return _KernelChange(
            (kernel,),
            groups,
            [list(half.atoms) for half in halves],
            [(group_rank, 0), (group_rank, 1)],
            [0, 1],
            halves,
        )

    def _child(self, change: _KernelChange) -> _Child | None:
        """The child's new kernels and its order from the first changed position
        until it meets the parent's order again (None: not evaluated)."""
        new = self._new_kernels(change)
        first = self._first_changed(change, new)
        if first is None:
            return None
        start, skipped = first
        found = self._kahn_window(change, new, start, skipped)
        if found is None:
            return None
        window, parent_at = found
        # The new kernels' durations, once the change is known to be evaluated.
        runs = self.runs[change.removed[0]]  # a fused or split kernel is in one instance
        durations = self.costs.durations(change.groups)
        duration = {kernel: ps * runs for kernel, ps in zip(new.ids, durations, strict=True)}
        return _Child(
            change.removed, new.ids, new.reads, duration, start, window, parent_at, new.kernel_of
        )

    def _new_kernels(self, change: _KernelChange) -> _NewKernels:
        """The kernels `change` adds, with their edges and priorities."""
        count = len(self.order)
        new = _NewKernels(self, change.removed, list(range(count, count + len(change.groups))))
        for kernel, atoms in zip(new.ids, change.atoms, strict=True):
            for atom in atoms:
                new.kernel_of_atom[atom] = kernel
        if len(change.removed) == 2:
            kernel_ranks = self._fused_edges(change, new)
        else:
            kernel_ranks = self._split_edges(change, new)
        for kernel, rank, kernel_rank in zip(new.ids, change.ranks, kernel_ranks, strict=True):
            new.priority[kernel] = (bool(new.reads[kernel]), kernel_rank, *rank, ())
        return new

    def _fused_edges(self, change: _KernelChange, new: _NewKernels) -> list[int]:
        """A fusion's kernel has both kernels' edges. Returns its kernel rank."""
        first, second = change.removed
        (merged,) = new.ids
        new.preds[merged] = (self.preds[first] | self.preds[second]) - new.removed
        users = (self.succs[first] | self.succs[second]) - new.removed
        new.succs[merged] = users
        for user in users:
            new.readers_of_new[user] = {merged}
        new.reads[merged] = self.reads[first] | self.reads[second]
        return [self.index.kernel_rank(change.atoms[0])]

    def _split_edges(self, change: _KernelChange, new: _NewKernels) -> list[int]:
        """A split's halves have the edges of their atoms. Returns their kernel ranks."""
        count, kernel_of, readers_of_new = len(self.order), new.kernel_of, new.readers_of_new
        for kernel, half in zip(new.ids, change.halves, strict=True):
            preds = {kernel_of(s) for s in half.order_sources}
            preds.discard(kernel)
            new.preds[kernel] = preds
            succs = new.succs[kernel]
            for user_atom in half.order_targets:
                user = kernel_of(user_atom)
                if user != kernel:
                    succs.add(user)
                    if user < count:
                        readers_of_new.setdefault(user, set()).add(kernel)
            new.reads[kernel] = half.reads
        return [half.rank for half in change.halves]

    def _first_changed(self, change: _KernelChange, new: _NewKernels) -> tuple[int, int] | None:
        """(the first position where the child's order can differ from the
        parent's, how many positions before it were skipped as equal), or None
        when the order would change over too long a stretch (not evaluated)."""
        count, order, pos = len(self.order), self.order, self.pos
        # Nothing changes before the first removed kernel or the first step at
        # which a new kernel could be ready (it may rank above what ran there).
        first_removed = min(pos[k] for k in change.removed)
        start = first_removed
        for kernel in new.ids:
            earliest = 1 + max((pos[p] for p in new.preds[kernel] if p < count), default=-1)
            start = min(start, earliest)
        if max(pos[k] for k in change.removed) - start > MAX_REORDER_KERNELS:
            return None
        # Skip the steps where the child runs what the parent ran: until a removed
        # kernel, the parent's pick is ready in the child too and is the lowest
        # there, unless a new kernel is ready and ranks lower. The skipped steps
        # still count towards the reordering limit.
        skipped_from = start
        ready_from = {
            kernel: 1 + max((pos[p] for p in preds), default=-1)
            for kernel, preds in new.preds.items()
            if all(p < count for p in preds)
        }
        priority, new_priority = self.priority, new.priority
        while start < first_removed:
            here = priority[order[start]]
            if any(at <= start and new_priority[k] < here for k, at in ready_from.items()):
                break
            start += 1
        return start, start - skipped_from

    def _kahn_window(
        self, change: _KernelChange, new: _NewKernels, start: int, skipped: int
    ) -> tuple[list[int], int] | None:
        """Kahn's algorithm over the child's kernels from position `start`, until
        the child has run the same kernels as the parent (from there both orders
        are the same, `_Meeting`) and every new kernel. Returns (the child's
        kernels from `start`, the parent's position where the orders meet), or
        None: the window grew past MAX_REORDER_KERNELS, or the child has a cycle."""
        priority, count = self.priority, len(self.order)
        sorted_ready = self._ready_at_start(start, new.removed)
        next_ready = next(sorted_ready, None)
        next_priority = None if next_ready is None else priority[next_ready]
        heap = new.ready_heap(start)
        new.index_readers()
        meeting = _Meeting(self.order, change, new.ids, start)
        emitted: set[int] = set()
        remaining: dict[int, int] = {}
        window: list[int] = []
        heappop, ran, release = heapq.heappop, meeting.ran, self._release_users
        while heap or next_ready is not None:
            if next_ready is not None and (not heap or next_priority < heap[0][0]):
                kernel = next_ready
                next_ready = next(sorted_ready, None)
                next_priority = None if next_ready is None else priority[next_ready]
            else:
                kernel = heappop(heap)[1]
            window.append(kernel)
            if len(window) + skipped > MAX_REORDER_KERNELS:
                return None  # the order changes over too long a stretch: not evaluated
            emitted.add(kernel)
            if ran(kernel) and all(k in emitted for k in new.ids):
                break
            release(kernel, new, start, emitted, remaining, heap)
        else:
            if len(window) != count - len(change.removed) + len(new.ids) - start:
                return None  # a cycle: not a legal plan
        return window, meeting.parent_at

    def _ready_at_start(self, start: int, removed: set[int]) -> Iterator[int]:
        """The parent's kernels ready at `start` (all their inputs ran before it),
        in priority order. They stay ready until they run, so the parent ran them
        in priority order: in position order they are sorted, and they merge with
        the heap of the kernels that become ready later without being pushed."""
        order, max_pred_position = self.order, self.max_pred_position
        for low in range(start, len(order), 256):
            chunk = max_pred_position[low : low + 256]
            for position in (np.flatnonzero(chunk < start) + low).tolist():
                kernel = order[position]
                if kernel not in removed:
                    yield kernel

    def _release_users(
        self,
        kernel: int,
        new: _NewKernels,
        start: int,
        emitted: set[int],
        remaining: dict[int, int],
        heap: list,
    ) -> None:
        """Push onto `heap` the users of `kernel` that it leaves with every input run."""
        count, pos, removed = len(self.order), self.pos, new.removed
        if kernel < count:
            users = self.succs[kernel]
            extra_users = new.readers_of.get(kernel)
            if extra_users:
                users = list(users) + extra_users
        else:
            users = new.succs[kernel]
        preds_of, priority_of = new.preds_of, new.priority_of
        for user in users:
            if user in emitted or user in removed:
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
                heapq.heappush(heap, (priority_of(user), user))

    def _child_time(self, child: _Child) -> int:
        """Iteration ps of the child: the parent's timeline with the window's
        kernels in place of the parent's (`streams_iteration_ps`)."""
        start, window, parent_at = child.start, child.window, child.parent_at
        if parent_at <= self.first_point and not any(child.reads.values()):
            # The change and its reordering end before the timeline first meets
            # communication, and the new kernels read none: every later time is
            # a max-plus expression of prefix sums past the window, so the whole
            # timeline after it moves by the window's change in duration.
            removed_ps = sum(self.duration[kernel] for kernel in child.removed)
            return self.iteration_ps + sum(child.duration.values()) - removed_ps
        window_position = {k: start + n for n, k in enumerate(window)}
        shift = start + len(window) - parent_at
        kernel_count = len(self.order) - len(child.removed) + len(child.new_ids)
        return self.step_ps + streams_iteration_ps(
            kernel_count,
            self._child_prefix(child),
            self._child_waits(child, window_position, shift),
            self.comm_ps,
            self.copy_ps,
            self.stream,
            self._child_last_producers(child, window_position, shift),
            self.comm_waits,
            len(self.buckets),
        )

    def _child_prefix(self, child: _Child) -> Callable[[list[int]], list[int]]:
        """`streams_iteration_ps`'s prefix sums of the child's order: the parent's
        before the window, the window's own, then the parent's moved by the
        window's change in length and duration."""
        start, window, prefix = child.start, child.window, self.prefix
        window_prefix = [prefix[start]]
        for kernel in window:
            duration = child.duration.get(kernel)
            window_prefix.append(
                window_prefix[-1] + (self.duration[kernel] if duration is None else duration)
            )
        end = start + len(window)
        shift = end - child.parent_at
        tail = window_prefix[-1] - prefix[child.parent_at]
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

        return prefix_ps

    def _child_waits(
        self, child: _Child, window_position: dict[int, int], shift: int
    ) -> dict[int, list[int]]:
        """The communication tasks each kernel of the child reads, by position."""
        low = bisect.bisect_left(self.wait_positions, child.start)
        high = bisect.bisect_left(self.wait_positions, child.parent_at)
        waits = {position: comms for position, _, comms in self.wait_list[:low]}
        for _, kernel, comms in self.wait_list[low:high]:
            if kernel not in child.removed:
                waits[window_position[kernel]] = comms
        for position, _, comms in self.wait_list[high:]:
            waits[position + shift] = comms
        comm_of = self.comm_of_atom
        for kernel, reads in child.reads.items():
            if reads:
                waits[window_position[kernel]] = sorted({comm_of[a] for a in reads})
        return waits

    def _child_last_producers(
        self, child: _Child, window_position: dict[int, int], shift: int
    ) -> list[int]:
        """The position of each communication task's last producer in the child."""
        start, parent_at, pos, kernel_of = child.start, child.parent_at, self.pos, child.kernel_of

        def position_of(kernel: int) -> int:
            found = window_position.get(kernel)
            if found is not None:
                return found
            position = pos[kernel]
            return position if position < start else position + shift

        last = list(self.last_producer)
        touched = set()
        for kernel in child.removed:
            touched.update(self.comms_of_kernel.get(kernel, ()))
        for number, parent_last in enumerate(last):
            if number in touched or start <= parent_last < parent_at:
                last[number] = max(position_of(kernel_of(a)) for a in self.producer_atoms[number])
            elif parent_last >= parent_at:
                last[number] = parent_last + shift
        return last

    # -- the neighbouring plans ----------------------------------------------
    def rebucketed_plan(self, buckets: tuple[tuple[str, ...], ...]) -> Plan:
        """This plan with `buckets` instead of its own."""
        plan = self.plan
        return Plan(plan.module_name, plan.fingerprint, plan.fusion_groups, buckets)

    def fused_plan(self, first: int, second: int) -> Plan:
        """The plan that fuses kernels `first` and `second`: the fused group takes
        the place of the earlier of the two in the plan's list, so every other
        group keeps its priority."""
        if self.pos[first] > self.pos[second]:
            first, second = second, first
        merged = self._merged(first, second)
        a, b = self.instances[first][0], self.instances[second][0]
        groups = list(self.groups)
        groups[min(a, b)] = merged
        del groups[max(a, b)]
        return self._with_groups(groups)

    def split_plan(self, kernel: int) -> Plan:
        """The plan that splits `kernel`: its halves take its group's place."""
        groups = list(self.groups)
        g = self.instances[kernel][0]
        groups[g : g + 1] = list(self.halves(kernel))
        return self._with_groups(groups)

    def _with_groups(self, groups: list[tuple[str, ...]]) -> Plan:
        plan = self.plan
        return Plan(plan.module_name, plan.fingerprint, tuple(groups), plan.all_reduce_buckets)


class _KernelChange(NamedTuple):
    """A fusion or a split, as the kernels it removes and those it adds."""

    removed: tuple[int, ...]  # a fusion's two kernels (earlier first), or the split kernel
    groups: list[tuple[str, ...]]  # each new kernel's group
    atoms: list[list[int]]  # each new kernel's atoms
    ranks: list[tuple[int, int]]  # each new kernel's group number and half (its priority)
    # The parent's kernels each new kernel stands for in the order: the fusion's
    # two, or for a split nothing then the split kernel (its later half).
    units: list[int]
    halves: tuple[KernelPart, ...]  # a split's halves, else ()


class _NewKernels:
    """The kernels a change adds (numbered from the parent's kernel count on):
    their edges to the parent's kernels, what they read and their priorities."""

    __slots__ = (
        "ids",
        "removed",
        "count",
        "parent_pos",
        "parent_preds",
        "parent_priority",
        "parent_kernel_of",
        "kernel_of_atom",
        "preds",
        "succs",
        "reads",
        "priority",
        "readers_of_new",
        "readers_of",
    )

    def __init__(self, state: PlanState, removed: tuple[int, ...], ids: list[int]):
        self.ids = ids
        self.removed = set(removed)
        self.count = len(state.order)
        self.parent_pos = state.pos
        self.parent_preds, self.parent_priority = state.preds, state.priority
        self.parent_kernel_of = state.kernel_of_atom
        self.kernel_of_atom: dict[int, int] = {}  # the new kernels' atoms
        self.preds: dict[int, set[int]] = {}
        self.succs: dict[int, set[int]] = {kernel: set() for kernel in ids}
        self.reads: dict[int, frozenset[int]] = {}
        self.priority: dict[int, tuple] = {}
        self.readers_of_new: dict[int, set[int]] = {}  # parent kernel -> new kernels it reads
        self.readers_of: dict[int, list[int]] = {}  # kernel -> new kernels that read it

    def kernel_of(self, atom: int) -> int:
        """The child's kernel of `atom`."""
        found = self.kernel_of_atom.get(atom)
        return self.parent_kernel_of[atom] if found is None else found

    def preds_of(self, kernel: int):
        """The kernels `kernel` waits for in the child."""
        if kernel >= self.count:
            return self.preds[kernel]
        extra, removed = self.readers_of_new.get(kernel), self.removed
        if extra is None:
            return [p for p in self.parent_preds[kernel] if p not in removed]
        return (self.parent_preds[kernel] - removed) | extra

    def priority_of(self, kernel: int) -> tuple:
        found = self.priority.get(kernel)
        return self.parent_priority[kernel] if found is None else found

    def index_readers(self) -> None:
        """`readers_of`: for each kernel, the new kernels that wait for it."""
        for kernel in self.ids:
            for pred in self.preds[kernel]:
                self.readers_of.setdefault(pred, []).append(kernel)

    def ready_heap(self, start: int) -> list:
        """A heap of the new kernels whose inputs all ran before position `start`."""
        pos, preds = self.parent_pos, self.preds
        heap = [
            (self.priority_of(kernel), kernel)
            for kernel in self.ids
            if all(p not in preds and pos[p] < start for p in preds[kernel])
        ]
        heapq.heapify(heap)
        return heap


class _Meeting:
    """Where the child's order meets the parent's again: for each kernel the
    child runs, the parent runs as many as it stands for (a fused kernel two, a
    split's first half none); they meet when both have run the same kernels."""

    __slots__ = ("order", "removed", "unit_of", "extra_child", "extra_parent", "parent_at")

    def __init__(self, order: list[int], change: _KernelChange, ids: list[int], start: int):
        self.order, self.removed = order, change.removed
        self.unit_of = dict(zip(ids, change.units, strict=True))
        self.extra_child: set[int] = set()  # run by the child, not yet by the parent
        self.extra_parent: set[int] = set()  # run by the parent, not yet by the child
        self.parent_at = start  # the parent has run the kernels before this position

    def ran(self, kernel: int) -> bool:
        """The child ran `kernel`; whether both have now run the same kernels."""
        extra_child, extra_parent = self.extra_child, self.extra_parent
        units = self.unit_of.get(kernel)
        if units is None:
            if kernel in extra_parent:
                extra_parent.remove(kernel)
            else:
                extra_child.add(kernel)
            units = 1
        else:
            for item in self.removed if units else ():
                if item in extra_parent:
                    extra_parent.remove(item)
                else:
                    extra_child.add(item)
        order, parent_at = self.order, self.parent_at
        self.parent_at = parent_at + units
        while units:
            item = order[parent_at]
            parent_at += 1
            units -= 1
            if item in extra_child:
                extra_child.remove(item)
            else:
                extra_parent.add(item)
        return not extra_child and not extra_parent


@dataclass
class _Child:
    """A fusion or split evaluated: its new kernels and the child's order over the
    window where it differs from the parent's."""

    removed: tuple[int, ...]
    new_ids: list[int]
    reads: dict[int, frozenset[int]]  # per new kernel
    duration: dict[int, int]  # per new kernel, ps
    start: int  # the window's first position
    window: list[int]  # the child's kernels from `start`
    parent_at: int  # the parent's position where the orders meet again
    kernel_of: Callable[[int], int]  # the child's kernel of an atom
