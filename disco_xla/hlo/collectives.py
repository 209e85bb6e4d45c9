"""What a collective instruction does, as the IR reads it: its kind, the bytes
it moves, its reduction, its scope, and its device groups in whichever form
XLA wrote them (explicit lists, iota lists, mesh axes)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from disco_xla.hlo.graph import Instruction


def collective_kind(instr: Instruction) -> str:
    """What a collective instruction does, whether written in one piece or as an
    asynchronous start: 'all-reduce', 'all-gather', 'reduce-scatter',
    'all-to-all', 'collective-permute' or 'collective-broadcast'."""
    opcode = instr.opcode.removesuffix("-start")
    return "all-to-all" if opcode == "ragged-all-to-all" else opcode


def collective_bytes(instr: Instruction) -> int:
    """The size of the whole buffer a collective moves, which the communication
    model reads: the result of an all-reduce, all-gather, all-to-all or permute,
    the operand of a reduce-scatter (the larger of operand and result). The
    result of an asynchronous start other than all-reduce's is a tuple of its
    operands, its results and scratch values: element 1 is the result."""
    operand_bytes = sum(operand.shape.bytes for operand in instr.operands)
    shape = instr.shape
    if instr.opcode.endswith("-start") and instr.opcode != "all-reduce-start":
        if shape.is_tuple and len(shape.tuple_shapes) >= 2:
            shape = shape.tuple_shapes[1]
    return max(operand_bytes, shape.bytes)


_REDUCTION_BY_ROOT = {"add": "sum", "maximum": "max", "minimum": "min", "multiply": "product"}


def reduction_kind(instr: Instruction) -> str:
    if not instr.called_computations:
        return "unknown"
    root = instr.called_computations[0].root
    return _REDUCTION_BY_ROOT.get(root.opcode, root.opcode)


def collective_scope(proto) -> str:
    if not proto.channel_id:
        return "replica"
    return "global" if proto.use_global_device_ids else "partition"


def replica_group_sizes(proto) -> tuple[int | None, int | None]:
    """(devices per group, highest device id + 1) of a collective; (None, None)
    when the groups are empty, which means all devices in one group."""
    groups = None
    iota = None
    device_list = proto.collective_device_list
    if device_list.replica_groups:
        groups = device_list.replica_groups
    elif device_list.iota_replica_group_list.num_devices_per_group:
        iota = device_list.iota_replica_group_list
    elif proto.replica_groups:
        groups = proto.replica_groups
    elif proto.iota_collective_device_list.num_devices_per_group:
        iota = proto.iota_collective_device_list
    if iota is None and proto.mesh_axes_replica_group_list.HasField("mesh"):
        return _mesh_axes_sizes(proto.mesh_axes_replica_group_list)
    if iota is not None:
        per_group = iota.num_devices_per_group
        return per_group, max(1, iota.num_replica_groups) * per_group
    if not groups:
        return None, None
    ids = [list(g.replica_ids) for g in groups]
    largest = max((max(g) for g in ids if g), default=0)
    return max(len(g) for g in ids), largest + 1


def device_groups(proto) -> tuple:
    """The device groups of a collective as a tuple of device-id tuples, so that
    groups written in different forms (explicit lists, iota lists, mesh axes with
    or without size-1 axes) compare equal when they are the same; () when the
    groups are empty (all devices in one group)."""
    device_list = proto.collective_device_list
    if device_list.replica_groups:
        return tuple(tuple(g.replica_ids) for g in device_list.replica_groups)
    for iota in (device_list.iota_replica_group_list, proto.iota_collective_device_list):
        if iota.num_devices_per_group:
            ids = np.arange(math.prod(iota.iota_reshape_dims)).reshape(iota.iota_reshape_dims)
            ids = ids.transpose(list(iota.iota_transpose_perm) or None)
            return tuple(map(tuple, ids.reshape(-1, iota.num_devices_per_group).tolist()))
    if proto.mesh_axes_replica_group_list.HasField("mesh"):
        return _mesh_axes_key(proto.mesh_axes_replica_group_list)
    return tuple(tuple(g.replica_ids) for g in proto.replica_groups)


def _mesh_axes_key(groups) -> tuple:
    """The device groups of mesh-axes groups: a group holds the devices that
    differ only along the listed axes."""
    sizes = [max(axis.size, 1) for axis in groups.mesh.axes]
    if any(axis.HasField("sub_axis_info") for axis in groups.axes):
        # Parts of axes: keep the written form (equal only when written alike).
        return (groups.SerializeToString(deterministic=True),)
    mesh = groups.mesh
    if mesh.device_ids:
        ids = np.array(list(mesh.device_ids))
    elif mesh.HasField("iota_device_ids"):
        iota = mesh.iota_device_ids
        ids = np.arange(math.prod(sizes)).reshape(list(iota.reshape_dims))
        ids = ids.transpose(list(iota.transpose_perm) or None)
    else:
        ids = np.arange(math.prod(sizes))
    ids = ids.reshape(sizes)
    spanned = [axis.mesh_axis_index for axis in groups.axes]
    others = [index for index in range(len(sizes)) if index not in spanned]
    per_group = math.prod(sizes[index] for index in spanned)
    ids = ids.transpose(others + spanned).reshape(-1, per_group)
    return tuple(map(tuple, ids.tolist()))


def _mesh_axes_sizes(groups) -> tuple[int, int]:
    """(devices per group, devices) of groups given as axes of a device mesh:
    a group spans the listed axes (or parts of them) and the others tell the
    groups apart."""
    sizes = [max(axis.size, 1) for axis in groups.mesh.axes]
    per_group = 1
    for axis in groups.axes:
        if axis.HasField("sub_axis_info") and axis.sub_axis_info.size:
            per_group *= axis.sub_axis_info.size
        elif 0 <= axis.mesh_axis_index < len(sizes):
            per_group *= sizes[axis.mesh_axis_index]
    return per_group, math.prod(sizes)


def gathered_devices(member: Instruction) -> int:
    """p, the devices an all-gather of one array over one dimension gathers
    from (its result's gathered dimension over its operand's); 0 for any other
    all-gather (variadic, or over several dimensions)."""
    proto = member.proto
    if len(member.operands) != 1 or member.shape.is_tuple or len(proto.dimensions) != 1:
        return 0
    dimension = proto.dimensions[0]
    shard = member.operands[0].shape.dims[dimension]
    return member.shape.dims[dimension] // shard if shard else 0
