"""Pass: enforce the plan's op-fusion groups as kernel boundaries.

A group is outlined into its own computation, called through a `call` marked
`inlineable="false"`: XLA keeps the call, so it cannot fuse across the group's
edge, and it still fuses freely inside. The group's values used
outside come back through a tuple; their users read them through
get-tuple-element.

The pass outlines the groups it is given; the caller gives it only those that
need a boundary (`plan.departing_groups`):
- a group that XLA forms by itself (one of its own kernels, mapped back onto the
  module by `search.xla_fusion`) is left to XLA: nothing marks it;
- a group that holds a library op (convolution, dot) is never outlined. The
  boundary is enforced from the other side: the groups around it that depart
  from XLA's are outlined.
Why (measured by benchmarks/fusion_boundary_cost.py, pmap over 4 CPU devices):
a convolution inside a non-inlineable call keeps the call's plain layouts, so
layout assignment cannot put its transposes around it (ResNet50 tiny: 48
transposes in XLA's program, 0 with its convolutions outlined; Keras MobileNetV2:
156 and 0), and the convolutions then ran 23-26x longer in the profiler's trace
(ResNet50 0.61 -> 15.9 ms a step, MobileNetV2 287 -> 6,675 ms). Outlining only the
groups that hold a library op cost as much as outlining all of them (0.50x and
0.20x of XLA's speed); outlining every other group cost 5% (0.95x), but still
moved the conv nets' outputs by 5e-4 to 2e-3 relative. So XLA's own groups add no
call (XLA compiles the same kernels, bit-equal), and a plan pays only for its departures,
which the caller must still check against the original's outputs.

Constant expressions (values computed from constants alone: TF's element count
of a mean, the zero a reduce starts from) never cross a group's edge: an input
that is one is copied into the outlined computation, and a member that is one
stays in place as well, for the readers outside. XLA folds them as it does
without the boundary. Passed through the call they would be run-time values,
and XLA:CPU compiles e.g. a reduce whose start value is a parameter with
different rounding than one that starts from the constant 0 (1 ulp of a
batch-norm variance, which ResNet50's ill-conditioned gradients at batch 2
amplify into a relative difference of 20). A group of constant expressions alone stays as it is.

Cost: outlining a group touches only its members, their operands, and the readers
of its outputs and members (found through the graph view, and through an index of
the calls added so far), so the pass is linear in the module's size plus its edges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from disco_xla.hlo import edit
from disco_xla.hlo.flops import ELEMENTWISE_OPCODES
from disco_xla.hlo.graph import Computation, HloModule, Instruction
from disco_xla.hlo.shapes import TUPLE_TYPE

GROUP_MARK = "disco_xla.kernel"
# Opcodes whose result is a constant when their operands are constants.
_PURE_OPCODES = ELEMENTWISE_OPCODES | {
    "broadcast",
    "reshape",
    "convert",
    "bitcast",
    "bitcast-convert",
    "transpose",
    "slice",
    "concatenate",
    "reverse",
    "pad",
    "select",
}


class OutlineFusionGroups:
    """The pass (`pass_interface.HloPass`). `fusion_groups` are a plan's op-fusion
    groups, as tuples of instruction names, in the plan's order: group k's
    computation and call are named `GROUP_MARK.k`. `boundaries` are the groups
    to outline (`plan.departing_groups`); None outlines every one."""

    name = "fusion-boundaries"

    def __init__(
        self,
        fusion_groups: Sequence[tuple[str, ...]],
        boundaries: Sequence[tuple[str, ...]] | None = None,
    ):
        self.fusion_groups = tuple(tuple(group) for group in fusion_groups)
        self.boundaries = (
            self.fusion_groups
            if boundaries is None
            else tuple(tuple(group) for group in boundaries)
        )

    def run(self, module: HloModule) -> bool:
        """Outline the groups (named in `module`, a valid plan's); returns whether
        the module changed."""
        outliner = _Outliner(module)
        chosen = set(self.boundaries)
        for index, group in enumerate(self.fusion_groups):
            if group in chosen:
                outliner.outline(index, [module.instruction(name) for name in group])
        if not outliner.outlined:
            return False
        # Removed at the end: until then the members' protos stay the live ones
        # that later groups copy and rewire.
        module.remove_instructions(outliner.outlined)
        module.rebuild()
        return True


class _Outliner:
    """The state the pass carries from one group to the next (the graph view is
    not rebuilt in between: it describes the module as it was)."""

    def __init__(self, module: HloModule):
        self.module = module
        self.next_computation_id = max(c.id for c in module.proto.computations) + 1
        self.forwarded: dict[int, int] = {}  # an outlined output's id -> its get-tuple-element
        self.call_of: dict[int, int] = {}  # an outlined member's id -> its group's call
        self.outlined: list[Instruction] = []  # members moved into a callee
        # Instructions this pass added (the calls), by the ids they read as operands
        # and as control predecessors, so that outlining those ids later rewires them.
        self.added_readers: dict[int, list] = defaultdict(list)
        self.added_control_successors: dict[int, list] = defaultdict(list)
        self._control_successors: dict[int, list[Instruction]] = {}
        self._positions: dict[int, dict[int, int]] = {}  # computation id -> id(instr) -> rank
        self._constant: dict[int, bool] = {}  # id(instr) -> is a constant expression

    def is_constant_expression(self, instr: Instruction) -> bool:
        """Whether `instr` computes from constants alone: a constant, an iota, or
        a pure op (elementwise, broadcast, reshape, ...) of constant expressions."""
        pending = [instr]  # iterative: an operand chain may be long
        while pending:
            current = pending[-1]
            if id(current) in self._constant:
                pending.pop()
            elif current.opcode in ("constant", "iota"):
                self._constant[id(current)] = True
            elif current.opcode not in _PURE_OPCODES or not current.operands:
                self._constant[id(current)] = False
            else:
                unknown = [o for o in current.operands if id(o) not in self._constant]
                if unknown:
                    pending.extend(unknown)
                else:
                    self._constant[id(current)] = all(
                        self._constant[id(o)] for o in current.operands
                    )
        return self._constant[id(instr)]

    def _position(self, computation: Computation) -> dict[int, int]:
        """Each instruction's rank in `computation`'s topological order (built once)."""
        positions = self._positions.get(computation.id)
        if positions is None:
            positions = {id(i): n for n, i in enumerate(computation.topological_order)}
            self._positions[computation.id] = positions
            for instr in computation.instructions:
                for predecessor in instr.control_predecessors:
                    self._control_successors.setdefault(id(predecessor), []).append(instr)
        return positions

    def outline(self, index: int, members: list[Instruction]) -> None:
        """Replace `members` (one computation's, a valid fusion group) by a call of
        a new computation that holds copies of them; constant expressions among
        them also stay in place. A group of constant expressions alone stays as it is."""
        computation = members[0].computation
        position = self._position(computation)
        order = sorted(members, key=lambda m: position[id(m)])
        moved = [m for m in order if not self.is_constant_expression(m)]
        if not moved:
            return
        inputs, constants = self._inputs(order)
        group = {id(m) for m in members}
        outputs = [
            m for m in moved if computation.root is m or any(id(u) not in group for u in m.users)
        ]
        callee = self._add_callee(index, inputs, _operands_first(constants) + order, outputs)
        call = self._add_call(computation, index, callee, inputs, moved)
        self._read_outputs_from_call(computation, call, outputs, moved)
        self._wait_for_call(call, moved)

    def _inputs(self, order: list[Instruction]) -> tuple[list[Instruction], list[Instruction]]:
        """The operands of a group's members from outside it, each once: (what the
        call passes in, the constant expressions the callee computes again)."""
        inside = {id(m) for m in order}
        inputs: list[Instruction] = []
        constants: list[Instruction] = []
        seen_inputs: set[int] = set()
        for member in order:
            for operand in member.operands:
                if id(operand) in inside or id(operand) in seen_inputs:
                    continue
                seen_inputs.add(id(operand))
                if self.is_constant_expression(operand):
                    constants.append(operand)
                else:
                    inputs.append(operand)
        return inputs, constants

    def _add_call(self, computation, index: int, callee, inputs, moved: list[Instruction]):
        """Add the non-inlineable call of `callee` in place of the `moved`
        members, with their control predecessors from outside the group."""
        call = edit.add_instruction(
            computation,
            f"{GROUP_MARK}.{index}.call",
            "call",
            callee.program_shape.result,
            [self.forwarded.get(i.id, i.id) for i in inputs],
        )
        call.called_computation_ids.append(callee.id)
        call.frontend_attributes.map["inlineable"] = "false"
        call.metadata.op_name = f"{GROUP_MARK}/{index}"
        for i in inputs:
            self.added_readers[i.id].append(call)
        inside = {id(m) for m in moved}
        predecessors = dict.fromkeys(
            p.id for m in moved for p in m.control_predecessors if id(p) not in inside
        )
        for predecessor in predecessors:
            if predecessor in self.call_of:  # its group is outlined already
                call.control_predecessor_ids.append(self.call_of[predecessor])
            else:
                call.control_predecessor_ids.append(predecessor)
                self.added_control_successors[predecessor].append(call)
        return call

    def _read_outputs_from_call(self, computation, call, outputs, moved) -> None:
        """One get-tuple-element per output; the readers outside read it instead."""
        inside = {id(m) for m in moved}
        for slot, output in enumerate(outputs):
            element = edit.add_instruction(
                computation,
                f"{output.name}.out",
                "get-tuple-element",
                output.proto.shape,
                [call.id],
            )
            element.tuple_index = slot
            element.metadata.CopyFrom(output.proto.metadata)
            self.forwarded[output.id] = element.id
            readers = [u.proto for u in output.users if id(u) not in inside]
            readers += self.added_readers.pop(output.id, [])
            for proto in readers:
                for operand_slot, operand in enumerate(proto.operand_ids):
                    if operand == output.id:
                        proto.operand_ids[operand_slot] = element.id
            if computation.proto.root_id == output.id:
                computation.proto.root_id = element.id

    def _wait_for_call(self, call, moved: list[Instruction]) -> None:
        """Whatever had to wait for a moved member now waits for the call."""
        inside = {id(m) for m in moved}
        for member in moved:
            self.call_of[member.id] = call.id
            self.outlined.append(member)
            successors = [
                s.proto for s in self._control_successors.get(id(member), []) if id(s) not in inside
            ]
            successors += self.added_control_successors.pop(member.id, [])
            for proto in successors:
                for slot, predecessor in enumerate(proto.control_predecessor_ids):
                    if predecessor == member.id:
                        proto.control_predecessor_ids[slot] = call.id

    def _add_callee(
        self,
        index: int,
        inputs: list[Instruction],
        order: list[Instruction],
        outputs: list[Instruction],
    ):
        """Add the outlined computation (its proto is returned): parameters for
        the inputs, copies of the instructions in `order` (operands first; the
        copies of constant expressions, whose originals stay, renamed), a tuple
        of the outputs as root."""
        callee_id = self.next_computation_id
        self.next_computation_id += 1
        callee = self.module.proto.computations.add(name=f"{GROUP_MARK}.{index}", id=callee_id)
        new_id: dict[int, int] = {}
        for number, source in enumerate(inputs):
            parameter = callee.instructions.add(
                name=f"{GROUP_MARK}.{index}.in{number}",
                opcode="parameter",
                parameter_number=number,
                id=(callee_id << 32) | len(callee.instructions),
            )
            parameter.shape.CopyFrom(source.proto.shape)
            callee.program_shape.parameters.add().CopyFrom(source.proto.shape)
            callee.program_shape.parameter_names.append(f"in{number}")
            # A member's operand may already read an earlier group's get-tuple-element.
            new_id[source.id] = new_id[self.forwarded.get(source.id, source.id)] = parameter.id
        for instr in order:
            copy = callee.instructions.add()
            copy.CopyFrom(instr.proto)
            copy.id = (callee_id << 32) | (len(callee.instructions) - 1)
            del copy.control_predecessor_ids[:]
            if self.is_constant_expression(instr):  # the original stays: a new name
                copy.name = f"{GROUP_MARK}.{index}.{instr.name}"
            for slot, operand in enumerate(copy.operand_ids):
                copy.operand_ids[slot] = new_id[operand]
            new_id[instr.id] = copy.id
        root = callee.instructions.add(
            name=f"{GROUP_MARK}.{index}.out",
            opcode="tuple",
            id=(callee_id << 32) | len(callee.instructions),
        )
        root.shape.element_type = TUPLE_TYPE
        for output in outputs:
            root.operand_ids.append(new_id[output.id])
            root.shape.tuple_shapes.add().CopyFrom(output.proto.shape)
        callee.root_id = root.id
        callee.program_shape.result.CopyFrom(root.shape)
        return callee


def _operands_first(roots: list[Instruction]) -> list[Instruction]:
    """`roots` and everything they compute from, each once, operands before users."""
    found: list[Instruction] = []
    placed: set[int] = set()
    for root in roots:
        stack = [(root, iter(root.operands))]
        while stack:  # depth-first, post-order
            node, pending = stack[-1]
            following = next((o for o in pending if id(o) not in placed), None)
            if following is not None:
                stack.append((following, iter(following.operands)))
                continue
            stack.pop()
            if id(node) not in placed:
                placed.add(id(node))
                found.append(node)
    return found
