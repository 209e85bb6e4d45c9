"""From a module and a plan to the task graph the simulator runs.

A task is a kernel (one op-fusion group of the plan, once per call of its
computation), a bucket (one concatenated all-reduce of several gradients), or
another collective (an all-reduce that is not a gradient, such as the loss mean,
or a collective of another kind: all-gather, reduce-scatter, all-to-all, permute).

Dependencies pass through instructions that are no work of their own
(parameters, tuples, calls): a called computation's parameters depend on the
call's operands, and the call's users on the callee's root, so the body of a
pmap'd step is linked to its caller. A computation called from several places
(JAX's `jit(relu)`, for one) runs once per call: each call site gets its own
instance of the computation's kernels, told apart by the chain of call sites
("call key").

Kernel order: the compute stream runs the kernels in a topological order (Kahn's
algorithm). When several kernels are ready, those that read no all-reduce result
go first, as a latency-hiding scheduler would run them; among those that do, the
ones whose all-reduces are fed earliest in the module go first (the optimizer
update of the gradient computed first, whose communication ends first); then the
one whose fusion group comes first in the plan (instances of one group by call
site). The order of a plan's fusion groups is therefore its scheduling priority. For the order, a
kernel that reads an all-reduce result waits for the kernels that produced that
gradient (not for the rest of its bucket), so the order does not change with the
buckets; the simulator then makes it wait for its whole bucket.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from disco_xla.hlo.custom_calls import library_call_kind
from disco_xla.hlo.flops import computed_instructions
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.plan import Plan
from disco_xla.simulator.graph_steps import (
    COMMUNICATION,
    GRAPH,
    KERNELS,
    STEPS_BY_STAGE,
    CommunicationTasks,
    GraphParts,
)
from disco_xla.simulator.module_index import ModuleIndex, module_index
from disco_xla.simulator.plan_kernels import (
    bucket_waits,
    kernel_order,
    module_collectives,
    order_priorities,
)

# The roofline class of each kind of library call: what bounds it.
_LIBRARY_CLASS = {
    "gemm": "dot",
    "convolution": "convolution",
    "attention-forward": "dot",
    "attention-backward": "dot",
    "other": "elementwise",
}


@dataclass(frozen=True)
class Kernel:
    """One fused kernel: its instructions and what the roofline needs of them.
    Frozen: the module's index hands one Kernel to every task graph that has
    its group (`ModuleIndex.kernel`)."""

    name: str
    instructions: list[Instruction]
    flops: int
    bytes_in: int  # distinct operands read from outside the kernel
    bytes_out: int  # results used outside the kernel
    element_type: str  # what its FLOPs are priced at (`priced_element_type`)
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
            before, after = _signature(instr)
            parts.append(f"{before}{operands}{after}")
        return hashlib.sha1("|".join(parts).encode()).hexdigest()


def _signature(instr: Instruction) -> tuple[str, str]:
    """The text before and after the operands in `instr`'s part of a structural
    hash: opcode and shape, then attributes. Kept beside the module by
    instruction id (`HloModule.analyses`; the module's view holds its
    instructions, so an id is not reused while the entry lives)."""
    signatures = instr.computation.module.analyses.get(_signature, dict)
    found = signatures.get(id(instr))
    if found is not None:
        return found
    proto = instr.proto
    dot = proto.dot_dimension_numbers
    attributes = (
        list(proto.dimensions),
        list(dot.lhs_contracting_dimensions),
        list(dot.rhs_contracting_dimensions),
        [(w.size, w.stride) for w in proto.window.dimensions],
    )
    if instr.opcode in ("dot", "convolution"):
        # Two products of equal shapes may still differ in what they compute (a
        # convolution's dimension labels, its groups, a dot's batch dimensions).
        conv = proto.convolution_dimension_numbers
        attributes += (
            list(dot.lhs_batch_dimensions),
            list(dot.rhs_batch_dimensions),
            [conv.input_batch_dimension, conv.input_feature_dimension],
            list(conv.input_spatial_dimensions),
            [conv.kernel_input_feature_dimension, conv.kernel_output_feature_dimension],
            list(conv.kernel_spatial_dimensions),
            [conv.output_batch_dimension, conv.output_feature_dimension],
            list(conv.output_spatial_dimensions),
            [proto.feature_group_count, proto.batch_group_count],
        )
    found = signatures[id(instr)] = (f"{instr.opcode}:{instr.shape}:", f":{attributes}")
    return found


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
    # Per communication task: the bytes of each tensor of a tuple all-reduce
    # (several tensors sent by one instruction, without concatenation), or () for
    # one message. Missing entries mean one message.
    tuple_element_bytes: list[tuple[int, ...]] = field(default_factory=list)
    # True when each collective runs in line with the kernels: the compute stream
    # waits for it to finish, as under XLA:GPU without its latency-hiding scheduler.
    collectives_block_compute: bool = False
    # How many times each kernel and each communication task runs in one step:
    # more than once inside a `while` body (`ModuleIndex.runs`). The simulator
    # runs such a task once, for its count times its duration. Missing entries
    # mean once.
    kernel_runs: list[int] = field(default_factory=list)
    communication_runs: list[int] = field(default_factory=list)
    # Per communication task: the collective's kind (`collectives.collective_kind`);
    # missing entries are all-reduces (every gradient bucket is one).
    communication_kinds: list[str] = field(default_factory=list)
    # Per communication task: (one device group, the devices of all its groups)
    # when its groups split the devices (`comm.group_profile`); missing entries
    # span every device.
    communication_groups: list[tuple[tuple[int, ...], int]] = field(default_factory=list)
    # Per kernel: the share of its fusion group's work it does, below 1 for a
    # chunk of a kernel split with a chunked collective (`chunks`); missing
    # entries are 1.
    kernel_shares: list[float] = field(default_factory=list)
    # Per kernel: the bytes copied around its chunks (`chunks`: the slices
    # before them, the concatenations after), read and written once; missing
    # entries are 0.
    kernel_copy_bytes: list[float] = field(default_factory=list)

    def communication_kind(self, communication: int) -> str:
        kinds = self.communication_kinds
        return kinds[communication] if communication < len(kinds) else "all-reduce"

    def communication_group(self, communication: int) -> tuple[tuple[int, ...], int]:
        groups = self.communication_groups
        return groups[communication] if communication < len(groups) else ((), 0)

    def tuple_elements(self, communication: int) -> tuple[int, ...]:
        """The tensor sizes of communication task `communication` if it is a tuple
        all-reduce, else ()."""
        elements = self.tuple_element_bytes
        return elements[communication] if communication < len(elements) else ()

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
        return kernel_arrays(self.kernels)


def kernel_arrays(kernels: list[Kernel]) -> KernelArrays:
    """The figures batched cost models read, for `kernels`."""
    element_types = sorted({k.element_type for k in kernels})
    op_classes = sorted({k.op_class for k in kernels})
    type_index = {t: n for n, t in enumerate(element_types)}
    class_index = {c: n for n, c in enumerate(op_classes)}
    return KernelArrays(
        flops=np.array([k.flops for k in kernels], dtype=np.float64),
        bytes=np.array([k.bytes for k in kernels], dtype=np.float64),
        element_types=element_types,
        element_type_index=np.array([type_index[k.element_type] for k in kernels], int),
        op_classes=op_classes,
        op_class_index=np.array([class_index[k.op_class] for k in kernels], int),
    )


def _shape_bytes(instr: Instruction) -> int:
    return instr.shape.bytes


def _read_bytes(instr: Instruction, number: int, size) -> int:
    """What `instr` reads of its operand `number`: all of it, except the
    buffer a dynamic-update-slice updates in place (nothing of it) and the
    array a dynamic-slice reads a slice of (the slice)."""
    if number == 0 and instr.opcode == "dynamic-update-slice":
        return 0
    if number == 0 and instr.opcode == "dynamic-slice":
        return size(instr)
    return size(instr.operands[number])


def _written_bytes(instr: Instruction, size) -> int:
    """What `instr` writes: its result, or, for a dynamic-update-slice (in
    place), the update alone."""
    if instr.opcode == "dynamic-update-slice" and len(instr.operands) > 1:
        return size(instr.operands[1])
    return size(instr)


def kernel_for(
    members: list[Instruction], name: str | None = None, index: ModuleIndex | None = None
) -> Kernel:
    """The Kernel of one fusion group's instructions (`index`: the module's, to
    reuse its per-instruction bytes and FLOPs)."""
    if index is None:
        size = _shape_bytes
        flops = sum(i.flops for i in members)
    else:
        size = index.bytes_of
        flops = sum(index.flops_of(i) for i in members)
    inside = {id(i) for i in members}
    read: dict[int, int] = {}
    written = 0
    for instr in members:
        for number, operand in enumerate(instr.operands):
            if id(operand) not in inside:
                read[id(operand)] = max(read.get(id(operand), 0), _read_bytes(instr, number, size))
        if not instr.users or any(id(u) not in inside for u in instr.users):
            written += _written_bytes(instr, size)
    opcodes = {i.opcode for i in members}
    if "custom-call" in opcodes:  # `custom_calls`: alone in its kernel
        opcodes = {_LIBRARY_CLASS[library_call_kind(i)] for i in members}
    op_class = next(
        (kind for kind in ("convolution", "dot") if kind in opcodes),
        "reduce" if opcodes & {"reduce", "reduce-window"} else "elementwise",
    )
    return Kernel(
        name=name or members[0].name,
        instructions=members,
        flops=flops,
        bytes_in=sum(read.values()),
        bytes_out=written,
        element_type=priced_element_type(members, size),
        op_class=op_class,
    )


def priced_element_type(members: list[Instruction], size=_shape_bytes) -> str:
    """The element type a kernel's FLOPs are priced at: what it computes. A
    kernel with dots or convolutions runs at their input type's rate (the
    largest product's left operand), whatever else it holds; a bf16 dot
    fused with an f32 epilogue is a bf16 GEMM. Otherwise the type of its
    largest result."""
    products = [
        i
        for i in computed_instructions(members)
        if i.opcode in ("dot", "convolution") and i.operands
    ]
    if products:
        largest = max(products, key=lambda i: i.flops)
        leaves = largest.operands[0].shape.leaves()
    else:
        leaves = max(members, key=size).shape.leaves()
    return leaves[0].element_type if leaves else "f32"


def build_task_graph(
    module: HloModule,
    plan: Plan,
    tuple_buckets: bool = False,
    collectives_block_compute: bool = False,
) -> TaskGraph:
    """The tasks of `plan` on `module` (the plan must have passed `verify_plan`).

    A bucket of several gradients is sent as one concatenated message (what the
    rewrite makes), or, with `tuple_buckets`, as a tuple all-reduce (what XLA's
    own combiner makes). An all-reduce instruction of tuple shape, as in a module
    XLA compiled, is always a tuple all-reduce. With `collectives_block_compute`
    the compute stream waits for each collective (`TaskGraph`). Each plan
    dimension adds its part through its row of `graph_steps.GRAPH_STEPS`."""
    parts = GraphParts(module, module_index(module), plan, tuple_buckets)
    _run_stage(parts, KERNELS)
    index, plan_kernel_parts = parts.index, parts.kernels
    instances = plan_kernel_parts.instances
    kernel_count = len(instances)
    task_of_atom = dict(plan_kernel_parts.kernel_of_atom)
    comms = parts.communication = CommunicationTasks(index, kernel_count, task_of_atom)
    _run_stage(parts, COMMUNICATION)
    collectives = module_collectives(index)
    dependencies = _task_dependencies(index, task_of_atom, kernel_count + len(comms.communications))
    for later, first in comms.later_trips_of.items():
        dependencies[later] = set(dependencies[first])
    order = kernel_order(
        order_priorities(plan_kernel_parts, len(plan.fusion_groups)),
        bucket_waits(
            plan_kernel_parts, plan.all_reduce_buckets, collectives.gradient_info, parts.others
        ),
    )
    kernels, kernel_runs = [], []
    for old in order:
        group, key = instances[old]
        names = tuple(plan.fusion_groups[group])
        label = names[0] + (f"@{key[-1]}" if key else "")
        kernels.append(group_kernel(index, names, label))
        kernel_runs.append(plan_kernel_parts.parts[old].runs)
    graph = TaskGraph(
        kernels,
        comms.communications,
        _in_kernel_order(dependencies, order, kernel_count),
        comms.is_bucket,
        comms.tuple_element_bytes,
        collectives_block_compute,
        kernel_runs,
        comms.runs,
        comms.kinds,
        comms.groups,
    )
    for step in STEPS_BY_STAGE[GRAPH]:
        graph = step.split(graph, parts)
    return graph


def _run_stage(parts: GraphParts, stage: str) -> None:
    """Each dimension's step of `stage` (`graph_steps.STEPS_BY_STAGE`)."""
    for step in STEPS_BY_STAGE[stage]:
        step.add(parts)


def _in_kernel_order(dependencies: list[set[int]], order: list[int], kernels: int) -> list:
    """Each task's dependencies once the kernels are renumbered in `order`;
    the communication tasks keep their numbers, after the kernels."""
    renumber = {old: new for new, old in enumerate(order)}
    renumber.update({t: t for t in range(kernels, len(dependencies))})
    tasks = [*order, *range(kernels, len(dependencies))]
    return [sorted(renumber[d] for d in dependencies[t]) for t in tasks]


def _task_dependencies(
    index: ModuleIndex, task_of_atom: dict[int, int], tasks: int
) -> list[set[int]]:
    """The tasks each task reads."""
    dependencies: list[set[int]] = [set() for _ in range(tasks)]
    for atom, task in task_of_atom.items():
        deps = dependencies[task]
        for source in index.inputs[atom]:
            deps.add(task_of_atom[source])
    for task, deps in enumerate(dependencies):
        deps.discard(task)
    return dependencies


def group_kernel(index: ModuleIndex, group: tuple[str, ...], label: str) -> Kernel:
    """`kernel_for` the group's instructions, named `label`, built once per
    module: the plans a search compares differ in a few groups, and building
    each plan's kernels afresh was half of building its task graph."""
    found = index.kernels_built.get((group, label))
    if found is None:
        members = [index.by_name[name] for name in group]
        found = index.kernels_built[(group, label)] = kernel_for(members, label, index)
    return found
