"""Steps that XLA's SPMD partitioner splits (jax.jit with sharded arguments):
captured after partitioning, their all-reduces found with the partitioner's
mesh-axes device groups, and run as replicas bit-equal to JAX's own executable."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from disco_xla.capture import capture_jax
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.partitions_as_replicas import (
    NotPartitionedError,
    PartitionsAsReplicas,
)
from disco_xla.runtime.xla_runner import ReplicatedProgram, program_for


def _sharded_step():
    """A 2-layer MLP step over 4 devices: weights replicated, batch split. The
    gather by a sharded index makes the partitioner emit `partition-id`."""
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    whole, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def step(params, x, y, rows):
        def loss(p):
            hidden = jnp.tanh(x @ p["w1"] + p["b1"])
            picked = jnp.take(p["table"], rows, axis=0)
            return jnp.mean((hidden @ p["w2"] + picked - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), value

    rng = np.random.default_rng(0)
    params = {
        "w1": rng.standard_normal((16, 32)).astype(np.float32) * 0.2,
        "b1": np.zeros(32, np.float32),
        "w2": rng.standard_normal((32, 4)).astype(np.float32) * 0.2,
        "table": rng.standard_normal((10, 4)).astype(np.float32),
    }
    args = (
        jax.device_put(params, whole),
        jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), split),
        jax.device_put(rng.standard_normal((8, 4)).astype(np.float32), split),
        jax.device_put(rng.integers(0, 10, (8,)).astype(np.int32), split),
    )
    return jax.jit(step), args


@pytest.fixture(scope="module")
def sharded():
    fn, args = _sharded_step()
    return fn, args, capture_jax(fn, *args)


def test_the_lowered_step_has_no_all_reduce_and_the_captured_one_has_every_gradient(sharded):
    fn, args, module = sharded
    lowered = HloModule.from_bytes(
        fn.lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    )
    assert not lowered.all_reduces and lowered.needs_partitioning
    assert module.already_partitioned and not module.needs_partitioning
    # One all-reduce per parameter tensor (w1, b1, w2, table), and the loss's.
    gradients = module.gradient_all_reduces
    assert len(gradients) == 4, [a.name for a in module.all_reduces]
    # The partitioner writes device groups as mesh axes; each spans the 4 devices.
    assert all(a.group_size == 4 and a.scope == "global" for a in gradients)
    assert module.device_counts() == {"num_replicas": 1, "num_partitions": 4}
    # Shapes are one device's: the batch of 8 split over 4.
    batch = [i for i in module.entry.instructions if i.opcode == "parameter"][-1]
    assert batch.shape.dims[0] == 2


def test_the_pass_turns_partitions_into_replicas_and_only_once(sharded):
    _, _, module = sharded
    copy = HloModule.from_bytes(module.to_bytes())
    assert any(i.opcode == "partition-id" for i in copy.instructions())
    assert PartitionsAsReplicas().run(copy)
    assert not any(i.opcode == "partition-id" for i in copy.instructions())
    assert copy.device_counts() == {"num_replicas": 4, "num_partitions": 1}
    assert not copy.already_partitioned
    assert not PartitionsAsReplicas().run(copy)  # nothing left to do


def test_run_as_replicas_it_is_bit_equal_to_jax_own_executable(sharded):
    fn, args, module = sharded
    expected = jax.tree_util.tree_leaves(fn(*args))
    program = program_for(module)
    assert isinstance(program, ReplicatedProgram) and len(program.devices) == 4
    # Each replica gets its own device's shard of every argument.
    leaves = jax.tree_util.tree_leaves(args)
    per_device = [
        [np.asarray(leaf.addressable_shards[d].data) for leaf in leaves] for d in range(4)
    ]
    outputs = program.run(per_device)
    for device in range(4):
        for got, want in zip(outputs[device], expected, strict=True):
            np.testing.assert_array_equal(got, np.asarray(want.addressable_shards[device].data))


def test_a_pmap_module_is_left_to_the_partitioner():
    from disco_xla.demo import build_step

    step, args, _ = build_step()
    module = capture_jax(step, *args)
    assert not module.already_partitioned and not module.needs_partitioning
    copy = HloModule.from_bytes(module.to_bytes())
    assert not PartitionsAsReplicas().run(copy)
    assert copy.to_bytes() == HloModule.from_bytes(module.to_bytes()).to_bytes()


def test_a_partitioned_module_with_cross_replica_collectives_is_refused(sharded):
    _, _, module = sharded
    copy = HloModule.from_bytes(module.to_bytes())
    for instr in copy.instructions():
        if instr.opcode == "all-reduce":
            instr.proto.channel_id = 0  # now cross-replica only, beside 4 partitions
            break
    copy.rebuild()
    with pytest.raises(NotPartitionedError, match="cross-replica collective"):
        PartitionsAsReplicas().run(copy)


def test_an_all_to_all_over_a_permuted_mesh_axis_exchanges_with_the_right_partners():
    """On a 2x2 mesh the partitioner writes the fsdp axis's groups over a mesh
    whose device order is permuted (`device_ids=([2,2]T(1,0))`); as replicas
    they must become the groups {0,1},{2,3}, not {0,2},{1,3}."""
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "fsdp"))
    rows, columns = NamedSharding(mesh, P("fsdp", None)), NamedSharding(mesh, P(None, "fsdp"))

    def reshard(x):
        return jax.lax.with_sharding_constraint(jnp.sin(x), columns) * 2

    fn = jax.jit(reshard, in_shardings=rows, out_shardings=columns)
    x = jax.device_put(np.arange(64, dtype=np.float32).reshape(8, 8), rows)
    module = capture_jax(fn, x)
    (exchange,) = [i for i in module.instructions() if i.opcode == "all-to-all"]
    assert exchange.proto.mesh_axes_replica_group_list.mesh.HasField("iota_device_ids")
    from disco_xla.hlo.collectives import device_groups

    assert device_groups(exchange.proto) == ((0, 1), (2, 3))
    expected = fn(x)
    program = program_for(module)
    outputs = program.run([[np.asarray(x.addressable_shards[d].data)] for d in range(4)])
    for device in range(4):
        np.testing.assert_array_equal(
            outputs[device][0], np.asarray(expected.addressable_shards[device].data)
        )


# One partition's program of two: it reads its partition id, and sums over the
# partitions (a channel, partition ids as device groups).
PARTITIONED = """HloModule partitioned

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[4] parameter(0)
  id = u32[] partition-id()
  f = f32[] convert(id)
  spread = f32[4] broadcast(f), dimensions={}
  y = f32[4] add(x, spread)
  ROOT r = f32[4] all-reduce(y), channel_id=1, replica_groups={{0,1}}, to_apply=sum
}
"""


def test_the_pass_on_a_small_partitioned_module_and_on_one_that_is_not():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(PARTITIONED, "partitioned")
    assert module.already_partitioned
    assert PartitionsAsReplicas().run(module)
    opcodes = module.opcode_histogram()
    assert opcodes["replica-id"] == 1 and "partition-id" not in opcodes
    reduced = module.entry.root
    assert reduced.proto.channel_id == 1 and reduced.proto.use_global_device_ids
    assert module.device_counts() == {"num_replicas": 2, "num_partitions": 1}
    before = module.to_bytes()
    assert not PartitionsAsReplicas().run(module)
    assert module.to_bytes() == before
