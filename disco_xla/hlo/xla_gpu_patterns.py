"""Two patterns XLA:GPU's compiler rewrites in the programs it is given, which
decide what it sends (an analysis over the IR; it changes nothing).

- **Reduce-scatter creation.** XLA's SPMD partitioner writes a reduce-scatter
  as an all-reduce followed by a dynamic-slice that keeps the device's own
  block. XLA:GPU's reduce-scatter creator (`ReduceScatterCreator`, in its
  collective optimisations, before the combiners) turns the pair into one
  reduce-scatter, which moves half an all-reduce's bytes.
  `scattering_all_reduces` finds the pairs: an all-reduce whose one reader is
  a dynamic-slice of it that keeps 1/p of one dimension and all of the
  others, p being its group's size. (XLA also proves the slice's offset is
  the device's place in its group; the partitioner writes it so.)
- **Collective pipelining of results** (`--xla_gpu_enable_pipelined_reduce_scatter`,
  `..._all_reduce`, on at optimisation level O1). XLA's collective pipeliner
  sinks a loop body's reduce-scatter or all-reduce whose result is only
  stored into a loop-carried buffer (a dynamic-update-slice of a tuple
  element, returned by the body) into the next trip, so each trip's
  collective runs beside the next trip's compute. `sinkable_collectives`
  finds them: the result reaches the body's root only as the update of such
  a dynamic-update-slice, through layout ops, a creator's dynamic-slice, or
  a further collective (the data-parallel all-reduce of a shard).
"""

from __future__ import annotations

import numpy as np

from disco_xla.hlo.collectives import collective_kind, device_groups
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.hlo.loops import loop_of_body

_LAYOUT_OPS = frozenset({"bitcast", "copy", "convert", "reshape", "transpose"})
_SUNK_KINDS = frozenset({"all-reduce", "reduce-scatter"})


def group_size(instr: Instruction, workers: int) -> int:
    """How many devices each of the collective's groups holds (`workers`
    where its groups are empty: one group of every device)."""
    groups = device_groups(instr.proto)
    if not groups or not isinstance(groups[0], tuple):
        return workers
    return len(groups[0])


def scattering_all_reduces(module: HloModule) -> frozenset[str]:
    """The all-reduces XLA:GPU's reduce-scatter creator turns into
    reduce-scatters (the module's docstring), by name."""
    return frozenset(scattered_dimensions(module))


def scattered_dimensions(module: HloModule) -> dict[str, int]:
    """Each all-reduce a reduce-scatter can replace, by name, with the dimension
    its dynamic-slice reader keeps a block of: the slice keeps 1/p of that
    dimension and all of the others (p its group's size), and its offsets,
    evaluated on every device (`_device_values`), are that device's place in
    its group times the block, and 0 elsewhere. This is the proof XLA's
    creator makes; a pair whose offsets cannot be evaluated is left alone."""
    workers = module.worker_count()
    found = {}
    for computation in module.computations:
        for instr in computation.instructions:
            if instr.opcode != "all-reduce":
                continue
            cut = _kept_block(instr, workers)
            if cut is not None and _offsets_are_ranks(instr, cut, workers):
                found[instr.name] = cut
    return found


def sole_dynamic_slice(value: Instruction) -> Instruction | None:
    """`value`'s one reader when it is a dynamic-slice of it (and `value` is
    not its computation's result), else None."""
    if len(value.users) != 1 or value is value.computation.root:
        return None
    (reader,) = value.users
    if reader.opcode != "dynamic-slice" or reader.operands[0] is not value:
        return None
    return reader if reader.operands.count(value) == 1 else None


def _kept_block(reduce: Instruction, workers: int) -> int | None:
    """The dimension of which `reduce`'s dynamic-slice reader keeps 1/p (all
    of every other), else None."""
    reader = sole_dynamic_slice(reduce)
    if reader is None or reduce.shape.is_tuple:
        return None
    dims = list(reduce.shape.dims)
    sizes = list(reader.proto.dynamic_slice_sizes)
    parts = group_size(reduce, workers)
    if parts < 2 or len(sizes) != len(dims):
        return None
    cut = [d for d in range(len(dims)) if sizes[d] != dims[d]]
    if len(cut) != 1 or sizes[cut[0]] * parts != dims[cut[0]]:
        return None
    return cut[0]


def _offsets_are_ranks(reduce: Instruction, cut: int, workers: int) -> bool:
    """Whether the reader's offsets on every device are its place in its group
    times the block along `cut`, and 0 along every other dimension."""
    reader = sole_dynamic_slice(reduce)
    groups = device_groups(reduce.proto)
    if not groups:
        groups = (tuple(range(workers)),)
    if not all(isinstance(group, tuple) for group in groups):
        return False
    rank = {device: place for group in groups for place, device in enumerate(group)}
    if sorted(rank) != list(range(workers)):
        return False
    block = reader.proto.dynamic_slice_sizes[cut]
    # Cross-partition groups (a channel) name partitions; cross-replica, replicas.
    by_partition = bool(reduce.proto.channel_id)
    for device in range(workers):
        values: dict[int, np.ndarray | None] = {}
        ids = (device, 0) if by_partition else (0, device)
        for number, index in enumerate(reader.operands[1:]):
            value = _device_values(index, ids, values, depth=0)
            if value is None or value.size != 1:
                return False
            limit = reduce.shape.dims[number] - reader.proto.dynamic_slice_sizes[number]
            start = min(max(int(value.reshape(())), 0), limit)  # XLA clamps starts
            if start != (rank[device] * block if number == cut else 0):
                return False
    return True


_PASS_VALUES = frozenset({"bitcast", "convert", "copy", "reshape"})
_ARITHMETIC = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply}
_INTEGER_LITERALS = ("s32s", "s64s", "u32s")


def _device_values(
    instr: Instruction, ids: tuple[int, int], memo: dict, depth: int
) -> np.ndarray | None:
    """The integer value of `instr` on the device whose (partition, replica)
    ids are `ids`, where it is computed from constants and those ids by
    integer arithmetic, reshapes and dynamic-slices of constants; else None."""
    if instr.id in memo:
        return memo[instr.id]
    memo[instr.id] = None  # a cycle or too deep a tree evaluates to None
    if depth > 32:
        return None
    operands = [_device_values(o, ids, memo, depth + 1) for o in instr.operands]
    value = None
    if instr.opcode == "constant":
        literal = instr.proto.literal
        numbers = next((v for v in map(literal.__getattribute__, _INTEGER_LITERALS) if v), None)
        if numbers is not None:
            value = np.array(list(numbers), dtype=np.int64).reshape(instr.shape.dims)
    elif instr.opcode in ("partition-id", "replica-id"):
        value = np.array(ids[0] if instr.opcode == "partition-id" else ids[1], dtype=np.int64)
    elif any(o is None for o in operands):
        value = None
    elif instr.opcode in _PASS_VALUES and len(operands) == 1:
        value = operands[0].reshape(instr.shape.dims)
    elif instr.opcode in _ARITHMETIC and len(operands) == 2:
        value = _ARITHMETIC[instr.opcode](operands[0], operands[1])
    elif instr.opcode == "dynamic-slice" and operands and operands[0].ndim == len(operands) - 1:
        array, starts = operands[0], [int(o.reshape(())) for o in operands[1:]]
        sizes = list(instr.proto.dynamic_slice_sizes)
        starts = [min(max(x, 0), n - k) for x, n, k in zip(starts, array.shape, sizes, strict=True)]
        value = array[tuple(slice(x, x + k) for x, k in zip(starts, sizes, strict=True))]
    memo[instr.id] = value
    return value


def sinkable_collectives(module: HloModule) -> frozenset[str]:
    """The loop-body reduce-scatters and all-reduces XLA's collective
    pipeliner sinks into the next trip (the module's docstring), by name."""
    found = []
    for computation in module.computations:
        if loop_of_body(computation) is None:
            continue
        for instr in computation.instructions:
            if collective_kind(instr) in _SUNK_KINDS and _only_stored(instr):
                found.append(instr.name)
    return frozenset(found)


def _only_stored(collective: Instruction) -> bool:
    """Whether every use of `collective`'s result ends as the update of a
    dynamic-update-slice into a loop-carried element that the root returns."""
    body = collective.computation
    pending, seen = [collective], {collective.id}
    while pending:
        value = pending.pop()
        if not value.users or value is body.root:
            return False
        for user in value.users:
            if user.id in seen:
                continue
            if user.opcode == "dynamic-update-slice":
                if not _stores_into_carry(user, value, body.root):
                    return False
                continue
            passes = (
                user.opcode in _LAYOUT_OPS
                or (user.opcode == "dynamic-slice" and user.operands[0] is value)
                or collective_kind(user) in _SUNK_KINDS
            )
            if not passes:
                return False
            seen.add(user.id)
            pending.append(user)
    return True


def _stores_into_carry(store: Instruction, value: Instruction, root: Instruction) -> bool:
    operands = store.operands
    return (
        len(operands) > 1
        and operands[1] is value
        and operands[0] is not value
        and operands[0].opcode == "get-tuple-element"
        and operands[0].operands[0].opcode == "parameter"
        and list(store.users) == [root]
    )
