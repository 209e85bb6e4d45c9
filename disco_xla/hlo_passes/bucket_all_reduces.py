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
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.shapes import F32_TYPE
from disco_xla.hlo_passes.concatenated_collectives import (
    PendingReplacements,
    array_shape,
    bucket_in_order,
    collective_of_concatenation,
    column_ranges,
    slice_of,
    transpose,
    vector_shape,
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
        return bucket_in_order(module, self.all_reduce_buckets, self._concatenate)

    def _concatenate(self, module: HloModule, index: int, members, replaced) -> int:
        if members[0].opcode == "reduce-scatter":
            return _concatenate_reduce_scatters(module, index, members, replaced)
        return _concatenate_bucket(module, index, members, self.widen_narrow_floats, replaced)


def _concatenate_bucket(
    module: HloModule, index: int, members, widen: bool, replaced: PendingReplacements
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
    reduced = collective_of_concatenation(
        computation,
        f"{BUCKET_MARK}.{index}",
        members,
        "all-reduce",
        flats,
        concat_dimension=0,
        joined_shape=vector_shape(reduce_type, total),
        result_shape=vector_shape(reduce_type, total),
    )
    if reduce_type != element_type:
        _widen_reducer(module, reduced, members, reduce_type)
    for member, (start, limit) in zip(members, column_ranges(sizes), strict=True):
        piece = slice_of(
            computation, member, reduced, vector_shape(reduce_type, limit - start), [(start, limit)]
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
            array_shape(reduce_type, list(member.shape.dims)),
            [operand],
        )
        operand = wide.id
    size = math.prod(member.shape.dims)
    flat = edit.add_instruction(
        computation, f"{member.name}.flat", "reshape", vector_shape(reduce_type, size), [operand]
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
            vector_shape(element_type, piece.shape.dimensions[0]),
            [piece.id],
        )
    return edit.add_instruction(
        computation, f"{member.name}.restored", "reshape", member.proto.shape, [piece.id]
    )


def _concatenate_reduce_scatters(
    module: HloModule, index: int, members, replaced: PendingReplacements
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
    reduced = collective_of_concatenation(
        computation,
        f"{BUCKET_MARK}.{index}",
        members,
        "reduce-scatter",
        blocks,
        concat_dimension=1,
        joined_shape=array_shape(element_type, [rows, total]),
        result_shape=array_shape(element_type, [1, total]),
    )
    reduced.dimensions.append(0)
    for member, (start, limit) in zip(members, column_ranges(columns), strict=True):
        piece_shape = array_shape(element_type, [1, limit - start])
        piece = slice_of(computation, member, reduced, piece_shape, [(0, 1), (start, limit)])
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
        computation,
        f"{member.name}.rows",
        "reshape",
        array_shape(element_type, [rows, width]),
        [front],
    ).id


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
    shape = array_shape(member.proto.shape.element_type, dims)
    return transpose(computation, f"{member.name}.front", operand.id, shape, order).id


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
        array_shape(member.proto.shape.element_type, dims),
        [piece.id],
    )
    back = [order.index(d) for d in range(len(order))]
    return transpose(computation, f"{member.name}.restored", block.id, member.proto.shape, back)
