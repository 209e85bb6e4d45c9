"""The prefetch pass on the Llama FSDP step as captured after XLA's
partitioning (4 devices, every parameter sharded 4 ways, the layers in `scan`
loops): which all-gathers can be issued a loop trip ahead, the rewritten loops
(one trip fewer, the last trip after them, the gathered layer carried), the
step's outputs unchanged, and the plan's rules."""

from __future__ import annotations

import dataclasses
import json

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.loops import computed_from_invariants, loop_of_body
from disco_xla.hlo.trip_counts import trip_count
from disco_xla.plan import Plan, all_gathers, prefetchable_all_gathers, verify_plan
from disco_xla.runtime.apply import apply_plan, kept_in_place
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.search.all_gather_buckets import combined_all_gathers
from disco_xla.search.prefetch import pipelined_all_gathers


def test_only_gathers_of_a_loops_own_layer_can_be_issued_ahead(fsdp_step):
    names = set(prefetchable_all_gathers(fsdp_step))
    gathers = all_gathers(fsdp_step)
    outside = {g.name for g in gathers if loop_of_body(g.computation) is None}
    changing = {g.name for g in gathers if loop_of_body(g.computation)} - names
    assert names and outside and changing
    assert not names & outside
    for gather in gathers:
        loop = loop_of_body(gather.computation)
        if gather.name in names:
            # The layer's slice: it reads the loop's counter.
            read = computed_from_invariants(loop, gather.operands[0])
            elements = {i.proto.tuple_index for i in read if i.opcode == "get-tuple-element"}
            assert loop.induction_element in elements, gather.name
        elif gather.name in changing:
            # An activation: computed from what the loop carries and changes.
            assert computed_from_invariants(loop, gather.operands[0]) is None


def test_prefetched_gathers_run_a_trip_ahead_and_the_step_computes_the_same(fsdp_step):
    names = prefetchable_all_gathers(fsdp_step)
    plan = dataclasses.replace(Plan.unfused(fsdp_step), prefetched_all_gathers=tuple(names))
    rewritten = apply_plan(fsdp_step, plan, fusion=False)  # checks the compiled collectives
    by_name = {i.name: i for i in rewritten.instructions()}
    loops = {loop_of_body(fsdp_step.instruction(n).computation).instruction for n in names}
    for loop in loops:
        ahead = [n for n in names if fsdp_step.instruction(n).computation.callers == [loop]]
        after = by_name[loop.name]
        assert trip_count(after).count == trip_count(loop).count - 1
        carried = len(after.proto.shape.tuple_shapes) - len(loop.proto.shape.tuple_shapes)
        assert carried == len(ahead)
        body = after.called_computations[0]
        for name in ahead:
            assert name not in by_name
            assert by_name[f"{name}.first"].computation is after.computation
            assert by_name[f"{name}.next"].computation is body
            assert by_name[f"{name}.next"] in body.root.operands
    result = verify_rewrite(fsdp_step, rewritten, devices=4, rounds=1)
    assert result.equal, result


def test_prefetched_buckets_of_several_are_bit_for_bit_the_step(fsdp_step):
    buckets = combined_all_gathers(fsdp_step, 1 << 30)
    plan = dataclasses.replace(Plan.unfused(fsdp_step), all_gather_buckets=buckets)
    plan = dataclasses.replace(plan, prefetched_all_gathers=pipelined_all_gathers(fsdp_step, plan))
    assert any(len(b) > 1 and b[0] in plan.prefetched_all_gathers for b in buckets)
    rewritten = apply_plan(fsdp_step, plan, fusion=False)
    result = verify_rewrite(fsdp_step, rewritten, devices=4, rounds=1)
    assert result.bit_equal, result


def test_the_plan_refuses_a_gather_its_loop_changes_and_half_a_bucket(fsdp_step):
    names = set(prefetchable_all_gathers(fsdp_step))
    base = Plan.unfused(fsdp_step)

    def refused(plan: Plan) -> str:
        with pytest.raises(DiscoInputError) as error:
            verify_plan(plan, fsdp_step)
        return str(error.value)

    changing = next(g.name for g in all_gathers(fsdp_step) if g.name not in names)
    assert "issue ahead" in refused(dataclasses.replace(base, prefetched_all_gathers=(changing,)))
    buckets = combined_all_gathers(fsdp_step, 1 << 30)
    pair = next(b for b in buckets if len(b) > 1 and set(b) <= names)
    half = dataclasses.replace(base, all_gather_buckets=buckets, prefetched_all_gathers=pair[:1])
    assert "in part" in refused(half)
    twice = dataclasses.replace(base, prefetched_all_gathers=(pair[0], pair[0]))
    assert "twice" in refused(twice)


def test_a_plan_with_prefetches_survives_json(fsdp_step):
    plan = dataclasses.replace(
        Plan.unfused(fsdp_step), prefetched_all_gathers=tuple(prefetchable_all_gathers(fsdp_step))
    )
    assert Plan.from_json(plan.to_json()) == plan
    assert "prefetched_all_gathers" not in Plan.unfused(fsdp_step).to_json()
    # One name where a list belongs is refused, not read as its letters.
    data = json.loads(plan.to_json())
    data["prefetched_all_gathers"] = data["prefetched_all_gathers"][0]
    with pytest.raises(DiscoInputError, match="not a list"):
        Plan.from_json(json.dumps(data))


def test_the_census_of_a_plan_that_prefetches_refuses_a_size_it_does_not_make(fsdp_step):
    from disco_xla.errors import RewriteError
    from disco_xla.runtime.collective_census import check_collectives
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module

    names = tuple(prefetchable_all_gathers(fsdp_step))
    plan = dataclasses.replace(Plan.unfused(fsdp_step), prefetched_all_gathers=names)
    rewritten = apply_plan(fsdp_step, plan, fusion=False)
    check_collectives(fsdp_step, plan, compile_module(rewritten, NO_COMBINER))
    # A program whose all-gathers were merged into buckets the plan does not
    # make (sizes it never sends) is refused, though it has fewer all-gathers.
    buckets = combined_all_gathers(fsdp_step, 1 << 30)
    merged = dataclasses.replace(plan, all_gather_buckets=buckets, prefetched_all_gathers=())
    compiled = compile_module(apply_plan(fsdp_step, merged, fusion=False), NO_COMBINER)
    with pytest.raises(RewriteError, match="sizes"):
        check_collectives(fsdp_step, plan, compiled)


def test_outlined_groups_leave_the_prefetched_loops_countable(fsdp_step):
    # Every group outlined (no group left to XLA): the groups of a prefetched
    # gather's operand and of its loop's counter stay in place, or the pass
    # could not find them (before session 44, `optimize -o` stopped here with
    # "reads what its loop changes" on a plan whose fusion departed there).
    names = tuple(prefetchable_all_gathers(fsdp_step))
    plan = dataclasses.replace(Plan.unfused(fsdp_step), prefetched_all_gathers=names)
    kept = kept_in_place(fsdp_step, plan)
    condition = loop_of_body(fsdp_step.instruction(names[0]).computation).condition
    assert {i.name for i in condition.instructions} <= kept
    # It compiles to the plan's collectives (`apply_plan` checks); what it
    # computes differs in the last bits wherever every group is outlined (f32
    # sums in another order), so the checked entry points decide on it.
    rewritten = apply_plan(fsdp_step, plan, fusion=True, left_to_xla=None)
    ahead = {i.name for i in rewritten.instructions() if i.opcode == "all-gather"}
    assert {f"{name}.next" for name in names} <= ahead
