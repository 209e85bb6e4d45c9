"""The chunking pass on the Llama FSDP step as captured after XLA's
partitioning (4 devices): the MLP gathered, computed and reduced in chunks, as
one pipeline where the counts agree; the step's outputs bit for bit the same on
4 devices; and the plan's rules for chunks."""

from __future__ import annotations

import dataclasses
import json

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.chunking import chunkable_collectives, chunked_computation
from disco_xla.plan import Plan, prefetchable_all_gathers, verify_plan
from disco_xla.runtime.apply import apply_plan
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.search.all_gather_buckets import combined_all_gathers
from tests.hlo.test_chunking import _mlp


def _chunked(module, *pairs) -> Plan:
    return dataclasses.replace(Plan.unfused(module), chunked_collectives=tuple(pairs))


def test_the_mlp_runs_as_a_pipeline_of_chunks_and_computes_the_same(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    g, r = gather.collective.name, reduce.collective.name
    (down,) = reduce.dots
    plan = _chunked(fsdp_step, (g, 2), (r, 2))
    rewritten = apply_plan(fsdp_step, plan, fusion=False)  # checks the compiled collectives
    by_name = {i.name: i for i in rewritten.instructions()}
    assert g not in by_name and r not in by_name and down.name not in by_name
    for j in range(2):
        piece = by_name[f"{g}.chunk{j}"]
        assert piece.operands[0].opcode == "slice"
        assert piece.shape.dims[gather.operand_dimension] == gather.size // 2
        assert piece.proto.channel_id not in (0, gather.collective.proto.channel_id)
        # Each reading dot's chunk reads its own gathered chunk.
        for dot in gather.dots:
            assert by_name[f"{dot.name}.chunk{j}"].operands[0] is piece
        # The down projection reads the activation's chunk j, not a slice of the whole.
        product = by_name[f"{down.name}.chunk{j}"]
        assert product.operands[0].name.endswith(f".chunk{j}")
        assert product.operands[0].opcode == "multiply"
        reduced = by_name[f"{r}.chunk{j}"]
        assert reduced.operands == [product]
        # The partitioner's reduce-then-slice stays so, chunk by chunk.
        assert [u.opcode for u in reduced.users] == ["dynamic-slice"]
    channels = [i.proto.channel_id for i in rewritten.instructions() if i.proto.channel_id]
    assert len(channels) == len(set(channels))
    # One concatenation, of the reduced chunks: nothing between reads a whole
    # value, which the analysis (that the simulator prices copies by) agrees on.
    joined = [i for i in rewritten.instructions() if i.name.endswith(".joined")]
    assert [i.name for i in joined] == [f"{reduce.collective.users[0].name}.joined"]
    assert chunked_computation(fsdp_step, plan.chunked_collectives).joined(fsdp_step) == []
    result = verify_rewrite(fsdp_step, rewritten, devices=4, rounds=1)
    assert result.bit_equal, result


def test_unlike_counts_slice_the_whole_and_mixed_dimensions_compute_the_same(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    (down,) = reduce.dots
    pairs = [(gather.collective.name, 4), (reduce.collective.name, 2)]
    others = [s for s in chunkable_collectives(fsdp_step) if s not in (gather, reduce)]
    pairs += [(s.collective.name, 2) for s in others[:2]]
    plan = dataclasses.replace(
        _chunked(fsdp_step, *pairs),
        prefetched_all_gathers=tuple(
            n for n in prefetchable_all_gathers(fsdp_step) if n not in dict(pairs)
        ),
    )
    rewritten = apply_plan(fsdp_step, plan, fusion=False)
    product = rewritten.instruction(f"{down.name}.chunk0")
    assert product.operands[0].opcode == "slice"
    assert product.operands[0].operands[0].opcode == "concatenate"
    joined = chunked_computation(fsdp_step, plan.chunked_collectives).joined(fsdp_step)
    assert down.operands[0] in joined
    # Equal within the check's tolerance: the prefetched loop's peeled last trip
    # is fused with what follows it (1e-7 relative, as without chunks).
    result = verify_rewrite(fsdp_step, rewritten, devices=4, rounds=1)
    assert result.equal, result


def test_the_plan_refuses_chunks_it_cannot_make(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    g = gather.collective.name
    gradient = fsdp_step.gradient_all_reduces[0].name
    splittable = {s.collective.name for s in chunkable_collectives(fsdp_step)}
    prefetched = next(n for n in prefetchable_all_gathers(fsdp_step) if n in splittable)

    def refused(plan: Plan) -> str:
        with pytest.raises(DiscoInputError) as error:
            verify_plan(plan, fsdp_step)
        return str(error.value)

    assert "cannot be split into chunks" in refused(_chunked(fsdp_step, (gradient, 2)))
    assert "cannot be split into 3 chunks" in refused(_chunked(fsdp_step, (g, 3)))
    assert "twice" in refused(_chunked(fsdp_step, (g, 2), (g, 4)))
    both = dataclasses.replace(
        _chunked(fsdp_step, (prefetched, 2)), prefetched_all_gathers=(prefetched,)
    )
    assert "both prefetched and split" in refused(both)
    buckets = combined_all_gathers(fsdp_step, 1 << 30)
    shared = next(n for b in buckets if len(b) > 1 for n in b if n in splittable)
    bucketed = dataclasses.replace(_chunked(fsdp_step, (shared, 2)), all_gather_buckets=buckets)
    assert "shares an all-gather bucket" in refused(bucketed)
    text = json.loads(_chunked(fsdp_step, (g, 2)).to_json())
    assert text["chunked_collectives"] == {g: 2}
    assert Plan.from_json(json.dumps(text)).chunked_collectives == ((g, 2),)
    assert "chunked_collectives" not in json.loads(Plan.unfused(fsdp_step).to_json())
    text["chunked_collectives"] = [g, 2]
    with pytest.raises(DiscoInputError, match="not a map of names to chunk counts"):
        Plan.from_json(json.dumps(text))
