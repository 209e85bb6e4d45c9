"""Fusion boundaries: each plan group becomes a call XLA keeps, and the program
computes what it did."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.fusion_boundaries import OutlineFusionGroups
from disco_xla.plan import Plan, compute_instructions, departing_groups, verify_plan
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module


def outline(module: HloModule, plan: Plan, left_to_xla=None) -> bool:
    """Run the pass on the groups of `plan` that need a boundary, as `apply_plan` does."""
    boundaries = departing_groups(module, plan, left_to_xla)
    return OutlineFusionGroups(plan.fusion_groups, boundaries).run(module)


def paired_plan(module: HloModule) -> Plan:
    """Each producer fused with its only consumer, where legal; the rest alone."""
    plan = Plan.unfused(module)
    compute = {id(i) for i in compute_instructions(module)}
    pairs, used = [], set()
    for instr in compute_instructions(module):
        for operand in instr.operands:
            if (
                id(operand) in compute
                and operand.users == [instr]
                and "dot" not in (instr.opcode, operand.opcode)
                and not {operand.name, instr.name} & used
            ):
                pairs.append((operand.name, instr.name))
                used |= {operand.name, instr.name}
    groups = [g for g in plan.fusion_groups if g[0] not in used] + pairs
    return dataclasses.replace(plan, fusion_groups=tuple(groups))


def _reads_a_parameter(instr) -> bool:
    """Whether a parameter is among the instruction's operands, transitively."""
    pending, seen = [instr], set()
    while pending:
        current = pending.pop()
        if current.opcode == "parameter":
            return True
        if id(current) not in seen:
            seen.add(id(current))
            pending.extend(current.operands)
    return False


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def test_every_group_becomes_one_non_inlineable_call(step):
    plan = paired_plan(step)
    verify_plan(plan, step)
    rewritten = HloModule.from_bytes(step.to_bytes(), "rewritten")
    assert outline(rewritten, plan)
    calls = [
        i for i in rewritten.instructions() if i.opcode == "call" and "disco_xla.kernel" in i.name
    ]
    # Groups that compute from constants alone stay in place (XLA folds them).
    by_name = {i.name: i for i in step.instructions()}
    from_parameters = [g for g in plan.fusion_groups if _reads_a_parameter(by_name[g[-1]])]
    assert 0 < len(from_parameters) < len(plan.fusion_groups)
    library = [g for g in from_parameters if by_name[g[0]].opcode == "dot"]
    assert library and len(calls) == len(from_parameters) - len(library)
    assert all(c.proto.frontend_attributes.map["inlineable"] == "false" for c in calls)
    pair_calls = [c for c in calls if len(c.called_computations[0].instructions) > 3]
    assert pair_calls  # a pair: two parameters at most, two members, the tuple
    # No compute instruction is left outside the outlined kernels but constant
    # expressions and library ops (dots stay in the caller).
    outside = [
        i.opcode
        for i in compute_instructions(rewritten)
        if not i.computation.name.startswith("disco_xla.kernel") and _reads_a_parameter(i)
    ]
    assert outside and set(outside) == {"dot"}


def test_xla_keeps_the_boundaries_and_the_results(step):
    plan = paired_plan(step)
    rewritten = HloModule.from_bytes(step.to_bytes(), "rewritten")
    outline(rewritten, plan)
    compiled = compile_module(rewritten, NO_COMBINER)
    assert compiled.opcode_histogram()["call"] >= 0.8 * len(
        [g for g in plan.fusion_groups if len(g) > 1]
    )
    comparison = verify_rewrite(step, rewritten, devices=4, rounds=1)
    assert comparison.equal and comparison.max_rel_diff <= 1e-6  # this small MLP: per output


# A batch-norm mean as TF writes it: the element count is a product of constants,
# and the reduction starts from convert(0).
MEAN_MODULE = """
HloModule mean, entry_computation_layout={(f32[2,1,1,8]{3,2,1,0})->f32[8]{0}}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY mean {
  x = f32[2,1,1,8]{3,2,1,0} parameter(0)
  zero = f32[] constant(0)
  start = f32[] convert(zero)
  sum = f32[8]{0} reduce(x, start), dimensions={0,1,2}, to_apply=add
  two = s32[] constant(2)
  one = s32[] constant(1)
  count = s32[] multiply(two, one)
  count_f32 = f32[] convert(count)
  counts = f32[8]{0} broadcast(count_f32), dimensions={}
  ROOT mean = f32[8]{0} divide(sum, counts)
}
"""


def test_constant_expressions_never_cross_a_group_edge():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(MEAN_MODULE, "mean")
    groups = (("start",), ("sum",), ("count", "count_f32", "counts", "mean"))
    plan = dataclasses.replace(Plan.unfused(module), fusion_groups=groups)
    verify_plan(plan, module)
    rewritten = HloModule.from_bytes(module.to_bytes(), "rewritten")
    assert outline(rewritten, plan)
    calls = [i for i in rewritten.entry.instructions if i.opcode == "call"]
    # The group of constants alone stays; the others read only the parameter
    # or each other's results, and compute their constants themselves.
    assert len(calls) == 2
    assert {o.opcode for c in calls for o in c.operands} == {"parameter", "get-tuple-element"}
    (reduce,) = [i for i in rewritten.instructions() if i.opcode == "reduce"]
    start = reduce.operands[1]
    assert (start.opcode, start.operands[0].opcode) == ("convert", "constant")
    (divide,) = [i for i in rewritten.instructions() if i.opcode == "divide"]
    assert divide.operands[1].opcode == "broadcast"
    assert divide.operands[1].computation is divide.computation
    # The copies have names of their own (XLA wants them unique), and the
    # program still computes the same.
    names = [i.name for i in rewritten.instructions()]
    assert len(names) == len(set(names))
    comparison = verify_rewrite(module, rewritten, devices=1, rounds=1)
    assert comparison.bit_equal


def test_groups_xla_forms_itself_and_library_ops_are_left_to_xla(step):
    """XLA's own fusion rewrites to the unchanged program; a plan that splits one
    of XLA's groups outlines only the groups that depart, never a dot."""
    from disco_xla.driver.checked_rewrite import xla_own_groups
    from disco_xla.search.xla_fusion import xla_fusion_plan

    own = xla_own_groups(step)
    assert own is not None
    plan = xla_fusion_plan(step, compile_module(step, NO_COMBINER))
    assert plan.fusion_groups == own
    unchanged = HloModule.from_bytes(step.to_bytes(), "unchanged")
    assert not outline(unchanged, plan, left_to_xla=own)
    assert unchanged.fingerprint == step.fingerprint
    # Split the largest group without a dot into its members.
    by_name = {i.name: i for i in step.instructions()}
    largest = max((g for g in own if all(by_name[n].opcode != "dot" for n in g)), key=len)
    assert len(largest) > 1
    split = tuple(g for g in own if g != largest) + tuple((n,) for n in largest)
    split_plan = dataclasses.replace(plan, fusion_groups=split)
    verify_plan(split_plan, step)
    departing = departing_groups(step, split_plan, own)
    assert sorted(departing) == sorted((n,) for n in largest)
    rewritten = HloModule.from_bytes(step.to_bytes(), "split")
    assert outline(rewritten, split_plan, left_to_xla=own)
    calls = [i for i in rewritten.instructions() if i.opcode == "call" and "kernel" in i.name]
    assert 0 < len(calls) <= len(largest)
    assert verify_rewrite(step, rewritten, devices=4, rounds=1).equal


CHAIN = """
HloModule chain

ENTRY chain {
  x = f32[4] parameter(0)
  a = f32[4] exponential(x)
  b = f32[4] negate(a)
  ROOT c = f32[4] multiply(b, x)
}
"""


def test_a_group_becomes_a_call_and_groups_not_chosen_stay():
    from disco_xla.hlo.hlo_io import module_from_text
    from disco_xla.hlo_passes.fusion_boundaries import GROUP_MARK

    module = module_from_text(CHAIN, "chain")
    groups = (("c",), ("a", "b"))
    before = module.to_bytes()
    assert not OutlineFusionGroups(groups, boundaries=()).run(module)
    assert module.to_bytes() == before
    assert OutlineFusionGroups(groups, boundaries=[("a", "b")]).run(module)
    root = module.entry.root
    assert root.name == "c"
    element, parameter = root.operands
    assert (element.opcode, parameter.opcode) == ("get-tuple-element", "parameter")
    call = element.operands[0]
    assert call.name == f"{GROUP_MARK}.1.call"  # named by the group's position
    assert call.proto.frontend_attributes.map["inlineable"] == "false"
    callee = call.called_computations[0]
    assert callee.name == f"{GROUP_MARK}.1"
    assert [i.opcode for i in callee.topological_order] == [
        "parameter",
        "exponential",
        "negate",
        "tuple",
    ]
    assert {i.opcode for i in module.entry.instructions} == {
        "parameter",
        "call",
        "get-tuple-element",
        "multiply",
    }
