"""The fusion dimension: which compute instructions run as one kernel
(`Plan.fusion_groups`, a partition of the compute instructions).

A group lies in one computation, holds at most one dot or convolution (a
library call is a kernel by itself), and contracting every group to one node
leaves the program acyclic, so fusing creates no cycle. Realised by
`hlo_passes.fusion_boundaries`, which gives a boundary only to the groups XLA
would not form by itself (`departing_groups`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING

from disco_xla.hlo.custom_calls import is_library_call
from disco_xla.hlo.graph import (
    COLLECTIVE_DONE_OPCODES,
    COLLECTIVE_OPCODES,
    HloModule,
    Instruction,
)
from disco_xla.plan.dimension import Dimension, Verification, as_lists, names_in_groups

if TYPE_CHECKING:
    from disco_xla.plan.core import Plan

# Instructions that are never part of a fused kernel: inputs, plumbing, control
# flow, markers and collectives. Everything else in program code is a compute
# instruction and belongs to exactly one fusion group.
NOT_FUSIBLE_OPCODES = frozenset(
    {
        "parameter",
        "constant",
        "bitcast",  # a view: no kernel of its own
        "tuple",
        "get-tuple-element",
        "after-all",
        "call",
        "while",
        "conditional",
        "custom-call",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "infeed",
        "outfeed",
        "send",
        "send-done",
        "recv",
        "recv-done",
    }
    | COLLECTIVE_OPCODES
    | COLLECTIVE_DONE_OPCODES
)
# Ops that become a library call or a large loop nest; one per kernel by default.
EXPENSIVE_OPCODES = frozenset({"dot", "convolution"})


def is_compute(instr: Instruction) -> bool:
    """Whether a plan places `instr` in a fusion group: a compute instruction, or
    a library call (a custom call that computes, alone in its group)."""
    return instr.opcode not in NOT_FUSIBLE_OPCODES or is_library_call(instr)


def fusion_weight(instr: Instruction) -> int:
    """How much of a kernel's one library op `instr` takes, where a kernel of
    several instructions holds at most 1: a dot or convolution 1, a library
    call 2 (it is a kernel by itself, and nothing joins it), anything else 0."""
    if instr.opcode in EXPENSIVE_OPCODES:
        return 1
    return 2 if instr.opcode == "custom-call" and is_library_call(instr) else 0


def compute_instructions(module: HloModule) -> list[Instruction]:
    """The instructions a plan must place in fusion groups, in topological order."""
    return [
        instr
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.topological_order
        if is_compute(instr)
    ]


def needs_boundary(
    members: Sequence[Instruction], left_to_xla: AbstractSet[frozenset[str]]
) -> bool:
    """Whether a fusion group of `members` gets a kernel boundary when the plan
    is realised (`hlo_passes.fusion_boundaries`): XLA does not form it by itself
    (it is not in `left_to_xla`, XLA's own groups as sets of names), and it holds
    no library op (convolution, dot, library call), which stays in the caller."""
    return frozenset(m.name for m in members) not in left_to_xla and not any(
        fusion_weight(m) for m in members
    )


def departing_groups(
    module: HloModule, plan: Plan, left_to_xla: Iterable[tuple[str, ...]] | None
) -> list[tuple[str, ...]]:
    """The plan's groups that get a kernel boundary (`needs_boundary`); with
    `left_to_xla` None, every group without a library op."""
    by_name = {i.name: i for i in module.instructions()}
    own = {frozenset(g) for g in left_to_xla} if left_to_xla is not None else set()
    return [g for g in plan.fusion_groups if needs_boundary([by_name[n] for n in g], own)]


def check(plan: Plan, verification: Verification) -> None:
    """The groups partition the compute instructions, each in one computation
    with at most `max_expensive_ops_per_kernel` dots or convolutions and no
    library call beside other members; contracting them leaves the program
    acyclic."""
    _check_groups(plan, verification)
    _check_contracted_graph_acyclic(plan, verification)


def _check_groups(plan: Plan, verification: Verification) -> None:
    compute = compute_instructions(verification.module)
    expected = {id(i) for i in compute}
    group_of = verification.group_of
    fail = verification.fail
    for index, group in enumerate(plan.fusion_groups):
        if not group:
            raise fail(f"fusion group {index} is empty")
        members = []
        for name in group:
            instr = verification.by_name.get(name)
            if instr is None:
                raise fail(f"fusion group {index}: no instruction {name!r}")
            if id(instr) not in expected:
                raise fail(f"fusion group {index}: {name!r} ({instr.opcode}) cannot be fused")
            if id(instr) in group_of:
                raise fail(f"{name!r} is in fusion groups {group_of[id(instr)]} and {index}")
            group_of[id(instr)] = index
            members.append(instr)
        _check_members(index, members, verification)
    missing = [i.name for i in compute if id(i) not in group_of]
    if missing:
        raise fail(
            f"{len(missing)} compute instructions are in no fusion group, e.g. {missing[0]!r}"
        )


def _check_members(index: int, members: list[Instruction], verification: Verification) -> None:
    """One group's members: one computation, a library call alone, and at
    most the allowed dots or convolutions."""
    fail = verification.fail
    if len({id(m.computation) for m in members}) > 1:
        raise fail(f"fusion group {index} spans several computations")
    library_calls = [m.name for m in members if fusion_weight(m) > 1]
    if library_calls and len(members) > 1:
        raise fail(
            f"fusion group {index} joins the library call {library_calls[0]!r} with other "
            "instructions; a library call is a kernel by itself"
        )
    expensive = sum(m.opcode in EXPENSIVE_OPCODES for m in members)
    limit = verification.max_expensive_ops_per_kernel
    if expensive > limit:
        raise fail(
            f"fusion group {index} has {expensive} dots/convolutions; at most {limit} per kernel"
        )


def _check_contracted_graph_acyclic(plan: Plan, verification: Verification) -> None:
    """Kahn's algorithm on the graph where each group is one node."""
    group_of = verification.group_of
    for computation in verification.module.computations:
        if computation.role not in ("entry", "program"):
            continue
        node_of = {
            id(i): ("group", group_of[id(i)]) if id(i) in group_of else ("single", id(i))
            for i in computation.instructions
        }
        successors: dict[tuple, set] = defaultdict(set)
        indegree: dict[tuple, int] = dict.fromkeys(node_of.values(), 0)
        for instr in computation.instructions:
            for dep in instr.operands + instr.control_predecessors:
                a, b = node_of[id(dep)], node_of[id(instr)]
                if a != b and b not in successors[a]:
                    successors[a].add(b)
                    indegree[b] += 1
        ready = [node for node, degree in indegree.items() if degree == 0]
        seen = 0
        while ready:
            node = ready.pop()
            seen += 1
            for successor in successors[node]:
                indegree[successor] -= 1
                if indegree[successor] == 0:
                    ready.append(successor)
        if seen != len(indegree):
            stuck = sorted(n[1] for n, d in indegree.items() if d > 0 and n[0] == "group")
            where = (
                f"fusion group {stuck[0]} ({', '.join(plan.fusion_groups[stuck[0]][:3])})"
                if stuck
                else f"computation {computation.name!r}"
            )
            raise verification.fail(f"{where} is not convex: fusing it would create a cycle")


FUSION = Dimension(
    name="fusion",
    field="fusion_groups",
    meaning="which compute instructions run as one kernel",
    read=lambda data: names_in_groups(data, "fusion_groups", required=True),
    write=as_lists,
    check=check,
    describe=lambda plan: None,  # the table's kernels column
    always_written=True,
)
