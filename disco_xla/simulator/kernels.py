"""From a module and a plan to the task graph the simulator runs.

A task is a kernel (one op-fusion group of the plan), a bucket (one concatenated
all-reduce of several gradients), or another collective (an all-reduce that is not
a gradient, such as the loss mean). Dependencies pass through instructions that
are no work of their own (parameters, tuples, calls): a called computation's
parameters depend on the call's operands, and the call's users on the callee's
root, so the body of a pmap'd step is linked to its caller.
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from disco_xla.hlo_passes.graph import ALL_REDUCE_OPCODES, HloModule, Instruction
from disco_xla.plan import Plan

CONTROL_CALLS = frozenset({"call", "while", "conditional"})


@dataclass
class Kernel:
    """One fused kernel: its instructions and what the roofline needs of them."""

    name: str
    instructions: list[Instruction]
    flops: int
    bytes_in: int  # distinct operands read from outside the kernel
    bytes_out: int  # results used outside the kernel
    element_type: str  # of the largest result
    op_class: str  # 'convolution', 'dot', 'reduce' or 'elementwise': what bounds it

    @property
    def bytes(self) -> int:
        return self.bytes_in + self.bytes_out

    @property
    def structural_hash(self) -> str:
        """The kernel's shape, independent of instruction names: opcodes, shapes,
        attributes and edges, in topological order."""
        position = {id(i): n for n, i in enumerate(self.instructions)}
        parts = []
        for instr in self.instructions:
            operands = [
                f"#{position[id(o)]}" if id(o) in position else f"in:{o.shape}"
                for o in instr.operands
            ]
            proto = instr.proto
            attributes = (
                list(proto.dimensions),
                list(proto.dot_dimension_numbers.lhs_contracting_dimensions),
                list(proto.dot_dimension_numbers.rhs_contracting_dimensions),
                [(w.size, w.stride) for w in proto.window.dimensions],
            )
            parts.append(f"{instr.opcode}:{instr.shape}:{operands}:{attributes}")
        return hashlib.sha1("|".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class KernelArrays:
    """Per-kernel figures as arrays, for batched cost models."""

    flops: np.ndarray
    bytes: np.ndarray
    element_types: list[str]
    element_type_index: np.ndarray
    op_classes: list[str]
    op_class_index: np.ndarray


@dataclass
class TaskGraph:
    """Kernels in a valid execution order, communication tasks in plan order, and
    what each task waits for. Task ids: kernels 0..K-1, then communication tasks."""

    kernels: list[Kernel]
    communications: list[tuple[str, int, tuple[str, ...]]]  # (name, bytes, members)
    dependencies: list[list[int]]  # per task id
    is_bucket: list[bool]  # per communication task: a gradient bucket of the plan

    @property
    def task_count(self) -> int:
        return len(self.kernels) + len(self.communications)

    @cached_property
    def kernel_waits_on(self) -> list[list[int]]:
        """For each kernel, the communication tasks it reads."""
        first_comm = len(self.kernels)
        return [[d for d in deps if d >= first_comm] for deps in self.dependencies[:first_comm]]

    @cached_property
    def comm_waits_on(self) -> list[list[int]]:
        """For each communication task, the communication tasks it reads."""
        first_comm = len(self.kernels)
        return [[d for d in deps if d >= first_comm] for deps in self.dependencies[first_comm:]]

    @cached_property
    def last_producer(self) -> list[int]:
        """For each communication task, its last producing kernel in order (-1: none)."""
        first_comm = len(self.kernels)
        return [
            max((d for d in deps if d < first_comm), default=-1)
            for deps in self.dependencies[first_comm:]
        ]

    @cached_property
    def kernel_arrays(self) -> KernelArrays:
        element_types = sorted({k.element_type for k in self.kernels})
        op_classes = sorted({k.op_class for k in self.kernels})
        type_index = {t: n for n, t in enumerate(element_types)}
        class_index = {c: n for n, c in enumerate(op_classes)}
        return KernelArrays(
            flops=np.array([k.flops for k in self.kernels], dtype=np.float64),
            bytes=np.array([k.bytes for k in self.kernels], dtype=np.float64),
            element_types=element_types,
            element_type_index=np.array([type_index[k.element_type] for k in self.kernels], int),
            op_classes=op_classes,
            op_class_index=np.array([class_index[k.op_class] for k in self.kernels], int),
        )


def build_task_graph(module: HloModule, plan: Plan) -> TaskGraph:
    """The tasks of `plan` on `module` (the plan must have passed `verify_plan`)."""
    by_name = {i.name: i for i in module.instructions()}
    task_of: dict[int, int] = {}
    groups = [[by_name[n] for n in group] for group in plan.fusion_groups]
    kernel_count = len(groups)
    for index, members in enumerate(groups):
        for instr in members:
            task_of[id(instr)] = index
    communications: list[tuple[str, int, tuple[str, ...]]] = []
    is_bucket: list[bool] = []
    for bucket in plan.all_reduce_buckets:
        task = kernel_count + len(communications)
        members = [by_name[n] for n in bucket]
        for instr in members:
            task_of[id(instr)] = task
        name = bucket[0] if len(bucket) == 1 else f"bucket[{bucket[0]}..{bucket[-1]}]"
        communications.append((name, sum(m.shape.bytes for m in members), tuple(bucket)))
        is_bucket.append(True)
    for instr in module.instructions():
        if instr.opcode in ALL_REDUCE_OPCODES and id(instr) not in task_of:
            task_of[id(instr)] = kernel_count + len(communications)
            communications.append((instr.name, instr.shape.bytes, (instr.name,)))
            is_bucket.append(False)

    callers_operand = _parameter_sources(module)
    memo: dict[int, frozenset[int]] = {}

    def upstream_tasks(node: Instruction) -> frozenset[int]:
        """Tasks that `node`'s value waits for (node itself if it is a task)."""
        found: set[int] = set()
        stack = [node]
        seen: set[int] = set()
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            task = task_of.get(id(current))
            if task is not None:
                found.add(task)
                continue
            if id(current) in memo:
                found |= memo[id(current)]
                continue
            stack.extend(_inputs(current, callers_operand))
        result = frozenset(found)
        memo[id(node)] = result
        return result

    dependencies: list[set[int]] = [set() for _ in range(kernel_count + len(communications))]
    for instr in module.instructions():
        task = task_of.get(id(instr))
        if task is None:
            continue
        for source in _inputs(instr, callers_operand):
            dependencies[task] |= upstream_tasks(source)
    for task, deps in enumerate(dependencies):
        deps.discard(task)

    order = _kernel_order(groups, dependencies, kernel_count, module)
    renumber = {old: new for new, old in enumerate(order)}
    renumber.update({t: t for t in range(kernel_count, len(dependencies))})
    kernels = [_kernel(groups[old], task_of, old) for old in order]
    ordered_dependencies = [sorted(renumber[d] for d in dependencies[old]) for old in order]
    ordered_dependencies += [
        sorted(renumber[d] for d in dependencies[t]) for t in range(kernel_count, len(dependencies))
    ]
    return TaskGraph(kernels, communications, ordered_dependencies, is_bucket)


def _parameter_sources(module: HloModule) -> dict[int, list[Instruction]]:
    """For each parameter of a called computation, the call operands feeding it."""
    sources: dict[int, list[Instruction]] = {}
    for computation in module.computations:
        for caller in computation.callers:
            if caller.opcode not in CONTROL_CALLS:
                continue
            for instr in computation.instructions:
                if instr.opcode == "parameter":
                    number = instr.proto.parameter_number
                    operands = (
                        caller.operands[1:] if caller.opcode == "conditional" else caller.operands
                    )
                    if number < len(operands):
                        sources.setdefault(id(instr), []).append(operands[number])
    return sources


def _inputs(instr: Instruction, parameter_sources) -> list[Instruction]:
    inputs = instr.operands + instr.control_predecessors
    if instr.opcode == "parameter":
        inputs = inputs + parameter_sources.get(id(instr), [])
    elif instr.opcode in CONTROL_CALLS:
        inputs = inputs + [c.root for c in instr.called_computations]
    return inputs


def _kernel_order(groups, dependencies, kernel_count, module) -> list[int]:
    """A topological order of the kernels (communication tasks are transparent:
    a kernel after a bucket waits for the bucket's producers). Among ready kernels,
    those that do not wait on communication go first, as a latency-hiding
    scheduler would order them; ties by position in the module."""
    position = {}
    counter = 0
    for computation in module.computations:
        for instr in computation.topological_order:
            position[id(instr)] = counter
            counter += 1
    first = [min(position[id(i)] for i in members) for members in groups]
    kernel_deps: list[set[int]] = []
    for task in range(kernel_count):
        resolved: set[int] = set()
        stack = list(dependencies[task])
        while stack:
            dep = stack.pop()
            if dep < kernel_count:
                resolved.add(dep)
            else:
                stack.extend(d for d in dependencies[dep] if d not in resolved)
        kernel_deps.append(resolved)
    users: list[list[int]] = [[] for _ in range(kernel_count)]
    waiting = [len(deps) for deps in kernel_deps]
    for task, deps in enumerate(kernel_deps):
        for dep in deps:
            users[dep].append(task)
    waits_on_comm = [any(d >= kernel_count for d in dependencies[t]) for t in range(kernel_count)]

    def key(task: int) -> tuple[bool, int, int]:
        return waits_on_comm[task], first[task], task

    ready = [key(t) for t in range(kernel_count) if waiting[t] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        *_, task = heapq.heappop(ready)
        order.append(task)
        for user in users[task]:
            waits_on_comm[user] = waits_on_comm[user] or waits_on_comm[task]
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, key(user))
    if len(order) != kernel_count:
        raise ValueError("the plan's kernels have a cycle; run verify_plan first")
    return order


def _kernel(members: list[Instruction], task_of: dict[int, int], task: int) -> Kernel:
    inside = {id(i) for i in members}
    read: dict[int, int] = {}
    written = 0
    for instr in members:
        for operand in instr.operands:
            if id(operand) not in inside:
                read[id(operand)] = operand.shape.bytes
        if not instr.users or any(id(u) not in inside for u in instr.users):
            written += instr.shape.bytes
    largest = max(members, key=lambda i: i.shape.bytes)
    leaves = largest.shape.leaves()
    opcodes = {i.opcode for i in members}
    op_class = next(
        (kind for kind in ("convolution", "dot") if kind in opcodes),
        "reduce" if opcodes & {"reduce", "reduce-window"} else "elementwise",
    )
    return Kernel(
        name=members[0].name,
        instructions=members,
        flops=sum(i.flops for i in members),
        bytes_in=sum(read.values()),
        bytes_out=written,
        element_type=leaves[0].element_type if leaves else "f32",
        op_class=op_class,
    )
