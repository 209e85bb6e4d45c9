"""A plan's kernels and their order, and what each collective brings to a
communication task: the parts that `kernels.build_task_graph` and the
incremental simulator (`simulator.incremental`) both build from, so that both
number, order and cost the same tasks.

A fusion group's kernel has one part per instance of its computation
(`group_parts`, cached per module index). A plan's kernels are its groups'
parts in plan order (`plan_kernels`), and the compute stream runs them in the
order `kernel_order` gives: Kahn's algorithm by `order_priorities`.
"""

from __future__ import annotations

import heapq
from itertools import repeat
from typing import NamedTuple

from disco_xla.hlo.collectives import collective_bytes, collective_kind, device_groups
from disco_xla.hlo.graph import Instruction
from disco_xla.simulator.module_index import CallKey, ModuleIndex

# Asynchronous starts whose tuple shape is (operand, result[, contexts]).
_START_TUPLES = frozenset({"all-gather-start", "collective-permute-start"})


class KernelPart(NamedTuple):
    """One instance of a fusion group's kernel (one call site of its computation):
    what every plan with the group shares."""

    key: CallKey
    atoms: tuple[int, ...]  # in the group's order
    order_sources: frozenset[int]  # compute atoms outside it that it waits for (order)
    order_targets: frozenset[int]  # compute atoms outside it that wait for it (order)
    reads: frozenset[int]  # the collective atoms it reads
    expensive: int  # dots and convolutions in it
    rank: int  # `ModuleIndex.kernel_rank`
    runs: int  # how many times this instance runs in one step (`ModuleIndex.runs`)


def group_parts(index: ModuleIndex, group: tuple[str, ...]) -> tuple[KernelPart, ...]:
    """The group's kernel in each instance of its computation, call keys in
    order, built once per module."""

    def parts() -> tuple[KernelPart, ...]:
        members = [id(index.by_name[name]) for name in group]
        computation = index.by_name[group[0]].computation
        return tuple(
            _part(index, tuple(index.atom_of[(member, key)] for member in members), key)
            for key in index.instances.get(computation.name, [()])
        )

    return index.module.analyses.get((group_parts, group), parts)


def _part(index: ModuleIndex, atoms: tuple[int, ...], key: CallKey) -> KernelPart:
    order_inputs, inputs, is_compute = index.order_inputs, index.inputs, index.is_compute
    sources = {s for atom in atoms for s in order_inputs[atom]}
    sources.difference_update(atoms)
    targets = {u for atom in atoms for u in index.order_users[atom]}
    targets.difference_update(atoms)
    return KernelPart(
        key,
        atoms,
        frozenset(sources),
        frozenset(targets),
        frozenset(s for atom in atoms for s in inputs[atom] if not is_compute[s]),
        sum(index.is_expensive[a] for a in atoms),
        index.kernel_rank(atoms),
        index.instance_runs(index.atoms[atoms[0]][0], key),
    )


class PlanKernels(NamedTuple):
    """A plan's kernels before ordering: its groups' parts in plan order."""

    instances: list[tuple[int, CallKey]]  # per kernel: (group number, call key)
    kernel_of_atom: dict[int, int]  # the kernel of every compute atom
    parts: list[KernelPart]  # per kernel
    call_rank: list[int]  # per kernel: its part's place among its group's parts
    single: list[bool]  # per kernel: its group's computation has one instance


def plan_kernels(index: ModuleIndex, groups) -> PlanKernels:
    """The kernels of a plan with fusion `groups`, numbered group by group."""
    kernels = PlanKernels([], {}, [], [], [])
    instances, kernel_of_atom = kernels.instances, kernels.kernel_of_atom
    for group_number, group in enumerate(groups):
        parts = group_parts(index, group)
        if len(parts) == 1:  # the common case, apart for speed
            kernel = len(instances)
            for atom in parts[0].atoms:
                kernel_of_atom[atom] = kernel
            instances.append((group_number, parts[0].key))
            kernels.call_rank.append(0)
            kernels.parts.append(parts[0])
            kernels.single.append(True)
            continue
        for call, part in enumerate(parts):
            kernel_of_atom.update(zip(part.atoms, repeat(len(instances))))
            instances.append((group_number, part.key))
            kernels.call_rank.append(call)
        kernels.parts.extend(parts)
        kernels.single.extend([False] * len(parts))
    return kernels


def kernel_predecessors(kernels: PlanKernels) -> list[set[int]]:
    """The kernels each kernel waits for in the order (through all-reduces, the
    kernels that produced the gradient)."""
    kernel_of_atom = kernels.kernel_of_atom
    predecessors = []
    for kernel, part in enumerate(kernels.parts):
        preds = {kernel_of_atom[s] for s in part.order_sources}
        preds.discard(kernel)
        predecessors.append(preds)
    return predecessors


def bucket_waits(
    kernels: PlanKernels,
    buckets,
    gradient_info: dict[str, CollectiveInfo],
    others: OtherTasks | None = None,
) -> list[set[int]]:
    """`kernel_predecessors` with the waits a plan's buckets add: a kernel that
    reads one gradient of a bucket of several waits for the producers of all of
    them, since the bucket is sent once they are all produced. Without these,
    the in-order compute stream could run a reader before another member's
    producer (in a loop body, whose kernel order places readers of collectives
    late but not after every producer), and neither could then go on. The same
    for the all-gather buckets among `others` (`other_tasks`)."""
    predecessors = kernel_predecessors(kernels)
    kernel_of_atom = kernels.kernel_of_atom
    producers_of_atom: dict[int, set[int]] = {}
    bucketed = [[gradient_info[name] for name in bucket] for bucket in buckets if len(bucket) > 1]
    if others is not None:
        bucketed += [
            [info] for info, merged in zip(others.info, others.merged, strict=True) if merged
        ]
    upstream = _upstream_producers(kernel_of_atom, gradient_info, buckets, others)
    for infos in bucketed:
        producers = {kernel for info in infos for kernel in upstream(info)}
        for info in infos:
            for atom in info.atoms:
                producers_of_atom[atom] = producers
    if producers_of_atom:
        for kernel, part in enumerate(kernels.parts):
            for atom in part.reads:
                found = producers_of_atom.get(atom)
                if found:
                    predecessors[kernel].update(found - {kernel})
    return predecessors


def _upstream_producers(kernel_of_atom, gradient_info, buckets, others):
    """A function giving the kernels a collective waits for: those that produce
    what it reads, and, through each collective it reads (a data-parallel
    all-reduce of a reduce-scattered block), those that produce what that
    one's whole bucket reads, at any depth."""
    sent_with: dict[int, list[CollectiveInfo]] = {}  # atom -> its bucket's members
    for bucket in buckets:
        infos = [gradient_info[name] for name in bucket]
        for info in infos:
            sent_with.update(dict.fromkeys(info.atoms, infos))
    if others is not None:
        for atoms, info in zip(others.atoms, others.info, strict=True):
            sent_with.update(dict.fromkeys(atoms, [info]))

    def upstream(info: CollectiveInfo) -> set[int]:
        found = {kernel_of_atom[a] for a in info.producer_atoms}
        pending, seen = list(info.reads), set()
        while pending:
            atom = pending.pop()
            if atom in seen or atom not in sent_with:
                continue
            seen.add(atom)
            for source in sent_with[atom]:
                found.update(kernel_of_atom[a] for a in source.producer_atoms)
                pending.extend(source.reads)
        return found

    return upstream


def order_priorities(kernels: PlanKernels, group_count: int) -> list[int]:
    """Each kernel's priority in the order, lowest first: whether it reads a
    collective, its kernel rank, its group's place in the plan, its call key
    (`kernels`' module docstring). Integers in that lexicographic order, which
    compare faster than tuples."""
    parts = kernels.parts
    rank_bound = 1 + max((part.rank for part in parts), default=0)
    call_bound = 1 + max(kernels.call_rank, default=0)
    return [
        ((bool(part.reads) * rank_bound + part.rank) * group_count + group) * call_bound + call
        for part, (group, _), call in zip(parts, kernels.instances, kernels.call_rank, strict=True)
    ]


def kernel_order(priority: list, predecessors: list[set[int]]) -> list[int]:
    """The topological order that, among ready kernels, runs the lowest
    `priority` first (Kahn's algorithm with a heap)."""
    count = len(priority)
    users: list[list[int]] = [[] for _ in range(count)]
    waiting = [len(p) for p in predecessors]
    for kernel, preds in enumerate(predecessors):
        for pred in preds:
            users[pred].append(kernel)
    ready = [(priority[k], k) for k in range(count) if waiting[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, kernel = heapq.heappop(ready)
        order.append(kernel)
        for user in users[kernel]:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (priority[user], user))
    if len(order) != count:
        raise ValueError("the plan's kernels have a cycle; run verify_plan first")
    return order


class CollectiveInfo(NamedTuple):
    """What a gradient all-reduce or another collective brings to a communication
    task, whatever the plan."""

    size: int  # bytes
    atoms: list[int]
    producer_atoms: tuple[int, ...]  # compute atoms it reads
    reads: frozenset[int]  # collective atoms it reads
    elements: tuple[int, ...]  # tensor sizes of a tuple collective, else ()
    runs: int  # how many times it runs in one step (`ModuleIndex.runs`)
    kind: str  # `collectives.collective_kind`
    group: tuple[int, ...] = ()  # one of its device groups, () when one holds all
    devices: int = 0  # the devices its groups hold together (with `group`)


class Collectives(NamedTuple):
    """The module's collectives, whatever the plan."""

    others: list[int]  # the atoms of collectives that are not gradients, in atom order
    gradient_info: dict[str, CollectiveInfo]  # by gradient all-reduce name
    other_info: list[CollectiveInfo]  # of each of `others`
    name_of: dict[int, str]  # the instruction name of every collective atom


def module_collectives(index: ModuleIndex) -> Collectives:
    """`Collectives` of the index's module, built once per module (`HloModule.analyses`)."""
    return index.module.analyses.get(module_collectives, lambda: _collectives(index))


def _collectives(index: ModuleIndex) -> Collectives:
    gradients = {a.name for a in index.module.gradient_all_reduces}
    others = [
        atom
        for atom, compute in enumerate(index.is_compute)
        if not compute and index.atoms[atom][0].name not in gradients
    ]
    return Collectives(
        others,
        {name: collective_info(index, index.atoms_of_name[name]) for name in gradients},
        [collective_info(index, [atom]) for atom in others],
        {a: index.atoms[a][0].name for a in range(len(index.atoms)) if not index.is_compute[a]},
    )


class OtherTasks(NamedTuple):
    """The communication tasks of the collectives that are not gradients, for a
    plan's all-gather buckets: one per collective atom, in atom order, except
    that the members of an all-gather bucket of several are one task in each
    instance of their computation (at the place of its first atom)."""

    atoms: list[tuple[int, ...]]  # per task: its collective atoms
    info: list[CollectiveInfo]  # per task: what its members bring together
    merged: list[bool]  # per task: a bucket of several all-gathers


def other_tasks(index: ModuleIndex, all_gather_buckets) -> OtherTasks:
    """`OtherTasks` of a plan with `all_gather_buckets` (kept beside the
    module, `HloModule.analyses`)."""
    collectives = module_collectives(index)
    several = tuple(tuple(bucket) for bucket in all_gather_buckets if len(bucket) > 1)
    if not several:
        count = len(collectives.others)
        return OtherTasks(
            [(a,) for a in collectives.others], collectives.other_info, [False] * count
        )
    return index.module.analyses.get(
        (other_tasks, several), lambda: _merged_tasks(index, collectives, several)
    )


def _merged_tasks(index: ModuleIndex, collectives: Collectives, several) -> OtherTasks:
    bucket_of = {name: number for number, bucket in enumerate(several) for name in bucket}
    slot_of: dict[tuple[int, CallKey], int] = {}
    members: list[list[tuple[int, CollectiveInfo]]] = []
    for atom, info in zip(collectives.others, collectives.other_info, strict=True):
        instr, key = index.atoms[atom]
        number = bucket_of.get(instr.name)
        slot = None if number is None else slot_of.get((number, key))
        if slot is None:
            if number is not None:
                slot_of[(number, key)] = len(members)
            members.append([(atom, info)])
        else:
            members[slot].append((atom, info))
    return OtherTasks(
        [tuple(atom for atom, _ in task) for task in members],
        [_merged_info([info for _, info in task]) for task in members],
        [len(task) > 1 for task in members],
    )


def _merged_info(infos: list[CollectiveInfo]) -> CollectiveInfo:
    """What a bucket of collectives (one kind, group and computation) sends as
    one message."""
    if len(infos) == 1:
        return infos[0]
    atoms = [atom for info in infos for atom in info.atoms]
    first = infos[0]
    return first._replace(
        size=sum(info.size for info in infos),
        atoms=atoms,
        producer_atoms=tuple(a for info in infos for a in info.producer_atoms),
        reads=frozenset().union(*(info.reads for info in infos)) - set(atoms),
        elements=(),
    )


def collective_info(index: ModuleIndex, atoms: list[int]) -> CollectiveInfo:
    """`CollectiveInfo` of the collective whose atoms (one per instance of its
    computation) are `atoms`."""
    instr = index.atoms[atoms[0]][0]
    producer_atoms, reads = [], set()
    for atom in atoms:
        for source in index.inputs[atom]:
            if index.is_compute[source]:
                producer_atoms.append(source)
            else:
                reads.add(source)
    return CollectiveInfo(
        collective_bytes(instr),
        atoms,
        tuple(producer_atoms),
        frozenset(reads),
        tuple_element_sizes(instr),
        sum(index.instance_runs(*index.atoms[atom]) for atom in atoms),
        collective_kind(instr),
        *_first_group(instr),
    )


def _first_group(instr: Instruction) -> tuple[tuple[int, ...], int]:
    """(one device group, the devices of all its groups) of a collective whose
    groups split the devices into several; ((), 0) when one group holds them
    all, or when the groups are written in a form without device ids."""
    groups = device_groups(instr.proto)
    if len(groups) < 2 or not all(isinstance(g, tuple) for g in groups):
        return (), 0
    return tuple(groups[0]), sum(len(g) for g in groups)


def tuple_element_sizes(instr: Instruction) -> tuple[int, ...]:
    """The bytes of each tensor of a tuple collective (one that sends several),
    else (). An asynchronous start's tuple holds its operand and result (and
    contexts), not tensors sent one after another."""
    if instr.opcode in _START_TUPLES:
        return ()
    elements = tuple(leaf.bytes for leaf in instr.shape.leaves())
    return elements if len(elements) > 1 else ()
