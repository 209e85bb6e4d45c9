"""The all-gather bucket pass on the Llama FSDP step as captured after XLA's
partitioning (4 devices, every parameter sharded 4 ways): one concatenated
all-gather per bucket, bit for bit the step's own outputs, the buckets in plan
order, and the plan's rules for what may share a bucket."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.bucket_all_gathers import GATHER_BUCKET_MARK, BucketAllGathers
from disco_xla.plan import Plan, all_gather_dependencies, all_gather_kinds, all_gathers, verify_plan
from disco_xla.runtime.apply import apply_plan
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.all_gather_buckets import combined_all_gathers


def _gathers(module: HloModule) -> list:
    return [i for i in module.instructions() if i.opcode in ("all-gather", "all-gather-start")]


def test_the_step_gathers_along_several_dimensions(fsdp_step):
    # The pass must move blocks for gathers along an inner dimension too.
    dimensions = {i.proto.dimensions[0] for i in all_gathers(fsdp_step)}
    assert {0, 1} <= dimensions
    assert len(all_gathers(fsdp_step)) == len(_gathers(fsdp_step)) > 10


def test_combined_buckets_compile_to_one_all_gather_each_and_run_bit_for_bit(fsdp_step):
    buckets = combined_all_gathers(fsdp_step, 1 << 30)
    assert len(buckets) < len(all_gathers(fsdp_step))
    assert max(len(b) for b in buckets) > 2
    plan = dataclasses.replace(Plan.unfused(fsdp_step), all_gather_buckets=buckets)
    rewritten = apply_plan(fsdp_step, plan, fusion=False)  # checks the compiled all-gathers
    compiled = compile_module(rewritten, NO_COMBINER)
    assert len(_gathers(compiled)) == len(buckets)
    result = verify_rewrite(fsdp_step, rewritten, devices=4, rounds=1)
    assert result.bit_equal, result


def test_a_bucket_of_two_gathers_their_concatenation_and_restores_each(fsdp_step):
    kinds = all_gather_kinds(fsdp_step)
    depends = all_gather_dependencies(fsdp_step)
    names = [i.name for i in all_gathers(fsdp_step)]
    pair = next(
        (a, b)
        for a in names
        for b in names
        if a < b
        and kinds[a] == kinds[b]
        and a not in depends.get(b, ())
        and b not in depends.get(a, ())
    )
    module = HloModule.from_bytes(fsdp_step.to_bytes(), "copy")
    by_name = {i.name: i for i in module.instructions()}
    sizes = [by_name[n].operands[0].shape.bytes for n in pair]
    assert BucketAllGathers([pair]).run(module)
    names_after = {i.name for i in module.instructions()}
    assert not set(pair) & names_after
    (bucket,) = [i for i in module.instructions() if i.name == f"{GATHER_BUCKET_MARK}.0"]
    assert bucket.opcode == "all-gather" and list(bucket.proto.dimensions) == [0]
    assert bucket.operands[0].opcode == "concatenate"
    assert bucket.operands[0].shape.bytes == sum(sizes)


def test_buckets_of_one_keep_each_all_gather_in_plan_order(fsdp_step):
    body = max(
        fsdp_step.computations, key=lambda c: sum(i.opcode == "all-gather" for i in c.instructions)
    )
    names = [i.name for i in body.topological_order if i.opcode == "all-gather"]
    module = HloModule.from_bytes(fsdp_step.to_bytes(), "copy")
    assert BucketAllGathers([(n,) for n in names]).run(module)
    by_name = {i.name: i for i in module.instructions()}
    for earlier, later in zip(names, names[1:], strict=False):
        assert by_name[earlier] in by_name[later].control_predecessors


def test_the_plan_refuses_unlike_or_dependent_members_and_a_partial_partition(fsdp_step):
    kinds = all_gather_kinds(fsdp_step)
    depends = all_gather_dependencies(fsdp_step)
    base = dataclasses.replace(
        Plan.unfused(fsdp_step), all_gather_buckets=combined_all_gathers(fsdp_step, 1 << 30)
    )
    verify_plan(base, fsdp_step)
    singles = [(n,) for n in kinds]

    def refused(buckets) -> str:
        with pytest.raises(DiscoInputError) as error:
            verify_plan(dataclasses.replace(base, all_gather_buckets=tuple(buckets)), fsdp_step)
        return str(error.value)

    unlike = next((a, b) for a in kinds for b in kinds if kinds[a] != kinds[b])
    rest = [s for s in singles if s[0] not in unlike]
    assert "mixes" in refused([unlike, *rest])
    later, earlier = next((n, sorted(d)[0]) for n, d in depends.items() if d)
    rest = [s for s in singles if s[0] not in (later, earlier)]
    assert "depends" in refused([(earlier, later), *rest])
    assert "in no all-gather bucket" in refused(singles[1:])
    assert "not an all-gather" in refused([*singles, ("no-such-gather",)])


def test_a_plan_with_all_gather_buckets_survives_json(fsdp_step):
    plan = dataclasses.replace(
        Plan.unfused(fsdp_step), all_gather_buckets=combined_all_gathers(fsdp_step, 1 << 30)
    )
    assert Plan.from_json(plan.to_json()) == plan
    # A plan without them is written as before.
    assert "all_gather_buckets" not in Plan.unfused(fsdp_step).to_json()
