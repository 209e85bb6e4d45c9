"""The state of one loaded plan: its kernels, their order, durations and
dependencies, and its communication tasks (`PlanState`)."""

from __future__ import annotations

from dataclasses import replace
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan, buckets_follow_dependencies
from disco_xla.simulator.comm import CommCostFn, all_reduce_s
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import PS_PER_S, communication_ps, simulate, to_ps
from disco_xla.simulator.graph_steps import untracked_dimensions
from disco_xla.simulator.incremental.costs import (
    GroupCosts,
    bucket_kinds_of,
    gradient_dependencies_of,
)
from disco_xla.simulator.incremental.moves import KernelMoves
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.module_index import CallKey, ModuleIndex, module_index
from disco_xla.simulator.plan_kernels import (
    CollectiveInfo,
    bucket_waits,
    kernel_order,
    kernel_predecessors,
    module_collectives,
    order_priorities,
    other_tasks,
    plan_kernels,
)
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.streams import bucket_streams, streams_iteration_ps


class CommunicationInfo(NamedTuple):
    """A collective's `CollectiveInfo` and, in this plan, the kernels that
    produce what it sends."""

    collective: CollectiveInfo
    producers: set[int]


class PlanState(KernelMoves):
    """One loaded plan, ready to evaluate its neighbours: the fusion of two
    kernels (`evaluate_fuse`), the split of one (`evaluate_split`) and other
    buckets (`evaluate_buckets`), each with the plan it makes (`fused_plan`,
    `split_plan`, `rebucketed_plan`). Kernels are numbered as
    `plan_kernels.plan_kernels` numbers them; positions are places in the kernel
    order."""

    module: HloModule
    plan: Plan
    profile: ClusterProfile
    cost_model: CostModel
    comm_cost: CommCostFn
    costs: GroupCosts
    index: ModuleIndex
    step_ps: int  # the host's cost of a step, added to every time as `simulate` adds it
    groups: list[tuple[str, ...]]
    # Per kernel (`_load_kernels`).
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
    priority: list[tuple]  # the order's priority (`plan_kernels.order_priorities`)
    # The kernel order (`_order_kernels`).
    order: list[int]  # kernels by position
    pos: list[int]  # positions by kernel
    prefix: list[int]  # durations summed in order: prefix[i] is the sum below position i
    prefix_array: np.ndarray
    max_pred_position: np.ndarray  # per position, the latest position of an input
    # The collectives, whatever the buckets (`_collective_info`).
    name_of: dict[int, str]  # collective atom -> instruction name
    others: list[tuple[int, ...]]  # per other task (`other_tasks`): its collective atoms
    other_number: dict[int, int]  # collective atom -> its other task
    other_merged: list[bool]  # per other task: a bucket of several all-gathers
    gradient_info: dict[str, CommunicationInfo]  # by gradient all-reduce name
    other_info: list[CommunicationInfo]  # of each of `others`
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
        self._load_kernels()
        self._comm_cost_cache: dict[tuple, tuple[int, int]] = {}
        self._merged_cache: dict[tuple[int, int], tuple[str, ...]] = {}
        self._bucket_cache: dict[tuple[str, ...], tuple[int, int, int]] = {}
        self._stream_cache: dict[int, list[int]] = {}
        self._collective_info()
        self.gradient_dependencies = gradient_dependencies_of(module)
        self.bucket_kinds = bucket_kinds_of(module)
        self._set_buckets(plan.all_reduce_buckets)
        self._rebucket_info()
        # Where a reader of one gradient of a bucket comes before another's
        # producer in the kernel order by data alone, the plan orders its kernels
        # by its buckets too (`plan_kernels.bucket_waits`): this state's moves
        # are then simulated in full. Elsewhere the two orders are the same.
        # All-gather buckets whose readers would run before another member's
        # producer reorder the kernels the same way, for every neighbour.
        # The dimensions whose row in `graph_steps.GRAPH_STEPS` is not
        # `incremental` (prefetches and chunks) split into tasks this state does
        # not track.
        self.full_only = bool(untracked_dimensions(plan)) or self._ordered_by_all_gather_buckets()
        try:
            self.iteration_ps = self._simulated_ps(plan) if self.full_only else self._iteration_ps()
        except RuntimeError:
            self.full_only = True
            self.iteration_ps = self._simulated_ps(plan)

    # -- construction ---------------------------------------------------------
    def _ordered_by_all_gather_buckets(self) -> bool:
        """Whether the plan's all-gather buckets add waits to the kernel order
        (`plan_kernels.bucket_waits`): then `build_task_graph` orders the
        kernels otherwise than this state, and every evaluation is a full
        simulation."""
        others = other_tasks(self.index, self.plan.all_gather_buckets)
        if not any(others.merged):
            return False
        kernels = plan_kernels(self.index, self.groups)
        waits = bucket_waits(kernels, (), {}, others)
        return any(w - p for w, p in zip(waits, self.preds, strict=True))

    def _load_kernels(self) -> None:
        """The plan's kernels (`plan_kernels`), their durations, edges and
        priorities, and their order (`kernel_order`, as `build_task_graph`
        orders them) with its prefix sums of durations."""
        kernels = plan_kernels(self.index, self.groups)
        parts = kernels.parts
        self.instances, self.kernel_of_atom = kernels.instances, kernels.kernel_of_atom
        self.single = kernels.single
        known_ps = self.costs.cache
        duration = [known_ps.get(self.groups[group]) for group, _ in self.instances]
        if None in duration:  # groups not costed yet
            duration = self.costs.durations([self.groups[g] for g, _ in self.instances])
        self.runs = [part.runs for part in parts]
        if any(runs != 1 for runs in self.runs):  # kernels in loop bodies: every trip
            duration = [d * runs for d, runs in zip(duration, self.runs, strict=True)]
        self.duration = duration
        self.atoms = [list(part.atoms) for part in parts]
        self.preds = kernel_predecessors(kernels)
        self.succs = [set() for _ in parts]
        for kernel, preds in enumerate(self.preds):
            for pred in preds:
                self.succs[pred].add(kernel)
        self.reads = [part.reads for part in parts]
        self.expensive = [part.expensive for part in parts]
        self.priority = [
            (bool(part.reads), part.rank, group, 0, key)
            for part, (group, key) in zip(parts, self.instances, strict=True)
        ]
        self._order_kernels(order_priorities(kernels, len(self.groups)))

    def _order_kernels(self, priority: list[int]) -> None:
        """The kernel order, positions, prefix sums of the durations, and each
        position's latest input."""
        self.order = kernel_order(priority, self.preds)
        pos = self.pos = [0] * len(self.order)
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
        communication task in this plan (`CommunicationInfo`)."""
        collectives = module_collectives(self.index)
        tasks = other_tasks(self.index, self.plan.all_gather_buckets)
        self.others, self.name_of = tasks.atoms, collectives.name_of
        self.other_number = {a: n for n, atoms in enumerate(tasks.atoms) for a in atoms}
        self.other_merged = tasks.merged
        kernel_of_atom = self.kernel_of_atom

        def info(found: CollectiveInfo) -> CommunicationInfo:
            return CommunicationInfo(found, {kernel_of_atom[a] for a in found.producer_atoms})

        self.gradient_info = {
            name: info(found) for name, found in collectives.gradient_info.items()
        }
        self.other_info = [info(found) for found in tasks.info]
        self.waiting = [k for k, reads in enumerate(self.reads) if reads]

    def _rebucket_info(self) -> None:
        """What a bucket change needs, per gradient: its last producer's position,
        and per waiting kernel: the collectives it reads, by gradient name or by
        the other collective's task."""
        pos = self.pos
        name_of = self.name_of
        self.gradient_last = {
            name: max((pos[k] for k in info.producers), default=-1)
            for name, info in self.gradient_info.items()
        }
        other_names = self.other_number
        self.gradient_reads: dict[str, tuple[set[str], set[int]]] = {
            name: (
                {name_of[a] for a in info.collective.reads if a not in other_names},
                {other_names[a] for a in info.collective.reads if a in other_names},
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
        comm_ps, copy_ps = self._message_ps([self.gradient_info[name] for name in bucket])
        producer = max(self.gradient_last[name] for name in bucket)
        found = self._bucket_cache[bucket] = (comm_ps, copy_ps, producer)
        return found

    def _message_ps(
        self, members: list[CommunicationInfo], merged: bool = False
    ) -> tuple[int, int]:
        """(communication ps, copy ps) of one task that sends `members` together
        (or one `merged` all-gather bucket), for all its runs in a step
        (`events.communication_ps`, cached)."""
        first = members[0].collective
        size = sum(member.collective.size for member in members)
        several = merged or len(members) > 1
        elements = () if several else first.elements
        group = (first.group, first.devices)  # a bucket holds one kind and one group
        key = (size, several, elements, first.kind, group)
        costs = self._comm_cost_cache.get(key)
        if costs is None:
            costs = self._comm_cost_cache[key] = communication_ps(
                size, 2 if several else 1, self.profile, self.comm_cost, elements, first.kind, group
            )
        runs = first.runs  # a bucket's gradients share their computation
        return costs[0] * runs, costs[1] * runs

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
                    found.add(others_from + self.other_number[source])
        return sorted(found)

    def comm_atoms_of(self, task: int) -> list[int]:
        return [a for a, c in self.comm_of_atom.items() if c == task]

    def _set_buckets(self, buckets) -> None:
        """Communication tasks as `build_task_graph` numbers them (the buckets in
        plan order, then every other collective in atom order), their costs,
        producers and reads."""
        self.buckets = tuple(buckets)
        self.buckets_hash = hash(self.buckets)
        self.stream = self._streams(len(buckets))
        tasks = [[self.gradient_info[name] for name in bucket] for bucket in buckets]
        tasks += [[member] for member in self.other_info]
        comm_of_atom = self.comm_of_atom = {}
        for number, members in enumerate(tasks):
            for member in members:
                for atom in member.collective.atoms:
                    comm_of_atom[atom] = number
        self.comm_ps, self.copy_ps, self.comm_waits = [], [], []
        self.producers, self.producer_atoms, self.last_producer = [], [], []
        merged = [False] * len(buckets) + self.other_merged
        for number, members in enumerate(tasks):
            comm_ps, copy_ps = self._message_ps(members, merged[number])
            self.comm_ps.append(comm_ps)
            self.copy_ps.append(copy_ps)
            if len(members) == 1:
                producer_atoms = members[0].collective.producer_atoms
                producers, reads = members[0].producers, members[0].collective.reads
            else:
                producer_atoms = [a for m in members for a in m.collective.producer_atoms]
                producers = set().union(*(m.producers for m in members))
                reads = set().union(*(m.collective.reads for m in members))
            self.comm_waits.append(sorted({comm_of_atom[a] for a in reads} - {number}))
            self.producers.append(producers)
            self.producer_atoms.append(producer_atoms)
            self.last_producer.append(max((self.pos[k] for k in producers), default=-1))
        self._index_waits()

    def _index_waits(self) -> None:
        """The tasks each waiting kernel reads, by kernel and by position, the
        first position where the timeline meets communication, and the tasks
        each kernel produces for."""
        comm_of_atom, pos = self.comm_of_atom, self.pos
        self.wait_comms = {
            kernel: sorted({comm_of_atom[a] for a in self.reads[kernel]}) for kernel in self.waiting
        }
        self.wait_list = sorted((pos[k], k, c) for k, c in self.wait_comms.items())
        self.wait_positions = [entry[0] for entry in self.wait_list]
        # A kernel that reads a collective, or the last producer of one (-1: a
        # collective with no producer).
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
        which has no incremental form, and buckets that reorder the kernels)."""
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
        if self.profile.execution == "gpu-streams" and not self.full_only:
            try:
                return self._rebucket_time(buckets) / PS_PER_S
            except RuntimeError:
                # A reader of one gradient of a new bucket comes before another's
                # producer in this plan's kernel order: the plan with these
                # buckets orders its kernels otherwise (`bucket_waits`). Where the
                # order already meets the new buckets, it is the same order.
                pass
        try:
            return self._simulated_ps(self.rebucketed_plan(buckets)) / PS_PER_S
        except RuntimeError:
            # No kernel order runs these buckets: a bucket's reader would come
            # before a kernel that one of its members waits for, through the
            # collective it reads (a data-parallel all-reduce of a block
            # another bucket reduce-scatters). Not a plan.
            return None

    # -- the neighbouring plans ----------------------------------------------
    def rebucketed_plan(self, buckets: tuple[tuple[str, ...], ...]) -> Plan:
        """This plan with `buckets` instead of its own."""
        return replace(self.plan, all_reduce_buckets=buckets)
