"""Small helpers the rewrite passes use to add computations and instructions.

They write protos only; a pass calls `HloModule.rebuild()` once it is done, which
re-links the graph view and puts every instruction after its operands.
"""

from __future__ import annotations

from collections.abc import Set

from disco_xla.hlo.graph import Computation
from disco_xla.hlo.hlo_schema import ShapeProto


def fresh_instruction_id(computation: Computation) -> int:
    """An id no instruction of `computation` uses, in XLA's (computation << 32) | n form.
    The next free id is remembered on the view: a pass adds many instructions,
    and a rescan of the computation for each would make outlining quadratic."""
    next_id = computation.__dict__.get("_next_free_id")
    if next_id is None:
        taken = [p.id for p in computation.proto.instructions]
        next_id = max(taken) + 1 if taken else computation.id << 32
    computation.__dict__["_next_free_id"] = next_id + 1
    return next_id


def add_instruction(computation: Computation, name: str, opcode: str, shape, operands=()):
    """Append an instruction proto with a copy of `shape` (a ShapeProto)."""
    proto = computation.proto.instructions.add(
        name=_unique_name(computation, name), opcode=opcode, id=fresh_instruction_id(computation)
    )
    proto.shape.CopyFrom(shape)
    proto.operand_ids.extend(operands)
    return proto


def clone_instruction(computation: Computation, proto, name: str, operands) -> object:
    """Append a copy of instruction `proto` (its opcode, shape and attributes) under
    a new id and name, reading `operands`."""
    clone = computation.proto.instructions.add()
    clone.CopyFrom(proto)
    clone.id = fresh_instruction_id(computation)
    clone.name = _unique_name(computation, name)
    del clone.operand_ids[:]
    clone.operand_ids.extend(operands)
    return clone


def next_channel_id(module) -> int:
    """A channel id above every one `module` (an HloModule) uses: a collective
    a pass adds must not share its channel with another."""
    return 1 + max((i.proto.channel_id for i in module.instructions()), default=0)


def scalar_shape(element_type: int):
    """A rank-0 ShapeProto (with an empty layout, as XLA writes scalars)."""
    shape = ShapeProto(element_type=element_type)
    shape.layout.SetInParent()
    return shape


def add_scalar_reducer(module_proto, element_type: int, opcode: str = "add") -> int:
    """Add a computation (x, y) -> opcode(x, y) over scalars to an HloModuleProto;
    returns its id."""
    computation_id = max((c.id for c in module_proto.computations), default=0) + 1
    names = {c.name for c in module_proto.computations}
    name = f"disco_xla.{opcode}_{element_type}"
    suffix = 0
    while name in names:
        suffix += 1
        name = f"disco_xla.{opcode}_{element_type}.{suffix}"
    proto = module_proto.computations.add(name=name, id=computation_id)
    scalar = scalar_shape(element_type)
    operand_ids = []
    for number in range(2):
        parameter = proto.instructions.add(
            name=f"{name}.x{number}",
            opcode="parameter",
            parameter_number=number,
            id=(computation_id << 32) | number,
        )
        parameter.shape.CopyFrom(scalar)
        operand_ids.append(parameter.id)
        proto.program_shape.parameters.add().CopyFrom(scalar)
        proto.program_shape.parameter_names.append(f"x{number}")
    result = proto.instructions.add(
        name=f"{name}.result", opcode=opcode, id=(computation_id << 32) | 2
    )
    result.shape.CopyFrom(scalar)
    result.operand_ids.extend(operand_ids)
    proto.program_shape.result.CopyFrom(scalar)
    proto.root_id = result.id
    return computation_id


def replace_uses(computation: Computation, old_id: int, new_id: int, keep: set[int]) -> int:
    """Make every instruction except those in `keep` read `new_id` where it read
    `old_id`. Returns how many operand slots changed."""
    return redirect_uses(computation, {old_id: new_id}, keep)


def redirect_uses(
    computation: Computation, new_for_old: dict[int, int], keep: Set[int] = frozenset()
) -> int:
    """Make every instruction except those in `keep` read `new_for_old[x]` where
    it read an `x` among its keys, in one scan. Returns how many operand slots
    changed."""
    changed = 0
    for proto in computation.proto.instructions:
        if proto.id in keep:
            continue
        operands = proto.operand_ids
        for index, operand in enumerate(operands):
            new = new_for_old.get(operand)
            if new is not None:
                operands[index] = new
                changed += 1
    return changed


def _unique_name(computation: Computation, name: str) -> str:
    """A name no instruction of `computation` has; names handed out are remembered
    on the view, like ids."""
    names = computation.__dict__.get("_taken_names")
    if names is None:
        names = computation.__dict__["_taken_names"] = {
            p.name for p in computation.proto.instructions
        }
    candidate, suffix = name, 0
    while candidate in names:
        suffix += 1
        candidate = f"{name}.{suffix}"
    names.add(candidate)
    return candidate
