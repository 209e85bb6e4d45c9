"""Pass: issue a loop body's all-gathers one trip ahead of their use (prefetch
depth 1, what XLA:GPU's collective pipeliner does for all-gathers).

For an all-gather G in the body of a loop, whose operand the body computes from
loop-invariant values and the induction variable i (`hlo.loops.prefetchable`;
in an FSDP layer loop: the slice at i of a stacked, sharded parameter):
1. before the loop, G's operand is computed as for the first trip, and gathered;
   the loop's tuple carries the result as a new last element;
2. in the body, G's users read that element: the gathered value of this trip;
3. the body computes G's operand for the next trip (at the induction
   variable's next value) and gathers it into the element for the next trip.

The gathered value each trip reads is G's, so the loop computes what it did,
bit for bit. So that no trip gathers for a trip that never comes, the loop runs
one trip fewer, and its last trip runs after it, as a copy of the body that
reads the gathered value the loop carries out (XLA's pipeliner peels the same
trip). Every user of the loop reads that copy's result, of the loop's shape as
before.

An all-gather that a plan bucketed earlier (`bucket_all_gathers`) may be
prefetched too: its operand is the concatenation of its members' operands. A
prefetched all-gather leaves the control chain that keeps buckets in plan order:
it runs as early as the previous trip allows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import edit
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.hlo.hlo_schema import ShapeProto
from disco_xla.hlo.loops import Loop, computed_from_invariants, loop_of_body, source
from disco_xla.hlo.trip_counts import element_of_parameter, induction_variable


class PrefetchAllGathers:
    """The pass (`pass_interface.HloPass`). `all_gathers` are the names of the
    all-gathers to issue one trip ahead (each in a loop body, `prefetchable`)."""

    name = "prefetch-all-gathers"

    def __init__(self, all_gathers: Sequence[str]):
        self.all_gathers = tuple(all_gathers)

    def run(self, module: HloModule) -> bool:
        """Prefetch the named all-gathers; returns whether the module changed."""
        if not self.all_gathers:
            return False
        by_loop: dict[str, tuple[Loop, list[Instruction]]] = {}
        for name in self.all_gathers:
            gather = module.instruction(name)
            loop = loop_of_body(gather.computation)
            if loop is None or gather.opcode != "all-gather":
                raise DiscoInputError(
                    module.source, f"{name} is not an all-gather in a counted loop's body"
                )
            by_loop.setdefault(loop.body.name, (loop, []))[1].append(gather)
        channel = edit.next_channel_id(module)
        doomed: list[Instruction] = []
        for loop, gathers in by_loop.values():
            channel = _prefetch_in_loop(module, loop, gathers, channel)
            doomed.extend(gathers)
        _forget_control_edges(module, {g.id for g in doomed})
        module.remove_instructions(doomed)
        module.rebuild()
        return True


def _prefetch_in_loop(
    module: HloModule, loop: Loop, gathers: list[Instruction], channel: int
) -> int:
    """Rewrite one loop for its prefetched `gathers` (the module's docstring);
    returns the next free channel id."""
    body, condition, while_instr = loop.body, loop.condition, loop.instruction
    outer = while_instr.computation
    elements = len(while_instr.proto.shape.tuple_shapes)
    initial = while_instr.operands[0]
    slices = [computed_from_invariants(loop, gather.operands[0]) for gather in gathers]
    for gather, operand_slice in zip(gathers, slices, strict=True):
        if operand_slice is None:
            raise DiscoInputError(
                module.source, f"{gather.name} reads what its loop changes: it cannot be prefetched"
            )
    channel = _peel_last_trip(loop, gathers, elements, channel)
    _one_trip_fewer(module, loop)
    first_gathers, next_gathers, carried = [], [], {}
    parameter = _parameter(body)
    for number, (gather, operand_slice) in enumerate(zip(gathers, slices, strict=True)):
        element = elements + number
        first = _clone_before_loop(outer, loop, initial, operand_slice)
        first_gather = _clone(
            outer, gather.proto, f"{gather.name}.first", [first[operand_slice[-1].id]]
        )
        first_gather.channel_id, channel = channel, channel + 1
        first_gathers.append(first_gather)
        following = _clone_for_next_trip(body, loop, operand_slice)
        next_gather = _clone(
            body, gather.proto, f"{gather.name}.next", [following[operand_slice[-1].id]]
        )
        next_gathers.append(next_gather)
        this_trip = edit.add_instruction(
            body,
            f"{gather.name}.this_trip",
            "get-tuple-element",
            gather.proto.shape,
            [parameter.id],
        )
        this_trip.tuple_index = element
        carried[gather.id] = this_trip.id
    edit.redirect_uses(body, carried)
    body.proto.root_id = carried.get(body.proto.root_id, body.proto.root_id)
    shapes = [g.proto.shape for g in gathers]
    root = _extend_root(body, next_gathers)
    for computation in (body, condition):
        _parameter(computation).proto.shape.tuple_shapes.extend(shapes)
        if computation.proto.program_shape.parameters:
            computation.proto.program_shape.parameters[0].tuple_shapes.extend(shapes)
    if body.proto.program_shape.HasField("result"):
        body.proto.program_shape.result.tuple_shapes.extend(shapes)
    new_initial = _extended_tuple(outer, initial, elements, first_gathers)
    proto = while_instr.proto
    proto.operand_ids[0] = new_initial.id
    proto.shape.tuple_shapes.extend(shapes)
    for tuple_proto in (proto, root, parameter.proto, _parameter(condition).proto):
        _extend_sharding(tuple_proto, len(shapes))
    return channel


_REPLICATED = 0  # OpSharding.Type


def _extend_sharding(proto, count: int) -> None:
    """A tuple's sharding, where it has one, gains `count` replicated elements."""
    if proto.HasField("sharding") and proto.sharding.tuple_shardings:
        for _ in range(count):
            proto.sharding.tuple_shardings.add(type=_REPLICATED)


def _peel_last_trip(loop: Loop, gathers: list[Instruction], elements: int, channel: int) -> int:
    """Run the loop's last trip after it, as a copy of the body in the loop's
    computation, so that no trip gathers for a trip that never comes. The copy
    reads the loop's results where the body reads its parameter, and each
    prefetched all-gather's value from the loop's new element for it
    (`elements` on, in order). Every user of the loop then reads the copy's
    result. Collectives in the copy get channels of their own, from `channel`
    on; returns the next free one."""
    body, while_instr = loop.body, loop.instruction
    outer = while_instr.computation
    carried = {gather.id: elements + number for number, gather in enumerate(gathers)}
    results: dict[int, int] = {}  # the loop's element -> its get-tuple-element here

    def result(element: int, shape) -> int:
        if element not in results:
            proto = edit.add_instruction(
                outer,
                f"{while_instr.name}.result{element}",
                "get-tuple-element",
                shape,
                [while_instr.id],
            )
            proto.tuple_index = element
            results[element] = proto.id
        return results[element]

    copies: dict[int, int] = {}
    for instr in body.topological_order:
        if instr.opcode == "parameter":
            continue
        element = element_of_parameter(instr)
        if element is None:
            element = carried.get(instr.id)
        if element is not None:
            copies[instr.id] = result(element, instr.proto.shape)
            continue
        copy = _clone(
            outer, instr.proto, f"{instr.name}.last_trip", [copies[o.id] for o in instr.operands]
        )
        copy.control_predecessor_ids.extend(
            copies[p.id] for p in instr.control_predecessors if p.id in copies
        )
        if copy.channel_id:
            copy.channel_id, channel = channel, channel + 1
        copies[instr.id] = copy.id
    last_trip = copies[body.root.id]
    edit.redirect_uses(outer, {while_instr.id: last_trip}, keep=set(results.values()))
    if outer.proto.root_id == while_instr.id:
        outer.proto.root_id = last_trip
    return channel


# The literal field of each integer type an induction variable may have (XLA's
# PrimitiveType numbers: S32, S64, U32).
_COUNTER_VALUES = {4: "s32s", 5: "s64s", 8: "u32s"}


def _one_trip_fewer(module: HloModule, loop: Loop) -> None:
    """The loop's condition stops one trip earlier: the induction variable
    compared with its value on the last trip (LT counting up, GT counting
    down), and XLA's known trip count, where the loop has one, one less."""
    _, start, step, _, _ = induction_variable(loop.instruction)
    condition = loop.condition
    compare = condition.root
    counter = next(o for o in compare.operands if element_of_parameter(o) == loop.induction_element)
    field = _COUNTER_VALUES.get(counter.proto.shape.element_type)
    if field is None:
        raise DiscoInputError(
            module.source, f"loop {loop.instruction.name} counts in a type prefetching cannot"
        )
    last = edit.add_instruction(
        condition, f"{loop.instruction.name}.last_trip_index", "constant", counter.proto.shape
    )
    last.literal.shape.CopyFrom(counter.proto.shape)
    getattr(last.literal, field).append(start + (loop.trips - 1) * step)
    compare.proto.operand_ids[:] = [counter.id, last.id]
    compare.proto.comparison_direction = "LT" if step > 0 else "GT"
    raw = loop.instruction.proto.backend_config
    if raw:
        try:
            config = json.loads(raw.decode("utf-8"))
            config["known_trip_count"]["n"] = str(loop.trips - 1)
            loop.instruction.proto.backend_config = json.dumps(config).encode("utf-8")
        except (ValueError, KeyError, TypeError):
            pass


def _clone_before_loop(outer, loop: Loop, initial: Instruction, operand_slice) -> dict[int, int]:
    """`operand_slice` computed in the loop's computation for the first trip:
    each invariant or induction element read from the loop's initial tuple.
    Returns {body id: clone id}."""
    clones: dict[int, int] = {}
    for instr in operand_slice:
        element = element_of_parameter(instr)
        if element is not None:
            clones[instr.id] = _element_of(outer, initial, element).id
            continue
        operands = [clones[source(o).id] for o in instr.operands]
        clones[instr.id] = _clone(outer, instr.proto, f"{instr.name}.first", operands).id
    return clones


def _clone_for_next_trip(body, loop: Loop, operand_slice) -> dict[int, int]:
    """`operand_slice` computed in the body at the induction variable's next
    value: what reads the induction variable is cloned, the rest reused.
    Returns {id: id of the next trip's value}."""
    following: dict[int, int] = {}
    depends: set[int] = set()
    for instr in operand_slice:
        element = element_of_parameter(instr)
        if element == loop.induction_element:
            following[instr.id] = loop.next_induction.id
            depends.add(instr.id)
            continue
        sources = [source(o).id for o in instr.operands]
        if element is not None or not any(s in depends for s in sources):
            following[instr.id] = instr.id
            continue
        clone = _clone(body, instr.proto, f"{instr.name}.next", [following[s] for s in sources])
        following[instr.id] = clone.id
        depends.add(instr.id)
    return following


def _parameter(computation) -> Instruction:
    return next(i for i in computation.instructions if i.opcode == "parameter")


def _clone(computation, proto, name: str, operands):
    """`edit.clone_instruction` without the original's control predecessors
    (they belong to where the original is)."""
    clone = edit.clone_instruction(computation, proto, name, operands)
    del clone.control_predecessor_ids[:]
    return clone


def _element_of(outer, tuple_instr: Instruction, element: int):
    """Element `element` of the loop's initial tuple, as an instruction of `outer`."""
    if tuple_instr.opcode == "tuple":
        return tuple_instr.operands[element].proto
    proto = edit.add_instruction(
        outer,
        f"{tuple_instr.name}.element{element}",
        "get-tuple-element",
        tuple_instr.proto.shape.tuple_shapes[element],
        [tuple_instr.id],
    )
    proto.tuple_index = element
    return proto


def _extend_root(body, next_gathers):
    """The body's root tuple gains the next trip's gathered values; returns
    the root's proto."""
    root = next(p for p in body.proto.instructions if p.id == body.proto.root_id)
    root.operand_ids.extend(g.id for g in next_gathers)
    root.shape.tuple_shapes.extend(g.shape for g in next_gathers)
    return root


def _extended_tuple(outer, initial: Instruction, elements: int, first_gathers):
    """A tuple of the loop's initial elements and the first trip's gathered values."""
    shape = ShapeProto()
    shape.CopyFrom(initial.proto.shape)
    shape.tuple_shapes.extend(g.shape for g in first_gathers)
    operands = [_element_of(outer, initial, k).id for k in range(elements)]
    return edit.add_instruction(
        outer,
        f"{initial.name}.prefetched",
        "tuple",
        shape,
        [*operands, *(g.id for g in first_gathers)],
    )


def _forget_control_edges(module: HloModule, removed: set[int]) -> None:
    """No instruction waits for a removed one."""
    for computation in module.computations:
        for proto in computation.proto.instructions:
            kept = [p for p in proto.control_predecessor_ids if p not in removed]
            if len(kept) != len(proto.control_predecessor_ids):
                del proto.control_predecessor_ids[:]
                proto.control_predecessor_ids.extend(kept)
