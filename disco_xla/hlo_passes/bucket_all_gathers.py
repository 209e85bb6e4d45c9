"""Pass: concat-bucketing of all-gathers (the parameter all-gathers of an FSDP
step), as a plan's all-gather buckets say.

For a bucket of several all-gathers over the same groups of p devices: each
member's operand (its device's shard, of n elements) is reshaped to [1, n], the
rows are concatenated to [1, N], and one all-gather over dimension 0 gives
[p, N], row r being device r's shards. Each member's columns [p, n] are then
reshaped to [p, shard...], its gathered dimension's blocks moved next to that
dimension (a transpose, unless it gathers dimension 0) and merged into the
member's result shape. An all-gather moves data and computes nothing, so the
bucket is bit for bit the members.

Consecutive buckets of one computation are chained by control dependencies, so
that the program sends them in the plan's order (a loop body's buckets among
themselves: a control dependency cannot cross a computation). A bucket of one
keeps its all-gather, and only takes its place in that order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import edit
from disco_xla.hlo.collectives import gathered_devices
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.concatenated_collectives import (
    PendingReplacements,
    array_shape,
    bucket_in_order,
    collective_of_concatenation,
    column_ranges,
    slice_of,
    transpose,
)

GATHER_BUCKET_MARK = "disco_xla.gather_bucket"


class BucketAllGathers:
    """The pass (`pass_interface.HloPass`). `all_gather_buckets` are a plan's
    all-gather buckets in order, each a tuple of the names of the all-gathers it
    sends together; bucket k's all-gather is named `GATHER_BUCKET_MARK.k`."""

    name = "bucket-all-gathers"

    def __init__(self, all_gather_buckets: Sequence[tuple[str, ...]]):
        self.all_gather_buckets = tuple(tuple(bucket) for bucket in all_gather_buckets)

    def run(self, module: HloModule) -> bool:
        """Bucket the all-gathers (named in `module`, a valid plan's); returns
        whether the module changed."""
        return bucket_in_order(module, self.all_gather_buckets, _concatenate_all_gathers)


def _concatenate_all_gathers(
    module: HloModule, index: int, members, replaced: PendingReplacements
) -> int:
    """One all-gather for a bucket of them (see the module's docstring)."""
    computation = members[0].computation
    element_type = members[0].proto.shape.element_type
    devices = {gathered_devices(member) for member in members}
    if len(devices) != 1 or 0 in devices:
        raise DiscoInputError(
            module.source,
            f"all-gather bucket {index} holds all-gathers that gather unlike: "
            + ", ".join(member.name for member in members),
        )
    (rows,) = devices
    widths = [math.prod(member.operands[0].shape.dims) for member in members]
    flats = [
        edit.add_instruction(
            computation,
            f"{member.name}.row",
            "reshape",
            array_shape(element_type, [1, width]),
            [member.operands[0].id],
        ).id
        for member, width in zip(members, widths, strict=True)
    ]
    total = sum(widths)
    gathered = collective_of_concatenation(
        computation,
        f"{GATHER_BUCKET_MARK}.{index}",
        members,
        "all-gather",
        flats,
        concat_dimension=1,
        joined_shape=array_shape(element_type, [1, total]),
        result_shape=array_shape(element_type, [rows, total]),
    )
    gathered.dimensions.append(0)
    for member, (start, limit) in zip(members, column_ranges(widths), strict=True):
        piece_shape = array_shape(element_type, [rows, limit - start])
        piece = slice_of(computation, member, gathered, piece_shape, [(0, rows), (start, limit)])
        replaced.add(computation, member, _columns_as_result(computation, member, piece, rows))
    return gathered.id


def _columns_as_result(computation, member, piece, rows: int):
    """A member's [p, n] columns as its result: row r is device r's shard, so
    the rows are the blocks of the gathered dimension."""
    dimension = member.proto.dimensions[0]
    element_type = member.proto.shape.element_type
    if dimension == 0:
        return edit.add_instruction(
            computation, f"{member.name}.restored", "reshape", member.proto.shape, [piece.id]
        )
    shard = list(member.operands[0].shape.dims)
    blocks = edit.add_instruction(
        computation,
        f"{member.name}.blocks",
        "reshape",
        array_shape(element_type, [rows, *shard]),
        [piece.id],
    )
    # [p, s0, .., sk] -> [s0, .., p, s_d, .., sk]: the blocks just before dimension d.
    order = [*range(1, dimension + 1), 0, *range(dimension + 1, len(shard) + 1)]
    moved_dims = [rows if source == 0 else shard[source - 1] for source in order]
    moved = transpose(
        computation,
        f"{member.name}.blocks_in_place",
        blocks.id,
        array_shape(element_type, moved_dims),
        order,
    )
    return edit.add_instruction(
        computation, f"{member.name}.restored", "reshape", member.proto.shape, [moved.id]
    )
