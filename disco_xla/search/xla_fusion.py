"""XLA's own kernel grouping, expressed as fusion groups over the captured module.

The baselines `xla`, `xla-nocombine`, `horovod`, `ddp` and `mgwfbp` all use the
fusion XLA chose when it compiled the step. XLA compiles the captured
(pre-optimisation) module into a different module: instructions are renamed,
simplified, duplicated into several fusions or removed. To search from XLA's
choice, and to compare every plan over one module, this maps XLA's kernels back
to the captured instructions:

1. Each kernel of the compiled module (a fusion, or a lone compute instruction)
   is described by the `(op_name, opcode)` of every instruction inside it. The
   captured module's `metadata.op_name` is the same path without the outer
   `jit(...)/shard_map/` prefix; inside a called computation it is relative to the
   call, so the caller's op_name is put in front.
2. A captured instruction's candidates are the kernels holding an instruction
   with its key (several when XLA duplicated it), else with its `op_name` alone.
3. An instruction with no candidate (a reshape XLA turned into a bitcast, a
   broadcast folded away) joins its producer's kernel, else its users' earliest
   candidate.
4. Legality by construction: kernels are numbered in the compiled schedule order,
   and one pass over each computation in topological order keeps every edge
   going from a lower number to a higher or equal one (equal only inside a
   group, and strictly higher across an instruction that is no kernel). An
   instruction with no such choice, or a second dot or convolution in a kernel,
   gets a new kernel of its own numbered after its inputs. Groups whose numbers
   never decrease along an edge contract to an acyclic graph, so the plan passes
   `verify_plan`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import NamedTuple

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.plan import (
    NOT_FUSIBLE_OPCODES,
    Plan,
    compute_instructions,
    fusion_weight,
    verify_plan,
)

# A kernel number: (position in XLA's schedule, tie-breaker for kernels we add).
KernelLabel = tuple[int, int]
# A candidate kernel more than this many kernels after the instruction's latest
# producer is a copy XLA made elsewhere (a forward value recomputed in the
# backward pass), not where the instruction itself went.
CANDIDATE_REACH = 16


def full_op_name(instr: Instruction) -> str:
    """The instruction's op_name as a path from the step's top: inside a called
    computation (one with a single kind of caller) the caller's op_name is prefixed."""
    name = instr.op_name
    computation = instr.computation
    seen = 0
    while computation.callers and seen < 8:
        caller = computation.callers[0]
        if caller.opcode != "call" or not caller.op_name:
            break
        name = f"{caller.op_name}/{name}" if name else caller.op_name
        computation = caller.computation
        seen += 1
    return name


def _compiled_kernels(compiled: HloModule) -> list[list[tuple[str, str]]]:
    """For each kernel of the compiled module, in schedule order, the
    (op_name, opcode) of every instruction it computes."""
    kernels = []
    for instr in compute_instructions(compiled):
        inside: list[tuple[str, str]] = []
        stack = [instr]
        while stack:
            current = stack.pop()
            if current.opcode == "fusion":
                for called in current.called_computations:
                    stack.extend(reversed(called.topological_order))
                continue
            if current.opcode in NOT_FUSIBLE_OPCODES and current is not instr:
                continue
            inside.append((current.op_name, current.opcode))
        kernels.append(inside)
    return kernels


def _strip_prefix(op_name: str, known: set[str], cache: dict[str, str | None]) -> str | None:
    """The captured op_name `op_name` stands for: the compiled one with its first
    path components dropped (`jit(_fun)/shard_map/...`), whichever is known."""
    if op_name in cache:
        return cache[op_name]
    parts = op_name.split("/")
    found = None
    for start in range(min(len(parts), 4)):
        candidate = "/".join(parts[start:])
        if candidate in known:
            found = candidate
            break
    cache[op_name] = found
    return found


class KernelCandidates(NamedTuple):
    """For each captured compute instruction that XLA's kernels account for, the
    kernels (indices in the compiled schedule, ascending) that hold an instruction
    with its op_name and opcode, or failing that its op_name alone (`kernels`).
    XLA may have copied one instruction into several kernels, hence a list. One
    op_name can also stand for many instructions (an optimizer's update, mapped
    over every parameter, has the same op_name for each): `capacity` counts, per
    (kernel, what was matched), how many compiled instructions a kernel holds, so
    that each kernel takes no more captured instructions than that (`matched`
    says what was matched for each instruction)."""

    kernels: dict[str, list[int]]
    matched: dict[str, tuple]
    capacity: dict[tuple[int, tuple], int]


def xla_kernel_candidates(captured: HloModule, compiled: HloModule) -> KernelCandidates:
    """Where XLA's kernels put each captured compute instruction (`KernelCandidates`)."""
    compute = compute_instructions(captured)
    names = {id(i): full_op_name(i) for i in compute}
    known = set(names.values())
    by_key: dict[tuple[str, str], set[int]] = defaultdict(set)
    by_name: dict[str, set[int]] = defaultdict(set)
    capacity: dict[tuple[int, tuple], int] = defaultdict(int)
    cache: dict[str, str | None] = {}
    for index, inside in enumerate(_compiled_kernels(compiled)):
        for op_name, opcode in inside:
            name = _strip_prefix(op_name, known, cache)
            if name:
                by_key[(name, opcode)].add(index)
                by_name[name].add(index)
                capacity[(index, (name, opcode))] += 1
                capacity[(index, (name,))] += 1
    kernels, matched = {}, {}
    for instr in compute:
        name = names[id(instr)]
        key = (name, instr.opcode)
        found = by_key.get(key)
        if not found:
            key = (name,)
            found = by_name.get(name)
        if found:
            kernels[instr.name] = sorted(found)
            matched[instr.name] = key
    return KernelCandidates(kernels, matched, dict(capacity))


class _InputBound(NamedTuple):
    """What limits the kernel an instruction may join (`_fits`): the highest
    kernel among its compute inputs, the highest label among its other inputs,
    and its own `plan.fusion_weight` (1: a dot or convolution; 2: a library call,
    a kernel by itself)."""

    from_kernels: KernelLabel
    from_others: KernelLabel
    weight: int


# Below every kernel: the bound of an instruction with no inputs.
_BEFORE_ALL_KERNELS: KernelLabel = (-1, 0)


def _fits(label: KernelLabel, bound: _InputBound, expensive) -> bool:
    """Whether an instruction may join kernel `label`: no lower than its kernel
    operands, above its other inputs, one dot or convolution at most, and no
    library call (`expensive`: the fusion weight each kernel holds)."""
    from_kernels, from_others, weight = bound
    return (
        label >= from_kernels
        and label > from_others
        and expensive[label] <= 1
        and not (weight and expensive[label] >= 1)
    )


def xla_fusion_groups(captured: HloModule, compiled: HloModule) -> tuple[tuple[str, ...], ...]:
    """Fusion groups over `captured` that follow the kernels of `compiled` (the same
    step as XLA compiled it), legal for `verify_plan` by construction.

    One pass over each computation in topological order gives every instruction a
    kernel number no lower than its operands' (step 4): the kernel of one of its
    producers when XLA put it there, else the earliest of its candidate kernels
    that keeps the numbers rising; an instruction without candidates joins its
    producer (a reshape XLA made a bitcast) or its users' earliest candidate (a
    broadcast folded into its users)."""
    found = xla_kernel_candidates(captured, compiled)
    taken: dict[tuple[int, tuple], int] = defaultdict(int)
    is_compute = {id(i) for i in compute_instructions(captured)}
    fresh = 0
    members: dict[tuple, list[str]] = {}
    for computation in captured.computations:
        if computation.role not in ("entry", "program"):
            continue
        label_of: dict[int, KernelLabel] = {}
        expensive: dict[KernelLabel, int] = defaultdict(int)
        for instr in computation.topological_order:
            producer_labels, bound = _input_bound(instr, label_of, is_compute)
            if id(instr) not in is_compute:
                label_of[id(instr)] = max(bound.from_kernels, bound.from_others)
                continue
            choice = None  # a library call is a kernel by itself
            if bound.weight <= 1:
                choice = _chosen_kernel(instr, producer_labels, bound, found, taken, expensive)
            if choice is None:  # a new kernel of its own, numbered after its inputs
                fresh += 1
                choice = (max(bound.from_kernels, bound.from_others, _BEFORE_ALL_KERNELS)[0], fresh)
            label_of[id(instr)] = choice
            taken[(choice[0], found.matched.get(instr.name))] += 1
            expensive[choice] += bound.weight
            members.setdefault((computation.name, choice), []).append(instr.name)
    ordered = sorted(members.items(), key=lambda item: (item[0][1], item[0][0]))
    return tuple(tuple(names) for _, names in ordered)


def _input_bound(
    instr: Instruction, label_of: dict[int, KernelLabel], is_compute: set[int]
) -> tuple[list[KernelLabel], _InputBound]:
    """The kernels of `instr`'s compute inputs (operands and control
    predecessors), and its `_InputBound`."""
    inputs = instr.operands + instr.control_predecessors
    producer_labels = [label_of[id(o)] for o in inputs if id(o) in is_compute]
    from_kernels = max(producer_labels, default=_BEFORE_ALL_KERNELS)
    from_others = max(
        (label_of.get(id(o), _BEFORE_ALL_KERNELS) for o in inputs if id(o) not in is_compute),
        default=_BEFORE_ALL_KERNELS,
    )
    return producer_labels, _InputBound(from_kernels, from_others, fusion_weight(instr))


def _chosen_kernel(
    instr: Instruction,
    producer_labels: list[KernelLabel],
    bound: _InputBound,
    found: KernelCandidates,
    taken: dict[tuple[int, tuple], int],
    expensive: dict[KernelLabel, int],
) -> KernelLabel | None:
    """The kernel a captured compute instruction joins: the first of its own
    candidates that a producer is in, if it `_fits`; else the first that fits
    of: its own candidates, earliest first; the highest of its producers'
    kernels; its users' candidates, earliest first. None when none fits (it
    gets a new kernel)."""
    own = _own_candidates(instr, bound, found, taken)
    choice = next((lab for lab in own if lab in producer_labels), None)
    if choice is None or not _fits(choice, bound, expensive):
        choice = next((lab for lab in own if _fits(lab, bound, expensive)), None)
    if choice is None and producer_labels and _fits(bound.from_kernels, bound, expensive):
        choice = bound.from_kernels
    if choice is None:
        candidates = found.kernels
        hinted = sorted({k for user in instr.users for k in candidates.get(user.name, ())})
        choice = next(
            (lab for lab in ((k, 0) for k in hinted) if _fits(lab, bound, expensive)), None
        )
    return choice


def _own_candidates(
    instr: Instruction,
    bound: _InputBound,
    found: KernelCandidates,
    taken: dict[tuple[int, tuple], int],
) -> list[KernelLabel]:
    """`instr`'s candidate kernels within CANDIDATE_REACH of its latest input,
    ascending; only those with room left (`KernelCandidates.capacity`) if any
    have."""
    latest_input = max(bound.from_kernels, bound.from_others)
    own = [
        (k, 0)
        for k in found.kernels.get(instr.name, ())
        if latest_input == _BEFORE_ALL_KERNELS or k <= latest_input[0] + CANDIDATE_REACH
    ]
    key = found.matched.get(instr.name)
    with_room = [lab for lab in own if taken[(lab[0], key)] < found.capacity[(lab[0], key)]]
    return with_room or own


def _free(name: str, by_name: dict[str, Instruction]) -> bool:
    """An instruction XLA emits no work for of its own (a bitcast-like reshape, a
    value copied into its readers)."""
    instr = by_name[name]
    return instr.opcode in ("reshape", "bitcast") or _shared_freely(instr)


def _shared_freely(instr: Instruction) -> bool:
    """A value XLA copies into every kernel that reads it (a scalar, a broadcast)."""
    return instr.opcode == "broadcast" or instr.shape.elements <= 1


def _union_find_root(parent: dict[str, str]):
    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    return root


def split_unconnected(groups: tuple[tuple[str, ...], ...], module: HloModule):
    """Each group cut into the parts that no data edge inside it joins.

    The mapping of step 2 matches by op_name, and an op_name can stand for many
    instructions (an optimizer's update mapped over every parameter): it can put
    the updates of many parameters into one group, which XLA never made (it
    emits separate kernels for them). A kernel XLA makes is joined by data edges,
    except through a value it copies into each part (a scalar, a broadcast): such
    a value goes with the first part that reads it."""
    by_name = {i.name: i for i in module.instructions()}
    result: list[tuple[str, ...]] = []
    for group in groups:
        if len(group) == 1:
            result.append(group)
            continue
        parent = {name: name for name in group}
        root = _union_find_root(parent)
        claimed: set[str] = set()
        for name in group:  # the group is in topological order
            for operand in by_name[name].operands:
                if operand.name not in parent:
                    continue
                if _shared_freely(operand):
                    if operand.name in claimed:
                        continue
                    claimed.add(operand.name)
                parent[root(operand.name)] = root(name)
        parts: dict[str, list[str]] = {}
        for name in group:
            parts.setdefault(root(name), []).append(name)
        # A part of reshapes and broadcasts alone would be no kernel under XLA (a
        # bitcast, or a value copied into its readers): it stays with a part it
        # touches, else with the first part that does real work.
        working = [key for key, part in parts.items() if not all(_free(n, by_name) for n in part)]
        for key, part in list(parts.items()):
            if key in working or not working:
                continue
            touched = [
                root(other.name)
                for name in part
                for other in by_name[name].operands + by_name[name].users
                if other.name in parent and root(other.name) != key
            ]
            parent[key] = touched[0] if touched else working[0]
        parts = {}
        for name in group:
            parts.setdefault(root(name), []).append(name)
        result.extend(tuple(part) for part in parts.values())
    return tuple(result)


def xla_fusion_plan(captured: HloModule, compiled: HloModule) -> Plan:
    """XLA's fusion over the captured module, one all-reduce per gradient. Groups
    that the mapping joined without a data edge are cut apart (`split_unconnected`)
    where the result stays legal."""
    unfused = Plan.unfused(captured)
    groups = xla_fusion_groups(captured, compiled)
    plan = Plan(
        module_name=unfused.module_name,
        fingerprint=unfused.fingerprint,
        fusion_groups=groups,
        all_reduce_buckets=unfused.all_reduce_buckets,
    )
    cut = replace(plan, fusion_groups=split_unconnected(groups, captured))
    try:
        verify_plan(cut, captured)
    except DiscoInputError:
        return plan
    return cut
