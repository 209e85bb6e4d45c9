"""The two patterns XLA:GPU's compiler rewrites in any program it is given: the
partitioner's all-reduce + dynamic-slice pairs its reduce-scatter creator turns
into reduce-scatters, and the loop-body collectives its pipeliner sinks into
the next trip."""

from __future__ import annotations

from disco_xla.hlo.collectives import collective_kind
from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.hlo.loops import loop_of_body
from disco_xla.hlo.xla_gpu_patterns import (
    scattered_dimensions,
    scattering_all_reduces,
    sinkable_collectives,
)

# Three all-reduces over groups of 4, each read by one dynamic-slice: one keeps
# the device's own quarter of dimension 0 (the creator's pattern), one keeps
# half, and one a quarter at the wrong offset (device d's block starts at row
# d, not 2d): neither of those is a reduce-scatter.
_PAIRS = """
HloModule pairs, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  p = f32[8,6] parameter(0)
  quarter_sum = f32[8,6] all-reduce(p), channel_id=1,
    replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  half_sum = f32[8,6] all-reduce(p), channel_id=2,
    replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  id = u32[] partition-id()
  two = u32[] constant(2)
  offset = u32[] multiply(id, two)
  zero = u32[] constant(0)
  quarter = f32[2,6] dynamic-slice(quarter_sum, offset, zero), dynamic_slice_sizes={2,6}
  half = f32[4,6] dynamic-slice(half_sum, offset, zero), dynamic_slice_sizes={4,6}
  shifted_sum = f32[8,6] all-reduce(p), channel_id=3,
    replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
  shifted = f32[2,6] dynamic-slice(shifted_sum, id, zero), dynamic_slice_sizes={2,6}
  ROOT out = (f32[2,6], f32[4,6], f32[2,6]) tuple(quarter, half, shifted)
}
"""


def test_the_creator_takes_an_all_reduce_read_as_one_block_of_its_group():
    module = module_from_text(_PAIRS)
    assert scattering_all_reduces(module) == {"quarter_sum"}
    assert scattered_dimensions(module) == {"quarter_sum": 0}
    # Outside a loop nothing is sunk.
    assert sinkable_collectives(module) == frozenset()


def test_an_fsdp_step_has_pairs_the_creator_takes_and_loop_collectives_it_sinks(fsdp_step):
    scattering = scattering_all_reduces(fsdp_step)
    assert scattering, "the partitioner writes its reduce-scatters as all-reduce + slice"
    for name in scattering:
        reduce = fsdp_step.instruction(name)
        (reader,) = reduce.users
        assert reader.opcode == "dynamic-slice"
        assert reader.shape.bytes * 4 == reduce.shape.bytes  # a quarter: groups of 4
    sunk = sinkable_collectives(fsdp_step)
    assert sunk
    for name in sunk:
        instr = fsdp_step.instruction(name)
        assert collective_kind(instr) in ("all-reduce", "reduce-scatter")
        assert loop_of_body(instr.computation) is not None
    # The parameters' all-gathers are read by compute: never sunk.
    gathers = {i.name for i in fsdp_step.instructions() if collective_kind(i) == "all-gather"}
    assert gathers and not gathers & sunk
