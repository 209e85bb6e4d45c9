"""XLA's fusion without XLA: a model of its producer-consumer fusion rules, for
a module XLA cannot compile on this host (a GPU job's dump with cuDNN, cuBLAS
or Transformer Engine calls) when no dump of XLA's own kernels is given.

`modelled_xla_fusion` follows XLA:GPU's instruction fusion, in small:

- a producer fuses into its consumer when the consumer is its only user (XLA
  also duplicates cheap producers into several consumers; a plan places each
  instruction in one kernel, so such a producer stays a kernel of its own);
- nothing fuses into or out of a library op: a dot or convolution (a cuBLAS or
  cuDNN call on GPU) and a library call (`hlo.custom_calls`) stay kernels of
  their own;
- a reduction is a kernel's root: its producers fuse into it (XLA's input
  fusion), and it fuses into none of its consumers; so are scatters and sorts;
- fusion stays within one computation.

`benchmarks/fusion_model_agreement.py` measures how often the model agrees with
XLA:CPU's real fusion on the zoo. `greedy_fusion_plan`, the search's own
XLA-like start, is the same producer-consumer walk with looser rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.plan import Plan, compute_instructions, fusion_weight

# Producers that are a kernel's root in XLA's fusion: they fuse into no consumer.
ROOT_OPCODES = frozenset({"reduce", "reduce-window", "scatter", "sort", "select-and-scatter"})
# Consumers that move no data of their own: a reshape or bitcast of a result.
FREE_OPCODES = frozenset({"reshape", "bitcast", "broadcast"})
# What a dot's or convolution's output feeds within its kernel (a GEMM epilogue:
# layout, bias, scale, activation).
OUTPUT_FUSION_OPCODES = frozenset(
    {"transpose", "reshape", "bitcast", "add", "multiply", "convert", "maximum", "tanh"}
)
# may_fuse(producer, consumer, fusion weight of both groups together).
FusionRule = Callable[[Instruction, Instruction, int], bool]


def modelled_xla_fusion(module: HloModule) -> Plan:
    """The module's fusion groups by the model's rules (the module docstring),
    one all-reduce per gradient."""
    return producer_consumer_fusion(module, _xla_rule, users_in_one_group=True)


def _xla_rule(producer: Instruction, consumer: Instruction, weight: int) -> bool:
    if producer.opcode in ROOT_OPCODES:  # a root: only a free reshape follows it
        return weight == 0 and consumer.opcode in FREE_OPCODES
    if fusion_weight(producer) == 1:  # a dot's or convolution's output fusion
        return weight == 1 and consumer.opcode in OUTPUT_FUSION_OPCODES
    return weight == 0


def producer_consumer_fusion(
    module: HloModule, may_fuse: FusionRule, users_in_one_group: bool = False
) -> Plan:
    """Each compute instruction joins the group of its only user where
    `may_fuse` allows it, consumers first; with `users_in_one_group`, also the
    group that holds all its users (the kernel XLA would duplicate it into, or
    fuse it beside its siblings in). Gradients one per all-reduce. The group
    joined holds every user and only instructions later in the order, so no
    other path leads back from it and the groups stay acyclic."""
    compute = compute_instructions(module)
    group_of = {id(i): n for n, i in enumerate(compute)}
    members: dict[int, list] = {n: [i] for n, i in enumerate(compute)}
    weight = {n: fusion_weight(i) for n, i in enumerate(compute)}
    for instr in reversed(compute):  # consumers before producers
        if not instr.users or any(id(u) not in group_of for u in instr.users):
            continue
        if len(instr.users) != 1 and not (
            users_in_one_group and len({group_of[id(u)] for u in instr.users}) == 1
        ):
            continue
        mine, theirs = group_of[id(instr)], group_of[id(instr.users[0])]
        if mine == theirs or not may_fuse(instr, instr.users[0], weight[mine] + weight[theirs]):
            continue
        for moved in members.pop(mine):
            group_of[id(moved)] = theirs
            members[theirs].append(moved)
        weight[theirs] += weight.pop(mine)
    position = {id(i): n for n, i in enumerate(compute)}
    groups = sorted(
        (
            tuple(i.name for i in sorted(group, key=lambda i: position[id(i)]))
            for group in members.values()
        ),
        key=lambda g: g[0],
    )
    return replace(Plan.unfused(module), fusion_groups=tuple(groups))


def fusion_agreement(module: HloModule, first: Plan, second: Plan) -> dict[str, float]:
    """How far two plans' fusion agree, over the data edges between compute
    instructions of one computation: `edges` (their count), `agreement` (the
    share both fuse or both cut), and `fused_agreement` (of the edges either
    fuses, the share both do: it ignores the many edges both cut)."""
    compute = compute_instructions(module)
    inside = {id(i) for i in compute}
    group_a = {name: n for n, group in enumerate(first.fusion_groups) for name in group}
    group_b = {name: n for n, group in enumerate(second.fusion_groups) for name in group}
    edges = same = either = both = 0
    for instr in compute:
        for operand in instr.operands:
            if id(operand) not in inside:
                continue
            fused_a = group_a[operand.name] == group_a[instr.name]
            fused_b = group_b[operand.name] == group_b[instr.name]
            edges += 1
            same += fused_a == fused_b
            either += fused_a or fused_b
            both += fused_a and fused_b
    return {
        "edges": edges,
        "agreement": same / edges if edges else 1.0,
        "fused_agreement": both / either if either else 1.0,
    }
