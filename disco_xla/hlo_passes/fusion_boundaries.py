"""Pass: enforce the plan's op-fusion groups as kernel boundaries.

Each group of several instructions is outlined into its own computation, called
through a `call` marked `inlineable="false"`: XLA keeps the call, so it cannot fuse
across the group's edge, and it still fuses freely inside (design notes §2). The
group's values used outside come back through a tuple; their users read them
through get-tuple-element. Single-instruction groups stay where they are; XLA may
still fuse those with a neighbour unless the plan puts them in a group of their own
and the caller disables fusion.
"""

from __future__ import annotations

from disco_xla.hlo_passes import edit
from disco_xla.hlo_passes.graph import HloModule, Instruction
from disco_xla.plan import Plan

NAME = "fusion-boundaries"
GROUP_MARK = "disco_xla.kernel"


def outline_fusion_groups(module: HloModule, plan: Plan) -> bool:
    """Run the pass for a plan that `verify_plan` accepted. Returns whether the
    module changed."""
    by_name = {i.name: i for i in module.instructions()}
    changed = False
    forwarded: dict[int, int] = {}  # an outlined output's id -> its get-tuple-element
    outlined: set[int] = set()
    for index, group in enumerate(plan.fusion_groups):
        members = [by_name[name] for name in group]
        _outline(module, index, members, forwarded)
        outlined.update(m.id for m in members)
        changed = True
    if changed:
        # Removed at the end: until then the members' protos stay the live ones
        # that later groups copy (protobuf copies messages when a list is rebuilt).
        for computation in module.computations:
            kept = [p for p in computation.proto.instructions if p.id not in outlined]
            if len(kept) != len(computation.proto.instructions):
                del computation.proto.instructions[:]
                computation.proto.instructions.extend(kept)
        module.rebuild()
    return changed


def _outline(
    module: HloModule, index: int, members: list[Instruction], forwarded: dict[int, int]
) -> None:
    computation = members[0].computation
    inside = {id(m) for m in members}
    order = [i for i in computation.topological_order if id(i) in inside]
    inputs: list[Instruction] = []
    for member in order:
        for operand in member.operands:
            if id(operand) not in inside and operand not in inputs:
                inputs.append(operand)
    outputs = [
        m for m in order if computation.root is m or any(id(u) not in inside for u in m.users)
    ]
    # The callee: parameters for the inputs, copies of the members, a tuple root.
    callee_id = max(c.id for c in module.proto.computations) + 1
    callee = module.proto.computations.add(name=f"{GROUP_MARK}.{index}", id=callee_id)
    new_id: dict[int, int] = {}
    for number, source in enumerate(inputs):
        parameter = callee.instructions.add(
            name=f"{GROUP_MARK}.{index}.in{number}",
            opcode="parameter",
            parameter_number=number,
            id=(callee_id << 32) | len(callee.instructions),
        )
        parameter.shape.CopyFrom(source.proto.shape)
        callee.program_shape.parameters.add().CopyFrom(source.proto.shape)
        callee.program_shape.parameter_names.append(f"in{number}")
        new_id[forwarded.get(source.id, source.id)] = parameter.id
    for member in order:
        copy = callee.instructions.add()
        copy.CopyFrom(member.proto)
        copy.id = (callee_id << 32) | (len(callee.instructions) - 1)
        del copy.control_predecessor_ids[:]
        for slot, operand in enumerate(copy.operand_ids):
            copy.operand_ids[slot] = new_id[operand]
        new_id[member.id] = copy.id
    root = callee.instructions.add(
        name=f"{GROUP_MARK}.{index}.out",
        opcode="tuple",
        id=(callee_id << 32) | len(callee.instructions),
    )
    root.shape.element_type = 13  # tuple
    for output in outputs:
        root.operand_ids.append(new_id[output.id])
        root.shape.tuple_shapes.add().CopyFrom(output.proto.shape)
    callee.root_id = root.id
    callee.program_shape.result.CopyFrom(root.shape)

    # The call in place of the members, and one get-tuple-element per output.
    call = edit.add_instruction(
        computation,
        f"{GROUP_MARK}.{index}.call",
        "call",
        root.shape,
        [forwarded.get(i.id, i.id) for i in inputs],
    )
    call.called_computation_ids.append(callee_id)
    call.frontend_attributes.map["inlineable"] = "false"
    call.metadata.op_name = f"{GROUP_MARK}/{index}"
    for member in members:
        call.control_predecessor_ids.extend(
            forwarded.get(p.id, p.id) for p in member.control_predecessors if id(p) not in inside
        )
    replaced = {}
    for slot, output in enumerate(outputs):
        element = edit.add_instruction(
            computation, f"{output.name}.out", "get-tuple-element", output.proto.shape, [call.id]
        )
        element.tuple_index = slot
        element.metadata.CopyFrom(output.proto.metadata)
        replaced[output.id] = element.id
    forwarded.update(replaced)
    member_ids = {m.id for m in members}
    for proto in computation.proto.instructions:
        if proto.id in member_ids:
            continue
        for slot, operand in enumerate(proto.operand_ids):
            if operand in replaced:
                proto.operand_ids[slot] = replaced[operand]
        for slot, predecessor in enumerate(proto.control_predecessor_ids):
            if predecessor in member_ids:
                proto.control_predecessor_ids[slot] = call.id
    if computation.proto.root_id in replaced:
        computation.proto.root_id = replaced[computation.proto.root_id]
