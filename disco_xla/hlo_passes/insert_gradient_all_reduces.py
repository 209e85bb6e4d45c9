"""Pass: insert gradient all-reduces, turning a single-device training step into
its data-parallel form, as Horovod's DistributedOptimizer does.

For each output that is a gradient, we find the instruction that computes it
(looking through reshape, bitcast, copy, transpose and convert, which all-reduce
commutes with), and put `all-reduce(sum over N replicas) / N` right after it. The
users of the local gradient that are not backward code, the optimizer update and
the output, then read the mean, so all replicas apply the same update. Backward
code, whatever other gradients are computed from (batch norm computes its input
gradient from its beta gradient), keeps reading the local value, as under
Horovod's DistributedOptimizer, which all-reduces after the whole backward pass.
A gradient that is an input of the step itself (a parameter or constant) is
reduced only where it is output, since its other users are forward code.
"""

from __future__ import annotations

from collections.abc import Sequence

from disco_xla.errors import DiscoInputError
from disco_xla.hlo import edit
from disco_xla.hlo.gradients import GRADIENT_MARK
from disco_xla.hlo.graph import HloModule, Instruction
from disco_xla.hlo.shapes import F32_TYPE

_LINEAR_VIEWS = frozenset({"reshape", "bitcast", "copy", "transpose", "convert"})
_SOURCES = frozenset({"parameter", "constant", "iota"})


class InsertGradientAllReduces:
    """The pass (`pass_interface.HloPass`). `gradient_outputs` are indices into
    the entry's output tuple; `gradient_names` (same length) name them in the
    all-reduces' metadata (`GRADIENT_MARK/<name>`); `replicas` is N."""

    name = "insert-gradient-all-reduces"

    def __init__(
        self,
        gradient_outputs: Sequence[int],
        replicas: int,
        gradient_names: Sequence[str] | None = None,
    ):
        self.gradient_outputs = tuple(gradient_outputs)
        self.replicas = replicas
        self.gradient_names = tuple(gradient_names) if gradient_names else None

    def run(self, module: HloModule) -> bool:
        """Insert the all-reduces; returns whether the module changed."""
        if self.replicas < 1:
            raise DiscoInputError(
                module.source, f"replicas must be at least 1, not {self.replicas}"
            )
        if not self.gradient_outputs:
            return False
        root = module.entry.root
        if root.opcode != "tuple":
            raise DiscoInputError(module.source, "the entry computation does not return a tuple")
        producers = self._producers(module)
        entry = module.entry
        backward = _computing_a_gradient([p for p, _, _ in producers.values()])
        users: dict[int, list[Instruction]] = {}
        for instr in entry.instructions:
            for operand in instr.operands:
                users.setdefault(operand.id, []).append(instr)
        reducers: dict[int, int] = {}
        for producer, name, outputs in producers.values():
            element_type = producer.proto.shape.element_type
            if element_type not in reducers:
                reducers[element_type] = edit.add_scalar_reducer(module.proto, element_type)
            reduced_id, mean_id = _add_mean(
                entry, producer, name, self.replicas, reducers[element_type]
            )
            if producer.opcode in _SOURCES:
                for output in outputs:
                    root.proto.operand_ids[output] = mean_id
            else:
                edit.replace_uses(entry, producer.id, mean_id, keep=backward | {reduced_id})
                _views_read_the_mean(entry, producer, mean_id, backward, users)
        module.rebuild()
        return True

    def _producers(self, module: HloModule) -> dict[int, tuple[Instruction, str, list[int]]]:
        """Each gradient's producer (by id): the producer, the gradient's name, and
        the outputs that are views of it."""
        root = module.entry.root
        names = self.gradient_names or [f"output_{k}" for k in self.gradient_outputs]
        if len(names) != len(self.gradient_outputs):
            raise ValueError("gradient_names must name each gradient output")
        producers: dict[int, tuple[Instruction, str, list[int]]] = {}
        for output, name in zip(self.gradient_outputs, names, strict=True):
            if not 0 <= output < len(root.operands):
                raise DiscoInputError(
                    module.source,
                    f"output {output} does not exist ({len(root.operands)} outputs)",
                )
            producer = _gradient_producer(root.operands[output])
            _, _, outputs = producers.setdefault(producer.id, (producer, name, []))
            outputs.append(output)
        return producers


def _add_mean(entry, producer: Instruction, name: str, replicas: int, reducer_id: int):
    """Add `all-reduce(producer) / replicas` after `producer`, marked with the
    gradient's name; returns the ids of the all-reduce and of the mean."""
    element_type = producer.proto.shape.element_type
    reduced = edit.add_instruction(
        entry, f"{producer.name}.all_reduce", "all-reduce", producer.proto.shape, [producer.id]
    )
    reduced.called_computation_ids.append(reducer_id)
    reduced.replica_groups.add().replica_ids.extend(range(replicas))
    reduced.metadata.op_name = f"{GRADIENT_MARK}/{name}"
    count = edit.add_instruction(
        entry, f"{producer.name}.replicas", "constant", edit.scalar_shape(F32_TYPE)
    )
    count.literal.shape.CopyFrom(count.shape)
    count.literal.f32s.append(float(replicas))
    if element_type != F32_TYPE:
        count = edit.add_instruction(
            entry,
            f"{producer.name}.replicas_cast",
            "convert",
            edit.scalar_shape(element_type),
            [count.id],
        )
    spread = edit.add_instruction(
        entry,
        f"{producer.name}.replicas_broadcast",
        "broadcast",
        producer.proto.shape,
        [count.id],
    )
    mean = edit.add_instruction(
        entry, f"{producer.name}.mean", "divide", producer.proto.shape, [reduced.id, spread.id]
    )
    mean.metadata.op_name = f"{GRADIENT_MARK}/{name}/mean"
    return reduced.id, mean.id


def _views_read_the_mean(entry, producer, mean_id, backward, users) -> None:
    """Views of the gradient that backward code reads keep reading the local value;
    their other users (the update, the output) get copies of those views that read
    the mean instead."""
    copies = {producer.id: mean_id}

    def copy_of(view) -> int:
        if view.id not in copies:
            source = copy_of(view.operands[0])
            clone = edit.clone_instruction(entry, view.proto, f"{view.name}.mean", [source])
            copies[view.id] = clone.id
        return copies[view.id]

    stack = [u for u in users.get(producer.id, ()) if u.id in backward and _is_view(u)]
    seen = set()
    while stack:
        view = stack.pop()
        if view.id in seen:
            continue
        seen.add(view.id)
        for user in users.get(view.id, ()):
            if user.id in backward:
                if _is_view(user):
                    stack.append(user)
                continue
            for index, operand in enumerate(user.proto.operand_ids):
                if operand == view.id:
                    user.proto.operand_ids[index] = copy_of(view)


def _is_view(instr: Instruction) -> bool:
    return instr.opcode in _LINEAR_VIEWS and len(instr.operands) == 1


def _computing_a_gradient(producers: list[Instruction]) -> set[int]:
    """Ids of the gradient producers and of every instruction they are computed
    from (the backward pass, and the forward code before it)."""
    found = {p.id for p in producers}
    stack = list(producers)
    while stack:
        for operand in stack.pop().operands:
            if operand.id not in found:
                found.add(operand.id)
                stack.append(operand)
    return found


def _gradient_producer(value: Instruction) -> Instruction:
    while (
        value.opcode in _LINEAR_VIEWS
        and len(value.operands) == 1
        and value.operands[0].opcode not in _SOURCES
    ):
        value = value.operands[0]
    return value
