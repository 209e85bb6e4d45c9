"""Pass: concat-bucketing of gradient all-reduces, as the plan's buckets say.

For each bucket of several gradients: flatten each gradient, concatenate them,
run one all-reduce on the concatenation (with the members' reducer, channel and
device groups), then slice each gradient back out and restore its shape. The old
all-reduces' users read the restored values; the old all-reduces are removed.

A bucket of bf16 or f16 gradients is converted to f32 before the concatenation
and back after the slices, and reduced in f32: XLA:CPU promotes a narrow-float
all-reduce to f32 and then drops the f32-bf16-f32 round trips around it, so the
original program sums unrounded values; the bucket must round where it does,
or its outputs differ by a bf16 rounding step (`widen_narrow_floats=False`
keeps the bucket in its own type, as a backend that reduces bf16 natively,
such as XLA:GPU, would send it).

A bucket of gradient reduce-scatters over groups of p devices is concatenated so
that each device still gets its own block of every gradient: each operand has
its scattered dimension moved to the front (a transpose, unless it is there
already) and is reshaped to [p, n/p], row r being device r's block; the rows are
concatenated to [p, N/p], one reduce-scatter over dimension 0 gives [1, N/p], and
each gradient's columns are sliced out, reshaped to its block and transposed
back to the member's result shape.
Consecutive buckets of one computation are chained by control dependencies, so
the program keeps the plan's bucket order (a loop body's buckets among
themselves: a control dependency cannot cross a computation). (A tuple
all-reduce written before partitioning does not compile in jax 0.10.2's manual
mode; concatenation does, bit for bit.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import edit
from disco_xla.hlo.graph import Computation, HloModule, Instruction
from disco_xla.hlo.hlo_schema import ShapeProto
from disco_xla.hlo.shapes import F32_TYPE

GROUP_FIELDS = (
    "collective_device_list",
    "iota_collective_device_list",
    "mesh_axes_replica_group_list",
)
BUCKET_MARK = "disco_xla.bucket"
NARROW_FLOATS = frozenset({10, 16})  # PrimitiveType F16 and BF16


class BucketAllReduces:
    """The pass (`pass_interface.HloPass`). `all_reduce_buckets` are a plan's
    buckets in order, each a tuple of the names of the gradient all-reduces (or
    reduce-scatters) it sends together; bucket k's collective is named
    `BUCKET_MARK.k`. `widen_narrow_floats`: see the module's docstring."""

    name = "bucket-all-reduces"

    def __init__(
        self, all_reduce_buckets: Sequence[tuple[str, ...]], widen_narrow_floats: bool = True
    ):
        self.all_reduce_buckets = tuple(tuple(bucket) for bucket in all_reduce_buckets)
        self.widen_narrow_floats = widen_narrow_floats

    def run(self, module: HloModule) -> bool:
        """Bucket the all-reduces (named in `module`, a valid plan's); returns
        whether the module changed."""
        changed = False
        previous_id: dict[str, int] = {}  # the last bucket so far in each computation
        replaced = _PendingReplacements()
        for index, bucket in enumerate(self.all_reduce_buckets):
            members = [module.instruction(name) for name in bucket]
            computation = members[0].computation
            if len(members) == 1:
                current_id = members[0].id
            elif members[0].opcode == "reduce-scatter":
                current_id = _concatenate_reduce_scatters(module, index, members, replaced)
                changed = True
            else:
                current_id = _concatenate_bucket(
                    module, index, members, self.widen_narrow_floats, replaced
                )
                changed = True
            if computation.name in previous_id:
                _order_after(computation, current_id, previous_id[computation.name])
                changed = True
            previous_id[computation.name] = current_id
        replaced.apply(module)
        if changed:
            module.rebuild()
        return changed


class _PendingReplacements:
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


def _concatenate_bucket(
    module: HloModule, index: int, members, widen: bool, replaced: _PendingReplacements
) -> int:
    """One all-reduce for a bucket of them (see the module's docstring): each
    member's operand flattened (widened to f32 first where `widen` says), the
    vectors concatenated and reduced, and each member's slice reshaped back."""
    computation = members[0].computation
    element_type = members[0].proto.shape.element_type
    reduce_type = F32_TYPE if widen and element_type in NARROW_FLOATS else element_type
    flats, sizes = [], []
    for member in members:
        sizes.append(_all_reduce_size(module, member))
        flats.append(_flat_operand(computation, member, reduce_type))
    total = sum(sizes)
    reduced = _collective_of_concatenation(
        computation,
        index,
        members,
        "all-reduce",
        flats,
        concat_dimension=0,
        joined_shape=_vector(reduce_type, total),
        result_shape=_vector(reduce_type, total),
    )
    if reduce_type != element_type:
        _widen_reducer(module, reduced, members, reduce_type)
    for member, (start, limit) in zip(members, _column_ranges(sizes), strict=True):
        piece = _slice(
            computation, member, reduced, _vector(reduce_type, limit - start), [(start, limit)]
        )
        restored = _flat_piece_as_result(computation, member, piece, element_type)
        replaced.add(computation, member, restored)
    return reduced.id


def _all_reduce_size(module: HloModule, member) -> int:
    """How many elements an all-reduce member sends; it must have one array operand."""
    if len(member.operands) != 1 or member.shape.is_tuple:
        raise DiscoInputError(module.source, f"{member.name!r} is a variadic all-reduce")
    return math.prod(member.shape.dims)


def _flat_operand(computation, member, reduce_type: int) -> int:
    """The id of `member`'s operand as a vector of `reduce_type`: converted first
    when the bucket reduces in another type (next to its producer's own
    rounding), then reshaped to one dimension."""
    operand = member.operands[0].id
    if reduce_type != member.proto.shape.element_type:
        wide = edit.add_instruction(
            computation,
            f"{member.name}.wide",
            "convert",
            _array(reduce_type, list(member.shape.dims)),
            [operand],
        )
        operand = wide.id
    size = math.prod(member.shape.dims)
    flat = edit.add_instruction(
        computation, f"{member.name}.flat", "reshape", _vector(reduce_type, size), [operand]
    )
    return flat.id


def _widen_reducer(module: HloModule, reduced, members, reduce_type: int) -> None:
    """Give the bucket's all-reduce its members' reducer, over `reduce_type`
    (f32 for a widened bucket) in place of their narrow one."""
    reducer = members[0].called_computations[0].root.opcode
    del reduced.called_computation_ids[:]
    reduced.called_computation_ids.append(
        edit.add_scalar_reducer(module.proto, reduce_type, reducer)
    )


def _flat_piece_as_result(computation, member, piece, element_type: int):
    """A vector slice of the bucket's all-reduce as `member`'s result: converted
    back to `element_type` if the bucket was widened, then reshaped."""
    if piece.shape.element_type != element_type:
        piece = edit.add_instruction(
            computation,
            f"{member.name}.narrow",
            "convert",
            _vector(element_type, piece.shape.dimensions[0]),
            [piece.id],
        )
    return edit.add_instruction(
        computation, f"{member.name}.restored", "reshape", member.proto.shape, [piece.id]
    )


def _concatenate_reduce_scatters(
    module: HloModule, index: int, members, replaced: _PendingReplacements
) -> int:
    """One reduce-scatter for a bucket of them (see the module's docstring): each
    member's operand as [p, n/p] rows, the rows concatenated to [p, N/p] and
    scattered over dimension 0, and each member's columns turned back into its
    block."""
    computation = members[0].computation
    element_type = members[0].proto.shape.element_type
    rows, columns = _scatter_rows_and_columns(module, members)
    blocks = [
        _operand_as_rows(computation, member, element_type, rows, width)
        for member, width in zip(members, columns, strict=True)
    ]
    total = sum(columns)
    reduced = _collective_of_concatenation(
        computation,
        index,
        members,
        "reduce-scatter",
        blocks,
        concat_dimension=1,
        joined_shape=_array(element_type, [rows, total]),
        result_shape=_array(element_type, [1, total]),
    )
    reduced.dimensions.append(0)
    for member, (start, limit) in zip(members, _column_ranges(columns), strict=True):
        piece_shape = _array(element_type, [1, limit - start])
        piece = _slice(computation, member, reduced, piece_shape, [(0, 1), (start, limit)])
        restored = _block_as_result(computation, piece, member)
        replaced.add(computation, member, restored)
    return reduced.id


def _scatter_rows_and_columns(module: HloModule, members) -> tuple[int, list[int]]:
    """p, the devices every member scatters over (each must scatter one array
    operand over one dimension, all over the same p), and each member's n/p."""
    template = members[0].proto
    rows, columns = None, []
    for member in members:
        if len(member.operands) != 1 or member.shape.is_tuple or len(template.dimensions) != 1:
            raise DiscoInputError(module.source, f"{member.name!r} is a variadic reduce-scatter")
        dims = list(member.operands[0].shape.dims)
        dimension = member.proto.dimensions[0]
        devices = dims[dimension] // member.shape.dims[dimension]
        if rows not in (None, devices):
            raise DiscoInputError(module.source, f"{member.name!r} scatters over other devices")
        rows = devices
        columns.append(math.prod(dims) // devices)
    return rows, columns


def _operand_as_rows(computation, member, element_type: int, rows: int, width: int) -> int:
    """The id of `member`'s operand as [p, n/p]: its scattered dimension moved
    first, then reshaped so row r is device r's block."""
    front = _scattered_dimension_first(computation, member.operands[0], member)
    return edit.add_instruction(
        computation, f"{member.name}.rows", "reshape", _array(element_type, [rows, width]), [front]
    ).id


def _collective_of_concatenation(
    computation,
    index: int,
    members,
    opcode: str,
    pieces: list[int],
    concat_dimension: int,
    joined_shape,
    result_shape,
):
    """Bucket `index`'s collective: `pieces` concatenated along `concat_dimension`
    (to `joined_shape`), then one `opcode` collective over the result, named
    `BUCKET_MARK.index` and with its members' fields (`_copy_collective_fields`)."""
    joined = edit.add_instruction(
        computation, f"{BUCKET_MARK}.{index}.concat", "concatenate", joined_shape, pieces
    )
    joined.dimensions.append(concat_dimension)
    reduced = edit.add_instruction(
        computation, f"{BUCKET_MARK}.{index}", opcode, result_shape, [joined.id]
    )
    _copy_collective_fields(reduced, members[0].proto, index, members)
    return reduced


def _column_ranges(widths: list[int]) -> list[tuple[int, int]]:
    """Each member's [start, limit) along the concatenated dimension."""
    ranges, offset = [], 0
    for width in widths:
        ranges.append((offset, offset + width))
        offset += width
    return ranges


def _slice(computation, member, reduced, shape, ranges: list[tuple[int, int]]):
    """`member`'s piece of the bucket's collective: a slice to `shape` with one
    [start, limit) (stride 1) per dimension."""
    piece = edit.add_instruction(computation, f"{member.name}.piece", "slice", shape, [reduced.id])
    for start, limit in ranges:
        piece.slice_dimensions.add(start=start, limit=limit, stride=1)
    return piece


def _permutation(member) -> list[int]:
    """The dimension order that puts a reduce-scatter's scattered dimension first."""
    dimension = member.proto.dimensions[0]
    rank = len(member.shape.dims)
    return [dimension] + [d for d in range(rank) if d != dimension]


def _scattered_dimension_first(computation, operand, member) -> int:
    """The id of `operand` with `member`'s scattered dimension moved first."""
    order = _permutation(member)
    if order == sorted(order):
        return operand.id
    dims = [operand.shape.dims[d] for d in order]
    shape = _array(member.proto.shape.element_type, dims)
    return _transpose(computation, f"{member.name}.front", operand.id, shape, order).id


def _block_as_result(computation, piece, member):
    """A [1, n] slice of the bucket's result as `member`'s result: its block with
    the scattered dimension first, then transposed back."""
    order = _permutation(member)
    if order == sorted(order):
        return edit.add_instruction(
            computation, f"{member.name}.restored", "reshape", member.proto.shape, [piece.id]
        )
    dims = [member.shape.dims[d] for d in order]
    block = edit.add_instruction(
        computation,
        f"{member.name}.block",
        "reshape",
        _array(member.proto.shape.element_type, dims),
        [piece.id],
    )
    back = [order.index(d) for d in range(len(order))]
    return _transpose(computation, f"{member.name}.restored", block.id, member.proto.shape, back)


def _transpose(computation, name: str, operand_id: int, shape, permutation: list[int]):
    """A transpose of `operand_id` to `shape`: result dimension i is the
    operand's dimension permutation[i]."""
    moved = edit.add_instruction(computation, name, "transpose", shape, [operand_id])
    moved.dimensions.extend(permutation)
    return moved


def _copy_collective_fields(reduced, template, index: int, members) -> None:
    """The bucket's collective takes its members' reducer, channel and device
    groups, and names them in its op_name."""
    reduced.channel_id = template.channel_id
    reduced.use_global_device_ids = template.use_global_device_ids
    # The device groups, in whichever of XLA's forms the template has them.
    for field in GROUP_FIELDS:
        if template.HasField(field):
            getattr(reduced, field).CopyFrom(getattr(template, field))
    reduced.replica_groups.extend(template.replica_groups)
    reduced.called_computation_ids.extend(template.called_computation_ids)
    reduced.metadata.op_name = f"{BUCKET_MARK}/{index}: " + ",".join(m.name for m in members)


def _order_after(computation, instruction_id: int, predecessor_id: int) -> None:
    for proto in computation.proto.instructions:
        if proto.id == instruction_id and predecessor_id not in proto.control_predecessor_ids:
            proto.control_predecessor_ids.append(predecessor_id)


def _vector(element_type: int, size: int):
    return _array(element_type, [size])


def _array(element_type: int, dims: list[int]):
    """An array ShapeProto with the default (row-major) layout."""
    shape = ShapeProto(element_type=element_type, dimensions=dims)
    shape.layout.minor_to_major.extend(reversed(range(len(dims))))
    return shape
