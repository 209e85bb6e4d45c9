"""Pass: concat-bucketing of gradient all-reduces, as the plan's buckets say.

For each bucket of several gradients: flatten each gradient, concatenate them,
run one all-reduce on the concatenation (with the members' reducer, channel and
device groups), then slice each gradient back out and restore its shape. The old
all-reduces' users read the restored values; the old all-reduces are removed.
Consecutive buckets of one computation are chained by control dependencies, so
the program keeps the plan's bucket order (a loop body's buckets among
themselves: a control dependency cannot cross a computation). (A tuple
all-reduce written before partitioning does not compile in jax 0.10.2's manual
mode; concatenation does, bit for bit.)
"""

from __future__ import annotations

import math

from disco_xla.errors import DiscoInputError
from disco_xla.hlo_passes import edit
from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan

GROUP_FIELDS = (
    "collective_device_list",
    "iota_collective_device_list",
    "mesh_axes_replica_group_list",
)
NAME = "bucket-all-reduces"
BUCKET_MARK = "disco_xla.bucket"


def bucket_all_reduces(module: HloModule, plan: Plan) -> bool:
    """Run the pass for a plan that `verify_plan` accepted. Returns whether the
    module changed."""
    by_name = {i.name: i for i in module.instructions()}
    changed = False
    previous_id: dict[str, int] = {}  # the last bucket so far in each computation
    for index, bucket in enumerate(plan.all_reduce_buckets):
        members = [by_name[name] for name in bucket]
        computation = members[0].computation
        if len(members) == 1:
            current_id = members[0].id
        else:
            current_id = _concatenate_bucket(module, index, members)
            changed = True
        if computation.name in previous_id:
            _order_after(computation, current_id, previous_id[computation.name])
            changed = True
        previous_id[computation.name] = current_id
    if changed:
        module.rebuild()
    return changed


def _concatenate_bucket(module: HloModule, index: int, members) -> int:
    computation = members[0].computation
    template = members[0].proto
    element_type = template.shape.element_type
    flats, sizes = [], []
    for member in members:
        if len(member.operands) != 1 or member.shape.is_tuple:
            raise DiscoInputError(module.source, f"{member.name!r} is a variadic all-reduce")
        size = math.prod(member.shape.dims)
        flat = edit.add_instruction(
            computation,
            f"{member.name}.flat",
            "reshape",
            _vector(element_type, size),
            [member.operands[0].id],
        )
        flats.append(flat.id)
        sizes.append(size)
    total = sum(sizes)
    joined = edit.add_instruction(
        computation,
        f"{BUCKET_MARK}.{index}.concat",
        "concatenate",
        _vector(element_type, total),
        flats,
    )
    joined.dimensions.append(0)
    reduced = edit.add_instruction(
        computation,
        f"{BUCKET_MARK}.{index}",
        "all-reduce",
        _vector(element_type, total),
        [joined.id],
    )
    reduced.channel_id = template.channel_id
    reduced.use_global_device_ids = template.use_global_device_ids
    # The device groups, in whichever of XLA's forms the template has them.
    for field in GROUP_FIELDS:
        if template.HasField(field):
            getattr(reduced, field).CopyFrom(getattr(template, field))
    reduced.replica_groups.extend(template.replica_groups)
    reduced.called_computation_ids.extend(template.called_computation_ids)
    reduced.metadata.op_name = f"{BUCKET_MARK}/{index}: " + ",".join(m.name for m in members)
    offset = 0
    removed = set()
    for member, size in zip(members, sizes, strict=True):
        piece = edit.add_instruction(
            computation, f"{member.name}.piece", "slice", _vector(element_type, size), [reduced.id]
        )
        piece.slice_dimensions.add(start=offset, limit=offset + size, stride=1)
        restored = edit.add_instruction(
            computation, f"{member.name}.restored", "reshape", member.proto.shape, [piece.id]
        )
        # Keep the marks that say this value is a reduced gradient.
        restored.metadata.op_name = member.op_name
        edit.replace_uses(computation, member.id, restored.id, keep=set())
        if computation.proto.root_id == member.id:
            computation.proto.root_id = restored.id
        removed.add(member.id)
        offset += size
    kept = [p for p in computation.proto.instructions if p.id not in removed]
    del computation.proto.instructions[:]
    computation.proto.instructions.extend(kept)
    return reduced.id


def _order_after(computation, instruction_id: int, predecessor_id: int) -> None:
    for proto in computation.proto.instructions:
        if proto.id == instruction_id and predecessor_id not in proto.control_predecessor_ids:
            proto.control_predecessor_ids.append(predecessor_id)


def _vector(element_type: int, size: int):
    from disco_xla.hlo_passes.hlo_schema import ShapeProto

    shape = ShapeProto(element_type=element_type, dimensions=[size])
    shape.layout.minor_to_major.append(0)
    return shape
