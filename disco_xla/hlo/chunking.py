"""Which collectives can be split into chunks that start as their inputs
become ready, and along which dimension (the analysis behind
`hlo_passes.chunk_collectives` and the plan's `chunked_collectives`).

Two shapes qualify, both where a collective sits next to a matrix product that
works row by row along some dimension (a sequence's tokens, say):

- **its producer is split** (`split="producer"`): an all-reduce that is not a
  gradient's, whose operand is a dot read by nothing else. The dot's rows along
  one of its left operand's free dimensions (neither contracted nor batch) are
  computed in chunks, each chunk is reduced as soon as it is computed, and the
  chunks are concatenated. In the Llama FSDP step this is the MLP's down
  projection, whose partial sums XLA's partitioner reduces over the FSDP group;
- **its readers are split** (`split="readers"`): an all-gather whose users are
  all dots, each reading it once, along a dimension that is not the gathered
  one and is free in every reader. The operand's chunks along it are gathered
  one by one, and each reader computes its rows of a chunk as soon as that
  chunk has arrived; the readers' chunks are concatenated. In the Llama FSDP
  step these are the MLP's activations, gathered over the FSDP group before
  the gate and up projections.

The chunks go on through what follows: an elementwise operation whose chunked
operands are chunks along the same dimension, and whose other operands are
broadcast scalars, is computed chunk by chunk too, and so is the producing dot
of a chunked all-reduce that reads such chunks along its own split dimension
(`chunked_computation`). So a layer's MLP, gathered in chunks before its first
products and reduced in chunks after its last, runs as a pipeline: each chunk's
products, activation and reduction overlap the next chunk's transfers.

A dot computes each row of its result from that row of the split operand and
the whole other operand, so the chunks compute the same elements from the same
products (XLA may sum them in another order: the check compares within its
tolerance). This is the idea of XLA:GPU's windowed einsum ("collective
matmul"), which decomposes the same pairs into collective-permutes of the
partitions' shards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.hlo.opcodes import ELEMENTWISE_OPCODES
from disco_xla.hlo.xla_gpu_patterns import sole_dynamic_slice

# The chunk counts a plan may choose (the search tries each that divides).
CHUNK_COUNTS = (2, 4, 8)


@dataclass(frozen=True)
class ChunkSplit:
    """How one collective is split: `dots` are its producer (one) or its
    readers; `operand_dimension` is the dimension of the split operand (the
    producer's left operand, or the all-gather's operand) cut into chunks, of
    `size` elements; `output_dimensions[k]` is the dimension of dots[k]'s result
    along which its chunks are concatenated."""

    collective: Instruction
    split: str  # 'producer' or 'readers'
    dots: tuple[Instruction, ...]
    operand_dimension: int
    size: int
    output_dimensions: tuple[int, ...]

    def allows(self, chunks: int) -> bool:
        return chunks >= 2 and self.size % chunks == 0


def chunk_split(instr: Instruction) -> ChunkSplit | None:
    """How `instr` can be split into chunks (see the module's docstring), or
    None where it cannot."""
    if len(instr.operands) != 1 or instr.shape.is_tuple:
        return None
    if instr.opcode == "all-reduce":
        return _producer_split(instr)
    if instr.opcode == "all-gather":
        return _readers_split(instr)
    return None


def chunkable_collectives(module: HloModule) -> list[ChunkSplit]:
    """Every collective of `module` that can be split, in topological order."""
    gradients = {a.name for a in module.gradient_all_reduces}
    found = []
    for computation in module.computations:
        if computation.role not in ("entry", "program"):
            continue
        for instr in computation.topological_order:
            if instr.name in gradients:
                continue
            split = chunk_split(instr)
            if split is not None:
                found.append(split)
    return found


def _free_dimensions(dot: Instruction, operand: int) -> list[int]:
    """The dimensions of the dot's operand 0 (left) or 1 (right) that are
    neither contracted nor batch, in order."""
    numbers = dot.proto.dot_dimension_numbers
    if operand == 0:
        taken = set(numbers.lhs_contracting_dimensions) | set(numbers.lhs_batch_dimensions)
    else:
        taken = set(numbers.rhs_contracting_dimensions) | set(numbers.rhs_batch_dimensions)
    rank = len(dot.operands[operand].shape.dims)
    return [d for d in range(rank) if d not in taken]


def _output_dimension(dot: Instruction, operand: int, dimension: int) -> int:
    """Where free `dimension` of the dot's operand lands in its result: batch
    dimensions first, then the left operand's free ones, then the right's."""
    batch = len(dot.proto.dot_dimension_numbers.lhs_batch_dimensions)
    position = _free_dimensions(dot, operand).index(dimension)
    if operand == 1:
        position += len(_free_dimensions(dot, 0))
    return batch + position


def _producer_split(reduce: Instruction) -> ChunkSplit | None:
    dot = reduce.operands[0]
    if dot.opcode != "dot" or len(dot.users) != 1 or len(dot.operands) != 2:
        return None
    dims = dot.operands[0].shape.dims
    free = _free_dimensions(dot, 0)
    if not free:
        return None
    dimension = max(free, key=lambda d: (dims[d], -d))
    return ChunkSplit(
        reduce,
        "producer",
        (dot,),
        dimension,
        dims[dimension],
        (_output_dimension(dot, 0, dimension),),
    )


def _readers_split(gather: Instruction) -> ChunkSplit | None:
    if len(gather.proto.dimensions) != 1 or not gather.users:
        return None
    gathered = gather.proto.dimensions[0]
    readers = list(dict.fromkeys(gather.users))
    sides = []
    for dot in readers:
        if dot.opcode != "dot" or len(dot.operands) != 2:
            return None
        reads = [k for k, operand in enumerate(dot.operands) if operand is gather]
        if len(reads) != 1:
            return None
        sides.append(reads[0])
    dims = gather.shape.dims
    candidates = [
        d
        for d in range(len(dims))
        if d != gathered
        and all(d in _free_dimensions(dot, side) for dot, side in zip(readers, sides, strict=True))
    ]
    if not candidates:
        return None
    dimension = max(candidates, key=lambda d: (dims[d], -d))
    outputs = tuple(
        _output_dimension(dot, side, dimension) for dot, side in zip(readers, sides, strict=True)
    )
    return ChunkSplit(gather, "readers", tuple(readers), dimension, dims[dimension], outputs)


def whole_dynamic_slice(reduce: Instruction, dimension: int) -> Instruction | None:
    """The all-reduce's one reader when it is a dynamic-slice of it that keeps
    `dimension` whole, else None."""
    reader = sole_dynamic_slice(reduce)
    if reader is None:
        return None
    sizes = list(reader.proto.dynamic_slice_sizes)
    if len(sizes) <= dimension or sizes[dimension] != reduce.shape.dims[dimension]:
        return None
    return reader


@dataclass(frozen=True)
class Chunking:
    """What a plan's chunked collectives split: each one's `ChunkSplit` and
    chunk count, and every compute instruction computed in chunks, by name:
    (the dimension of its result the chunks run along, their count)."""

    splits: tuple[tuple[ChunkSplit, int], ...]
    computed: dict[str, tuple[int, int]]

    def reads_chunks(self, dot: Instruction, split: ChunkSplit, chunks: int) -> bool:
        """Whether the producing dot of a producer split reads its left operand
        in chunks along its split dimension (else it slices the whole)."""
        return self.computed.get(dot.operands[0].name) == (split.operand_dimension, chunks)

    def producer_split(self, dot: Instruction) -> tuple[ChunkSplit, int] | None:
        """(split, chunks) of the producer split whose dot `dot` is, if any."""
        return next(
            ((s, n) for s, n in self.splits if s.split == "producer" and s.dots[0] is dot), None
        )

    def reads_whole(self, user: Instruction, value: Instruction) -> bool:
        """Whether `user` reads `value` (computed in chunks) whole, so that the
        rewrite concatenates its chunks: an elementwise operation computed in
        chunks reads chunks, and so do a producing dot whose left operand comes
        in its own chunks, the chunked all-reduce of its dot, and a chunked
        all-gather of chunks along its own dimension."""
        computed = self.computed.get(user.name)
        split = next(((s, n) for s, n in self.splits if s.collective is user), None)
        if split is not None:
            if split[0].split == "producer":
                return False
            return self.computed.get(value.name) != (split[0].operand_dimension, split[1])
        if computed is None:
            return True
        if user.opcode != "dot":
            return False
        producer = self.producer_split(user)
        if producer is not None and user.operands[0] is value:
            return not self.reads_chunks(user, *producer)
        return True

    def copied_bytes(self, split: ChunkSplit, chunks: int) -> int:
        """The bytes the rewrite copies around one split: a slice of what the
        split reads whole, and the concatenation of a reduced result."""
        if split.split == "readers":
            operand = split.collective.operands[0]
            own = self.computed.get(operand.name) == (split.operand_dimension, chunks)
            return 0 if own else operand.shape.bytes
        (dot,) = split.dots
        sliced = 0 if self.reads_chunks(dot, split, chunks) else dot.operands[0].shape.bytes
        reader = whole_dynamic_slice(split.collective, split.output_dimensions[0])
        return sliced + (reader or split.collective).shape.bytes

    def joined(self, module: HloModule) -> list[Instruction]:
        """The values computed in chunks that the rewrite concatenates: a
        computation's root, or read whole by something (`reads_whole`)."""
        found = []
        for name in self.computed:
            value = module.instruction(name)
            if value is value.computation.root or any(
                self.reads_whole(user, value) for user in value.users
            ):
                found.append(value)
        return found


def chunked_computation(module: HloModule, chunked: Iterable[tuple[str, int]]) -> Chunking:
    """The `Chunking` of `chunked` ((collective name, chunks) pairs): the split
    dots, then each elementwise operation that reads chunks of one dimension
    and count, and otherwise only broadcast scalars (see the module's
    docstring). Raises ValueError where a collective cannot be split."""
    splits, computed = [], {}
    for name, chunks in chunked:
        split = chunk_split(module.instruction(name))
        if split is None or not split.allows(chunks):
            raise ValueError(f"{name} cannot be split into {chunks} chunks")
        splits.append((split, chunks))
        for dot, output in zip(split.dots, split.output_dimensions, strict=True):
            computed[dot.name] = (output, chunks)
    computations = {id(s.collective.computation): s.collective.computation for s, _ in splits}
    for computation in computations.values():
        for instr in computation.topological_order:
            if instr.name not in computed and instr.opcode in ELEMENTWISE_OPCODES:
                found = _elementwise_chunks(instr, computed)
                if found is not None:
                    computed[instr.name] = found
    return Chunking(tuple(splits), computed)


def is_broadcast_scalar(instr: Instruction) -> bool:
    return instr.opcode == "broadcast" and not instr.operands[0].shape.dims


def _elementwise_chunks(instr: Instruction, computed: dict) -> tuple[int, int] | None:
    """The chunking an elementwise `instr` takes from its operands, if any."""
    found = set()
    for operand in instr.operands:
        if operand.name in computed and operand.shape.dims == instr.shape.dims:
            found.add(computed[operand.name])
        elif not is_broadcast_scalar(operand):
            return None
    return found.pop() if len(found) == 1 else None
