"""Pass: split collectives into chunks that start as their inputs become ready,
with the matrix products next to them (`hlo.chunking` says which qualify).

For an all-reduce whose producer is split, in k chunks along dimension d of
the producing dot's left operand: chunk j of that operand is sliced, multiplied
by the whole right operand, and reduced on its own; the reduced chunks are
concatenated along the result's matching dimension. Where the all-reduce's one
reader is a dynamic-slice that keeps that dimension whole (the partitioner's
reduce-then-slice, which XLA:GPU turns into a reduce-scatter), each chunk is
sliced before the concatenation instead, so that each chunk still has that form.

For an all-gather whose readers are split: chunk j of its operand along a
dimension it does not gather is sliced and gathered on its own, each reading
dot multiplies that gathered chunk, and each dot's chunks are concatenated
along its result's matching dimension.

The chunks go on through the elementwise operations and the producing dot that
`hlo.chunking.chunked_computation` finds: each is computed chunk by chunk from
its operands' chunks. A value computed in chunks that something else reads
whole (the layer's output, a reader outside) is concatenated for it.

Each new collective gets a channel of its own; the chunks keep the original's
device groups and reducer, and its place in a control chain (the first chunk
waits for what it waited for, and what waited for it waits for the last).
"""

from __future__ import annotations

from collections.abc import Mapping

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import edit
from disco_xla.hlo.chunking import (
    Chunking,
    ChunkSplit,
    chunked_computation,
    whole_dynamic_slice,
)
from disco_xla.hlo.graph import Computation, HloModule, Instruction
from disco_xla.hlo.hlo_schema import ShapeProto
from disco_xla.hlo_passes.concatenated_collectives import slice_of


class ChunkCollectives:
    """The pass (`pass_interface.HloPass`). `chunks` maps the name of each
    collective to split (`hlo.chunking.chunk_split`) to its number of chunks."""

    name = "chunk-collectives"

    def __init__(self, chunks: Mapping[str, int]):
        self.chunks = dict(chunks)

    def run(self, module: HloModule) -> bool:
        """Split the named collectives; returns whether the module changed."""
        if not self.chunks:
            return False
        try:
            chunking = chunked_computation(module, self.chunks.items())
        except ValueError as error:
            raise DiscoInputError(module.source, str(error)) from None
        rewrite = _Rewrite(chunking, edit.next_channel_id(module))
        for computation in {
            id(s.collective.computation): s.collective.computation for s, _ in chunking.splits
        }.values():
            rewrite.computation(computation)
        module.remove_instructions(rewrite.removed)
        module.rebuild()
        return True


class _Rewrite:
    """One run's state: the pieces of each value computed in chunks, by name."""

    def __init__(self, chunking: Chunking, channel: int):
        self.chunking, self.channel = chunking, channel
        self.collectives = {split.collective.name: (split, n) for split, n in chunking.splits}
        self.pieces: dict[str, list] = {}
        self.wholes: dict[str, object] = {}  # name -> the concatenation of its pieces
        self.removed: list[Instruction] = []

    def computation(self, computation: Computation) -> None:
        """Rewrite one computation's chunked collectives and computation."""
        computed = self.chunking.computed
        new_for_old: dict[int, int] = {}
        waiters: dict[int, int] = {}
        for instr in computation.topological_order:
            if instr.name in self.collectives:
                split, chunks = self.collectives[instr.name]
                if split.split == "readers":
                    self._gather(split, chunks)
                else:
                    new_for_old.update(self._reduce(split, chunks))
                waiters[instr.id] = self.pieces[instr.name][-1].id
                self.removed.append(instr)
            elif instr.name in computed:
                self._compute(instr, *computed[instr.name])
                self.removed.append(instr)
        for instr in computation.topological_order:
            if instr.name in computed and (
                instr is computation.root
                or any(self.chunking.reads_whole(u, instr) for u in instr.users)
            ):
                new_for_old[instr.id] = self._whole(instr).id
        _take_place(computation, new_for_old, waiters)

    def _gather(self, split: ChunkSplit, chunks: int) -> None:
        """The all-gather of each chunk of its operand: the operand's own
        chunks where it is computed in chunks along the same dimension, else
        slices of the whole."""
        gather = split.collective
        operand = gather.operands[0]
        own = self.chunking.computed.get(operand.name) == (split.operand_dimension, chunks)
        whole = None
        if not own:
            computed = operand.name in self.chunking.computed
            whole = self._whole(operand) if computed else operand.proto
        width = split.size // chunks
        pieces = []
        for j in range(chunks):
            rows = (
                self.pieces[operand.name][j]
                if own
                else _slice(gather.computation, whole, split.operand_dimension, j, width)
            )
            piece = _clone(
                gather, f"{gather.name}.chunk{j}", [rows.id], split.operand_dimension, width
            )
            self._own_channel(piece)
            if j == 0:
                piece.control_predecessor_ids.extend(gather.proto.control_predecessor_ids)
            pieces.append(piece)
        self.pieces[gather.name] = pieces

    def _compute(self, instr: Instruction, dimension: int, chunks: int) -> None:
        """`instr` chunk by chunk: a reading dot from the gathered chunks, a
        producing dot from its left operand's chunks (or slices), an
        elementwise operation from its operands' chunks and narrowed scalars."""
        width = instr.shape.dims[dimension] // chunks
        found = self.chunking.producer_split(instr)
        producer = found[0] if found is not None else None
        pieces = []
        for j in range(chunks):
            operands = [
                self._operand_chunk(instr, k, producer, dimension, width, j).id
                for k in range(len(instr.operands))
            ]
            pieces.append(_clone(instr, f"{instr.name}.chunk{j}", operands, dimension, width))
        self.pieces[instr.name] = pieces

    def _operand_chunk(self, instr, k: int, producer, dimension: int, width: int, j: int):
        """What chunk j of `instr` reads as its operand k."""
        operand = instr.operands[k]
        computed = self.chunking.computed
        if instr.opcode != "dot":  # elementwise: chunks, or narrowed scalars
            if operand.name in computed:
                return self.pieces[operand.name][j]
            return self._narrow_broadcast(operand, dimension, width)
        if producer is not None and k == 0:
            return self._left_chunk(instr, producer, computed[instr.name][1], j)
        if operand.name in self.collectives:  # the gathered chunks a reader reads
            return self.pieces[operand.name][j]
        return self._whole(operand) if operand.name in computed else operand.proto

    def _left_chunk(self, dot: Instruction, split: ChunkSplit, chunks: int, j: int):
        """Chunk j of a producing dot's left operand: its own chunk where it is
        computed in chunks along the split dimension, else a slice."""
        left = dot.operands[0]
        if self.chunking.reads_chunks(dot, split, chunks):
            return self.pieces[left.name][j]
        whole = self._whole(left) if left.name in self.chunking.computed else left.proto
        return _slice(dot.computation, whole, split.operand_dimension, j, split.size // chunks)

    def _narrow_broadcast(self, broadcast: Instruction, dimension: int, width: int):
        key = f"{broadcast.name}/{dimension}/{width}"
        if key not in self.wholes:
            self.wholes[key] = _clone(
                broadcast, f"{broadcast.name}.narrow", [broadcast.operands[0].id], dimension, width
            )
        return self.wholes[key]

    def _whole(self, instr: Instruction):
        """The concatenation of a chunked value's pieces (made once)."""
        if instr.name not in self.wholes:
            dimension = self.chunking.computed[instr.name][0]
            self.wholes[instr.name] = _concatenate(
                instr.computation, instr, self.pieces[instr.name], dimension
            )
        return self.wholes[instr.name]

    def _reduce(self, split: ChunkSplit, chunks: int) -> dict[int, int]:
        """The all-reduce of each chunk of its producing dot; returns what
        replaces the whole all-reduce (or its dynamic-slice reader)."""
        reduce, (dot,) = split.collective, split.dots
        output = split.output_dimensions[0]
        width = split.size // chunks
        reader = whole_dynamic_slice(reduce, output)
        pieces = []
        for j, product in enumerate(self.pieces[dot.name]):
            reduced = _clone(reduce, f"{reduce.name}.chunk{j}", [product.id], output, width)
            self._own_channel(reduced)
            if j == 0:
                reduced.control_predecessor_ids.extend(reduce.proto.control_predecessor_ids)
            if reader is not None:
                others = [operand.id for operand in reader.operands[1:]]
                reduced = _clone(
                    reader, f"{reader.name}.chunk{j}", [reduced.id, *others], output, width
                )
                reduced.dynamic_slice_sizes[output] = width
            pieces.append(reduced)
        self.pieces[reduce.name] = pieces
        replaced = reader if reader is not None else reduce
        if reader is not None:
            self.removed.append(reader)
        joined = _concatenate(reduce.computation, replaced, pieces, output)
        return {replaced.id: joined.id}

    def _own_channel(self, collective) -> None:
        """Give a new collective the next free channel (where the original had one)."""
        if collective.channel_id:
            collective.channel_id, self.channel = self.channel, self.channel + 1


def _narrowed(proto, dimension: int, width: int) -> ShapeProto:
    """The shape of instruction `proto` with `dimension` cut to `width`."""
    shape = ShapeProto()
    shape.CopyFrom(proto.shape)
    shape.dimensions[dimension] = width
    return shape


def _slice(computation: Computation, operand, dimension: int, j: int, width: int):
    """Chunk j of instruction proto `operand` along `dimension`."""
    ranges = [
        (j * width, (j + 1) * width) if d == dimension else (0, size)
        for d, size in enumerate(operand.shape.dimensions)
    ]
    return slice_of(computation, operand, operand, _narrowed(operand, dimension, width), ranges)


def _clone(instr: Instruction, name: str, operands, dimension: int, width: int):
    """A copy of `instr` reading `operands`, its result cut to `width` along
    `dimension`, with no control edges and no sharding (of the whole shape)."""
    clone = edit.clone_instruction(instr.computation, instr.proto, name, operands)
    clone.shape.CopyFrom(_narrowed(instr.proto, dimension, width))
    del clone.control_predecessor_ids[:]
    clone.ClearField("sharding")
    return clone


def _concatenate(computation: Computation, replaced: Instruction, pieces, dimension: int):
    """The pieces joined along `dimension`, of `replaced`'s shape."""
    joined = edit.add_instruction(
        computation,
        f"{replaced.name}.joined",
        "concatenate",
        replaced.proto.shape,
        [piece.id for piece in pieces],
    )
    joined.dimensions.append(dimension)
    joined.metadata.CopyFrom(replaced.proto.metadata)
    return joined


def _take_place(computation: Computation, readers: dict[int, int], waiters: dict[int, int]) -> None:
    """Readers of each key of `readers` (and the root) read its value instead;
    instructions that waited for a key of `waiters` wait for its value."""
    edit.redirect_uses(computation, readers)
    root = computation.proto.root_id
    computation.proto.root_id = readers.get(root, root)
    for proto in computation.proto.instructions:
        edges = proto.control_predecessor_ids
        for index, predecessor in enumerate(edges):
            if predecessor in waiters:
                edges[index] = waiters[predecessor]
