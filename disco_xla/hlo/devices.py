"""How many devices a module runs on, and whether XLA's SPMD partitioner has
split it or will (an analysis over the IR; it changes nothing). A module proto
carries no compile configuration, so the counts come from its device
assignment when present, else from its shardings and its collectives' device
groups."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from disco_xla.hlo.collectives import collective_scope, replica_group_sizes
from disco_xla.hlo.opcodes import ALL_REDUCE_OPCODES, COLLECTIVE_OPCODES

if TYPE_CHECKING:
    from disco_xla.hlo.graph import HloModule


def device_counts(module: HloModule) -> dict[str, int]:
    """num_replicas and num_partitions. A module proto carries no config, so
    they come from the device assignment when present, else from the shardings
    and the collectives' device groups."""
    assignment = module.proto.device_assignment
    if assignment.replica_count or assignment.computation_count:
        return {
            "num_replicas": max(1, assignment.replica_count),
            "num_partitions": max(1, assignment.computation_count),
        }
    partitions = 1
    replica_devices = partition_devices = global_devices = 1
    for instr in module.instructions():
        proto = instr.proto
        if proto.HasField("sharding"):
            partitions = max(partitions, _sharding_devices(proto.sharding))
        if instr.opcode in ALL_REDUCE_OPCODES or instr.opcode in (
            "all-gather",
            "reduce-scatter",
            "all-to-all",
        ):
            _, devices = replica_group_sizes(proto)
            scope = collective_scope(proto)
            if scope == "replica":
                replica_devices = max(replica_devices, devices or 1)
            elif scope == "partition":
                partition_devices = max(partition_devices, devices or 1)
            else:
                global_devices = max(global_devices, devices or 1)
    partitions = max(partitions, partition_devices)
    replicas = replica_devices
    if global_devices > partitions * replicas:
        if partitions > 1:
            replicas = max(replicas, global_devices // partitions)
        else:
            partitions = global_devices
    return {"num_replicas": replicas, "num_partitions": partitions}


def already_partitioned(module: HloModule) -> bool:
    """Whether this is one partition's program, as XLA's SPMD partitioner
    leaves it (an `after_spmd-partitioning` dump, or a sharded `jax.jit` step
    captured after partitioning): several partitions, cross-partition
    collectives or `partition-id`, and no sharding custom-calls left for a
    partitioner (`jax.pmap` and `shard_map` modules have those). Such a
    module must not be partitioned again."""
    if device_counts(module)["num_partitions"] < 2:
        return False
    partitioned = False
    for instr in module.instructions():
        if instr.opcode == "custom-call" and _is_partitioner_marker(instr.proto.custom_call_target):
            return False
        if instr.opcode == "partition-id" or (
            instr.opcode in COLLECTIVE_OPCODES and instr.proto.channel_id
        ):
            partitioned = True
    return partitioned


def needs_partitioning(module: HloModule) -> bool:
    """Whether XLA's SPMD partitioner will split this module over several
    devices by its shardings alone (a `jax.jit` step with sharded arguments
    before XLA compiles it): several partitions and no collective written yet.
    A manual region (`shard_map` and `pmap` keep theirs in
    `xla.sdy.manual_computation_body` computations) whose user wrote
    collectives is the user's partitioning; one without any (a library call
    run on each device's shard inside a sharded step) is not. Its gradient
    all-reduces appear only after partitioning."""
    if device_counts(module)["num_partitions"] < 2 or already_partitioned(module):
        return False
    manual = any("manual_computation" in c.name for c in module.computations)
    if manual and not any(_is_partitioner_marker_call(i) for i in module.instructions()):
        return False
    return not any(instr.opcode in COLLECTIVE_OPCODES for instr in module.instructions())


def _is_partitioner_marker_call(instr) -> bool:
    """A sharding annotation outside manual regions: what a `jax.jit` step
    with sharded arguments carries (`FuncResultSharding` and the like)."""
    return instr.opcode == "custom-call" and instr.proto.custom_call_target in (
        "xla.sdy.FuncResultSharding",
        "Sharding",
    )


def _is_partitioner_marker(target: str) -> bool:
    """Custom-calls that a module before SPMD partitioning carries (manual
    regions of shard_map/pmap, sharding annotations)."""
    return target.startswith("xla.sdy.") or target in (
        "Sharding",
        "SPMDFullToShardShape",
        "SPMDShardToFullShape",
    )


def _sharding_devices(sharding) -> int:
    if sharding.tuple_shardings:
        return max(_sharding_devices(s) for s in sharding.tuple_shardings)
    if sharding.type == 3:  # OTHER: tiled over devices
        if sharding.tile_assignment_devices:
            return len(sharding.tile_assignment_devices)
        return math.prod(max(d, 1) for d in sharding.tile_assignment_dimensions)
    return 1
