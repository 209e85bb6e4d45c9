"""The plan type: JSON round trip, and the verifier's rules one by one."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan, compute_instructions, verify_plan


@pytest.fixture()
def step(captured) -> HloModule:
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def regroup(plan: Plan, groups) -> Plan:
    return dataclasses.replace(plan, fusion_groups=tuple(tuple(g) for g in groups))


def test_unfused_plan_is_legal_and_survives_json(step):
    plan = Plan.unfused(step)
    verify_plan(plan, step)
    assert Plan.from_json(plan.to_json()) == plan
    assert len(plan.all_reduce_buckets) == 4
    assert len(plan.fusion_groups) == len(compute_instructions(step))


def test_plan_for_another_module_is_refused(step, captured):
    other = HloModule.from_bytes(captured["jax_shard_map_step"][0], "other")
    with pytest.raises(DiscoInputError, match="for another module"):
        verify_plan(Plan.unfused(other), step)


def test_fusing_a_producer_with_its_only_user_is_legal(step):
    plan = Plan.unfused(step)
    instructions = compute_instructions(step)
    compute = {id(i) for i in instructions}
    consumer, producer = next(
        (i, o)
        for i in instructions
        for o in i.operands
        if id(o) in compute and o.users == [i] and "dot" not in (i.opcode, o.opcode)
    )
    groups = [g for g in plan.fusion_groups if g[0] not in (producer.name, consumer.name)]
    verify_plan(regroup(plan, [*groups, (producer.name, consumer.name)]), step)


def test_two_dots_in_one_kernel_need_the_backend_to_allow_it(step):
    plan = Plan.unfused(step)
    dots = [i.name for i in compute_instructions(step) if i.opcode == "dot"][:2]
    groups = [g for g in plan.fusion_groups if g[0] not in dots] + [tuple(dots)]
    with pytest.raises(DiscoInputError, match="2 dots/convolutions"):
        verify_plan(regroup(plan, groups), step)


def test_a_group_with_a_path_out_and_back_is_not_convex(step):
    plan = Plan.unfused(step)
    chain = next(
        (a, b, c)
        for c in compute_instructions(step)
        for b in c.operands
        for a in b.operands
        if b.opcode not in ("parameter", "constant", "get-tuple-element")
        and a.opcode not in ("parameter", "constant", "get-tuple-element")
    )
    first, _, last = (i.name for i in chain)
    groups = [g for g in plan.fusion_groups if g[0] not in (first, last)] + [(first, last)]
    with pytest.raises(DiscoInputError, match="not convex"):
        verify_plan(regroup(plan, groups), step)


def test_groups_must_partition_the_compute_instructions(step):
    plan = Plan.unfused(step)
    with pytest.raises(DiscoInputError, match="in no fusion group"):
        verify_plan(regroup(plan, plan.fusion_groups[1:]), step)
    with pytest.raises(DiscoInputError, match="no instruction 'nope'"):
        verify_plan(regroup(plan, [*plan.fusion_groups, ("nope",)]), step)
    parameter = next(i.name for i in step.instructions() if i.opcode == "parameter")
    with pytest.raises(DiscoInputError, match="cannot be fused"):
        verify_plan(regroup(plan, [*plan.fusion_groups, (parameter,)]), step)


def test_one_bucket_of_all_gradients_is_legal(step):
    plan = Plan.unfused(step)
    merged = (tuple(name for bucket in plan.all_reduce_buckets for name in bucket),)
    verify_plan(dataclasses.replace(plan, all_reduce_buckets=merged), step)


CHAINED = """HloModule chained

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  p = f32[8] parameter(0)
  first = f32[8] all-reduce(p), replica_groups={{0,1}}, to_apply=sum
  twice = f32[8] multiply(first, first)
  second = f32[8] all-reduce(twice), replica_groups={{0,1}}, to_apply=sum
  ROOT t = (f32[8], f32[8]) tuple(first, second)
}
"""


def test_bucket_dependencies_must_follow_the_bucket_order():
    module = module_from_text(CHAINED)
    plan = Plan.unfused(module)
    assert plan.all_reduce_buckets == (("first",), ("second",))
    verify_plan(plan, module)
    with pytest.raises(DiscoInputError, match="depends on its own result"):
        verify_plan(dataclasses.replace(plan, all_reduce_buckets=(("first", "second"),)), module)
    with pytest.raises(DiscoInputError, match="comes after it"):
        verify_plan(dataclasses.replace(plan, all_reduce_buckets=(("second",), ("first",))), module)


MIXED = """HloModule mixed

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

sum16 {
  a = bf16[] parameter(0)
  b = bf16[] parameter(1)
  ROOT c = bf16[] add(a, b)
}

ENTRY main {
  p = f32[8] parameter(0)
  q = bf16[8] parameter(1)
  wide = f32[8] all-reduce(p), replica_groups={{0,1}}, to_apply=sum
  narrow = bf16[8] all-reduce(q), replica_groups={{0,1}}, to_apply=sum16
  ROOT t = (f32[8], bf16[8]) tuple(wide, narrow)
}
"""


def test_a_bucket_holds_one_dtype():
    module = module_from_text(MIXED)
    plan = Plan.unfused(module)
    verify_plan(plan, module)
    with pytest.raises(DiscoInputError, match="mixes all-reduces of different dtype"):
        verify_plan(dataclasses.replace(plan, all_reduce_buckets=(("wide", "narrow"),)), module)


def test_a_broken_plan_file_is_an_input_error():
    with pytest.raises(DiscoInputError, match="not a disco-xla plan"):
        Plan.from_json('{"format": "something else"}', "plan.json")
    with pytest.raises(DiscoInputError, match="plan.json"):
        Plan.from_json("not json", "plan.json")
