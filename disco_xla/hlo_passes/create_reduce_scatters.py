"""Pass: the partitioner's all-reduce + dynamic-slice pairs become reduce-scatters,
as XLA:GPU's `ReduceScatterCreator` makes them before its combiners run.

XLA's SPMD partitioner writes a reduce-scatter as an all-reduce followed by a
dynamic-slice that keeps the device's own block. XLA:GPU turns each such pair
into one reduce-scatter, which moves half an all-reduce's bytes; XLA:CPU does
not. A plan that buckets the gradients concatenates them, which hides the
pair from XLA:GPU's creator, so the plan is made for the module after this
pass: its buckets of these gradients are reduce-scatter buckets, and every
device still gets its own block (`bucket_all_reduces`).

Only pairs whose slice offsets are proven to be each device's place in its
group are rewritten (`xla_gpu_patterns.scattered_dimensions`). The
reduce-scatter takes the all-reduce's name, reducer, channel and groups, and
the slice's users read it.
"""

from __future__ import annotations

from disco_xla.hlo import edit
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.xla_gpu_patterns import scattered_dimensions, sole_dynamic_slice


class CreateReduceScatters:
    """The pass (`pass_interface.HloPass`); it takes no configuration."""

    name = "create-reduce-scatters"

    def run(self, module: HloModule) -> bool:
        """Rewrite every proven pair; returns whether the module changed."""
        # By computation: {all-reduce id: its reduce-scatter}, and the slices gone.
        placed: dict[int, tuple[object, dict[int, object], set[int]]] = {}
        for name, dimension in sorted(scattered_dimensions(module).items()):
            reduce = module.instruction(name)
            reader = sole_dynamic_slice(reduce)
            if _ordered_by_control(reduce) or _ordered_by_control(reader):
                continue
            computation = reduce.computation
            scatter = edit.clone_instruction(
                computation, reduce.proto, f"{name}.scatter", list(reduce.proto.operand_ids)
            )
            scatter.opcode = "reduce-scatter"
            scatter.shape.CopyFrom(reader.proto.shape)
            del scatter.dimensions[:]
            scatter.dimensions.append(dimension)
            edit.replace_uses(computation, reader.id, scatter.id, keep={scatter.id})
            if computation.proto.root_id == reader.id:
                computation.proto.root_id = scatter.id
            entry = placed.setdefault(id(computation), (computation, {}, set()))
            entry[1][reduce.id] = scatter
            entry[2].add(reader.id)
        for computation, scatters, readers in placed.values():
            _in_place(computation, scatters, readers)
        if not placed:
            return False
        module.rebuild()
        return True


def _in_place(computation, scatters: dict[int, object], readers: set[int]) -> None:
    """Each reduce-scatter where its all-reduce was, under its name, and the
    all-reduces and their slices gone: the program keeps its order."""
    new_ids = {scatter.id for scatter in scatters.values()}
    kept = []
    for proto in computation.proto.instructions:
        if proto.id in readers or proto.id in new_ids:
            continue
        scatter = scatters.get(proto.id)
        if scatter is not None:
            scatter.name = proto.name
            proto = scatter
        copy = type(proto)()
        copy.CopyFrom(proto)
        kept.append(copy)
    del computation.proto.instructions[:]
    computation.proto.instructions.extend(kept)


def _ordered_by_control(instr) -> bool:
    """Whether a control dependency names `instr`, or `instr` has one."""
    if instr.proto.control_predecessor_ids:
        return True
    return any(
        instr.id in other.control_predecessor_ids for other in instr.computation.proto.instructions
    )
