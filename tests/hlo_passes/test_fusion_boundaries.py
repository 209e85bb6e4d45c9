"""Fusion boundaries: each plan group becomes a call XLA keeps, and the program
computes what it did."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo_passes.fusion_boundaries import outline_fusion_groups
from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan, compute_instructions, verify_plan
from disco_xla.runtime.apply import verify_rewrite
from disco_xla.runtime.xla_runner import compile_module


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


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def test_every_group_becomes_one_non_inlineable_call(step):
    plan = paired_plan(step)
    verify_plan(plan, step)
    rewritten = HloModule.from_bytes(step.to_bytes(), "rewritten")
    assert outline_fusion_groups(rewritten, plan)
    calls = [
        i for i in rewritten.instructions() if i.opcode == "call" and "disco_xla.kernel" in i.name
    ]
    assert len(calls) == len(plan.fusion_groups)
    assert all(c.proto.frontend_attributes.map["inlineable"] == "false" for c in calls)
    pair_calls = [c for c in calls if len(c.called_computations[0].instructions) > 3]
    assert pair_calls  # a pair: two parameters at most, two members, the tuple
    # No compute instruction is left outside the outlined kernels.
    outside = [
        i
        for i in compute_instructions(rewritten)
        if not i.computation.name.startswith("disco_xla.kernel")
    ]
    assert outside == []


def test_xla_keeps_the_boundaries_and_the_results(step):
    plan = paired_plan(step)
    rewritten = HloModule.from_bytes(step.to_bytes(), "rewritten")
    outline_fusion_groups(rewritten, plan)
    compiled = compile_module(rewritten, ["cpu-all-reduce-combiner"])
    assert compiled.opcode_histogram()["call"] >= 0.8 * len(plan.fusion_groups)
    comparison = verify_rewrite(step, rewritten, devices=4, rounds=1)
    assert comparison.equal and comparison.max_rel_diff <= 1e-6  # this small MLP: per output
