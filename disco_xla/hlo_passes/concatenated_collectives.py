"""What the bucketing passes share: one collective over the concatenation of
its members' (reshaped) operands, each member's piece sliced back out, the
members' users redirected in one scan per computation, and buckets kept in
plan order by control dependencies."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from disco_xla.hlo import edit
from disco_xla.hlo.graph import Computation, HloModule, Instruction
from disco_xla.hlo.hlo_schema import ShapeProto

GROUP_FIELDS = (
    "collective_device_list",
    "iota_collective_device_list",
    "mesh_axes_replica_group_list",
)


class PendingReplacements:
    """The members replaced so far, each computation's {member id: restored id}:
    their users are redirected in one scan of each computation, and the members
    removed, when the pass ends. A scan per member made the pass quadratic (in
    the 6 rewrites of inception_v3's first call, 2,262 scans took 38 s of 215 s)."""

    def __init__(self) -> None:
        self._by_computation: dict[int, tuple[Computation, dict[int, int]]] = {}
        self._members: list[Instruction] = []

    def add(self, computation: Computation, member: Instruction, restored) -> None:
        """`member`'s users (and the root, if it is one) will read `restored`."""
        restored.metadata.op_name = member.op_name  # the marks of a reduced gradient
        self._by_computation.setdefault(id(computation), (computation, {}))[1][member.id] = (
            restored.id
        )
        self._members.append(member)

    def apply(self, module: HloModule) -> None:
        """Redirect the users and delete the members (the view is left stale)."""
        for computation, new_for_old in self._by_computation.values():
            edit.redirect_uses(computation, new_for_old)
            root = computation.proto.root_id
            computation.proto.root_id = new_for_old.get(root, root)
        module.remove_instructions(self._members)


def bucket_in_order(
    module: HloModule,
    buckets: Sequence[tuple[str, ...]],
    concatenate: Callable[[HloModule, int, list, PendingReplacements], int],
) -> bool:
    """What both bucketing passes do with a plan's `buckets` in order: a bucket
    of several becomes `concatenate(module, index, members, replaced)` (the id
    of its one collective), a bucket of one keeps its collective, and each
    bucket runs after the one before it in the same computation (a control
    dependency cannot cross a computation). Returns whether the module changed."""
    changed = False
    previous_id: dict[str, int] = {}  # the last bucket so far in each computation
    replaced = PendingReplacements()
    for index, bucket in enumerate(buckets):
        members = [module.instruction(name) for name in bucket]
        computation = members[0].computation
        if len(members) == 1:
            current_id = members[0].id
        else:
            current_id = concatenate(module, index, members, replaced)
            changed = True
        if computation.name in previous_id:
            order_after(computation, current_id, previous_id[computation.name])
            changed = True
        previous_id[computation.name] = current_id
    replaced.apply(module)
    if changed:
        module.rebuild()
    return changed


def collective_of_concatenation(
    computation,
    name: str,
    members,
    opcode: str,
    pieces: list[int],
    concat_dimension: int,
    joined_shape,
    result_shape,
):
    """A bucket's collective: `pieces` concatenated along `concat_dimension` (to
    `joined_shape`), then one `opcode` collective over the result, named `name`
    and with its members' fields (`copy_collective_fields`)."""
    joined = edit.add_instruction(
        computation, f"{name}.concat", "concatenate", joined_shape, pieces
    )
    joined.dimensions.append(concat_dimension)
    collective = edit.add_instruction(computation, name, opcode, result_shape, [joined.id])
    copy_collective_fields(collective, members[0].proto, name, members)
    return collective


def column_ranges(widths: list[int]) -> list[tuple[int, int]]:
    """Each member's [start, limit) along the concatenated dimension."""
    ranges, offset = [], 0
    for width in widths:
        ranges.append((offset, offset + width))
        offset += width
    return ranges


def slice_of(computation, member, collective, shape, ranges: list[tuple[int, int]]):
    """`member`'s piece of the bucket's collective: a slice to `shape` with one
    [start, limit) (stride 1) per dimension."""
    piece = edit.add_instruction(
        computation, f"{member.name}.piece", "slice", shape, [collective.id]
    )
    for start, limit in ranges:
        piece.slice_dimensions.add(start=start, limit=limit, stride=1)
    return piece


def transpose(computation, name: str, operand_id: int, shape, permutation: list[int]):
    """A transpose of `operand_id` to `shape`: result dimension i is the
    operand's dimension permutation[i]."""
    moved = edit.add_instruction(computation, name, "transpose", shape, [operand_id])
    moved.dimensions.extend(permutation)
    return moved


def copy_collective_fields(collective, template, name: str, members) -> None:
    """The bucket's collective takes its members' reducer, channel and device
    groups, and names them in its op_name."""
    collective.channel_id = template.channel_id
    collective.use_global_device_ids = template.use_global_device_ids
    # The device groups, in whichever of XLA's forms the template has them.
    for field in GROUP_FIELDS:
        if template.HasField(field):
            getattr(collective, field).CopyFrom(getattr(template, field))
    collective.replica_groups.extend(template.replica_groups)
    collective.called_computation_ids.extend(template.called_computation_ids)
    prefix, _, index = name.rpartition(".")
    collective.metadata.op_name = f"{prefix}/{index}: " + ",".join(m.name for m in members)


def order_after(computation, instruction_id: int, predecessor_id: int) -> None:
    """A control dependency: `instruction_id` runs after `predecessor_id`."""
    for proto in computation.proto.instructions:
        if proto.id == instruction_id and predecessor_id not in proto.control_predecessor_ids:
            proto.control_predecessor_ids.append(predecessor_id)


def vector_shape(element_type: int, size: int):
    return array_shape(element_type, [size])


def array_shape(element_type: int, dims: list[int]):
    """An array ShapeProto with the default (row-major) layout."""
    shape = ShapeProto(element_type=element_type, dimensions=dims)
    shape.layout.minor_to_major.extend(reversed(range(len(dims))))
    return shape
