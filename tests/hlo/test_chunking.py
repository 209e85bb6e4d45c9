"""Which collectives of the Llama FSDP step (captured after XLA's partitioning,
4 devices) can be split into chunks, along which dimension, and how far the
chunks go on through the layer's MLP."""

from __future__ import annotations

import pytest

from disco_xla.hlo.chunking import chunk_split, chunkable_collectives, chunked_computation


def _mlp(module):
    """The MLP's activation all-gather (read by the gate and up projections)
    and the down projection's all-reduce, found by shape, not by name."""
    splits = chunkable_collectives(module)
    gathers = [s for s in splits if s.split == "readers" and len(s.dots) == 2]
    reduces = [s for s in splits if s.split == "producer"]
    assert gathers and reduces
    forward = gathers[0].collective.computation
    (reduce,) = [s for s in reduces if s.collective.computation is forward]
    return gathers[0], reduce


def test_the_mlp_collectives_split_along_the_tokens_and_gradients_never(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    gathered = gather.collective.proto.dimensions[0]
    assert gather.operand_dimension != gathered
    for dot in gather.dots:
        numbers = dot.proto.dot_dimension_numbers
        assert gather.operand_dimension not in numbers.lhs_contracting_dimensions
        assert dot.operands[0] is gather.collective
    # The token dimension: the largest one that is neither gathered nor contracted.
    contracted = set(gather.dots[0].proto.dot_dimension_numbers.lhs_contracting_dimensions)
    assert gather.size == max(
        d for k, d in enumerate(gather.collective.shape.dims) if k not in contracted | {gathered}
    )
    (dot,) = reduce.dots
    assert dot.users == [reduce.collective] and reduce.size == gather.size
    gradients = {a.name for a in fsdp_step.gradient_all_reduces}
    names = {s.collective.name for s in chunkable_collectives(fsdp_step)}
    assert gradients and not names & gradients
    # A weight gradient's all-reduce of a dot would fit, but it is a gradient.
    assert any(fsdp_step.instruction(n).operands[0].opcode == "dot" for n in gradients)
    assert gather.allows(2) and gather.allows(4) and not gather.allows(3)


def test_chunks_go_on_through_the_activation_when_the_counts_agree(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    (down,) = reduce.dots
    same = chunked_computation(
        fsdp_step, [(gather.collective.name, 4), (reduce.collective.name, 4)]
    )
    # Between the projections: silu and the product, elementwise.
    between = {name for name in same.computed if fsdp_step.instruction(name).opcode not in ("dot",)}
    assert between and all(
        fsdp_step.instruction(n).computation is down.computation for n in between
    )
    assert same.reads_chunks(down, reduce, 4)
    assert down.operands[0].name in same.computed
    other = chunked_computation(
        fsdp_step, [(gather.collective.name, 4), (reduce.collective.name, 2)]
    )
    assert not other.reads_chunks(down, reduce, 2)
    assert other.computed[down.name] == (reduce.output_dimensions[0], 2)
    # The activation is computed in 4 chunks either way; only the link differs.
    assert other.computed[down.operands[0].name] == same.computed[down.operands[0].name]
    with pytest.raises(ValueError, match="cannot be split into 3 chunks"):
        chunked_computation(fsdp_step, [(gather.collective.name, 3)])


def test_a_collective_of_no_dot_is_not_split(fsdp_step):
    for instr in fsdp_step.instructions():
        if instr.opcode == "all-reduce" and instr.operands[0].opcode != "dot":
            assert chunk_split(instr) is None
        if instr.opcode in ("all-to-all", "reduce-scatter"):
            assert chunk_split(instr) is None
