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
- The cross-partition collectives keep their device groups. Where the groups
  name global device ids (`use_global_device_ids`), those are the replica ids
  now, the same numbers as before. Where they name partition ids (no global
  ids), an all-reduce, all-gather or reduce-scatter is told that they are
  global ids, and an all-to-all or collective-permute loses its channel, which
  makes its groups (or pairs) replica ids: again the same numbers.
- Device groups written as axes of a device mesh become the explicit list of
  groups they stand for (XLA:CPU does not honour a mesh's permuted device
  order for replicas).
- Shardings are dropped: they describe how the partitioner split the program,
  which is already done.
- The device assignment records N replicas and one partition.
Measured on a sharded 2-layer MLP step on 4 CPU devices: the outputs are
bit-equal to JAX's own executable (tests/hlo_passes/test_partitions_as_replicas.py).

Collectives without a channel (cross-replica only) would change meaning, since
the module has one replica; a module that has them alongside several
partitions is refused.
"""

from __future__ import annotations

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.collectives import device_groups
from disco_xla.hlo.graph import COLLECTIVE_OPCODES, HloModule

# Collectives that can name their groups by global device ids; the others
# (all-to-all, collective-permute, ...) become cross-replica by losing their
# channel, with the same ids.
_GLOBAL_ID_OPCODES = frozenset(
    {"all-reduce", "all-reduce-start", "all-gather", "all-gather-start", "reduce-scatter"}
)


class NotPartitionedError(DiscoInputError):
    """A partitioned module this pass cannot run as replicas: bad input, so the
    CLI reports it in one line with exit code 2."""


def _write_groups_out(instr) -> None:
    """Replace mesh-axes device groups by the explicit list they stand for. As
    replicas, XLA:CPU does not honour a mesh's permuted device order (measured:
    an all-to-all over the second axis of a 2x2 mesh exchanged with the wrong
    partner), and an explicit list means the same in every mode."""
    groups = device_groups(instr.proto)
    if any(not isinstance(group[0], int) for group in groups if group):
        raise NotPartitionedError(
            instr.computation.module.source,
            f"unsupported: {instr.name} has device groups over parts of mesh axes",
        )
    proto = instr.proto
    proto.ClearField("mesh_axes_replica_group_list")
    proto.collective_device_list.Clear()
    for group in groups:
        proto.collective_device_list.replica_groups.add().replica_ids.extend(group)


class PartitionsAsReplicas:
    """The pass (`pass_interface.HloPass`); it takes no configuration."""

    name = "partitions-as-replicas"

    def run(self, module: HloModule) -> bool:
        """Rewrite an already-partitioned module (`module.already_partitioned`)
        as replicas; returns whether it changed (False for any other module)."""
        if not module.already_partitioned:
            return False
        counts = module.device_counts()
        if counts["num_replicas"] > 1:
            raise NotPartitionedError(
                module.source,
                f"unsupported: {counts['num_replicas']} replicas of "
                f"{counts['num_partitions']} partitions each cannot run as replicas alone",
            )
        for instr in module.instructions():
            _as_replica_instruction(instr)
        assignment = module.proto.device_assignment
        assignment.Clear()
        assignment.replica_count = counts["num_partitions"]
        assignment.computation_count = 1
        devices = assignment.computation_devices.add()
        devices.replica_device_ids.extend(range(counts["num_partitions"]))
        module.rebuild()
        return True


def _as_replica_instruction(instr) -> None:
    """Rewrite one instruction of a partitioned module to run as a replica."""
    proto = instr.proto
    if instr.opcode in COLLECTIVE_OPCODES and not proto.channel_id:
        raise NotPartitionedError(
            instr.computation.module.source,
            f"unsupported: {instr.name} is a cross-replica collective in a partitioned module",
        )
    if instr.opcode in COLLECTIVE_OPCODES and proto.HasField("mesh_axes_replica_group_list"):
        _write_groups_out(instr)
    if instr.opcode == "partition-id":
        proto.opcode = "replica-id"
    elif instr.opcode in COLLECTIVE_OPCODES and not proto.use_global_device_ids:
        # Cross-partition groups name partition ids, the replica ids now.
        if instr.opcode in _GLOBAL_ID_OPCODES:
            proto.use_global_device_ids = True
        else:
            proto.channel_id = 0
    proto.ClearField("sharding")
