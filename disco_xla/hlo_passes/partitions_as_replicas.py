"""Pass: run one partition's program as N replicas, so that XLA compiles it as it is.

A module that XLA's SPMD partitioner has already produced (a sharded `jax.jit`
step captured after partitioning, or an `after_spmd-partitioning` dump) is the
program of one partition. XLA:CPU will not compile it with N partitions unless
SPMD partitioning is on, and with it on the partitioner runs again: it fails on
`partition-id` ("PartitionId instruction is not supported for SPMD
partitioning"), or it shards the already-sharded parameters a second time.

As N replicas with one partition each, the same program compiles with no
partitioner at all. What changes, and why it computes the same:
- `partition-id` becomes `replica-id`: replica i runs where partition i ran.
- The cross-partition collectives keep their channels and device groups. Their
  groups name global device ids (`use_global_device_ids`), which with one
  partition per replica are the replica ids, the same numbers as before.
- Shardings are dropped: they describe how the partitioner split the program,
  which is already done.
- The device assignment records N replicas and one partition.
Measured on a sharded 2-layer MLP step on 4 CPU devices: the outputs are
bit-equal to JAX's own executable (tests/hlo_passes/test_partitions_as_replicas.py).

Collectives without a channel (cross-replica only) would change meaning, since
the module's replicas were 1; a module that has them alongside several
partitions is refused.
"""

from __future__ import annotations

from disco_xla.hlo_passes.graph import COLLECTIVE_OPCODES, HloModule

NAME = "partitions-as-replicas"


class NotPartitionedError(ValueError):
    """The module is not one partition's program of an SPMD-partitioned step."""


def partitions_as_replicas(module: HloModule) -> bool:
    """Run the pass on an already-partitioned module (`module.already_partitioned`);
    returns whether it changed (False for any other module)."""
    if not module.already_partitioned:
        return False
    counts = module.device_counts()
    if counts["num_replicas"] > 1:
        raise NotPartitionedError(
            f"{module.source}: {counts['num_replicas']} replicas of "
            f"{counts['num_partitions']} partitions each cannot run as replicas alone"
        )
    for instr in module.instructions():
        proto = instr.proto
        if instr.opcode in COLLECTIVE_OPCODES and not proto.channel_id:
            raise NotPartitionedError(
                f"{module.source}: {instr.name} is a cross-replica collective in a "
                "partitioned module"
            )
        if instr.opcode == "partition-id":
            proto.opcode = "replica-id"
        proto.ClearField("sharding")
    assignment = module.proto.device_assignment
    assignment.Clear()
    assignment.replica_count = counts["num_partitions"]
    assignment.computation_count = 1
    assignment.computation_devices.add().replica_device_ids.extend(range(counts["num_partitions"]))
    module.rebuild()
    return True
