"""Pass: inline `call`s, as XLA's CallInliner does before it fuses.

JAX lowers small helpers (`jnp.where`, `jnp.var`, `log_softmax`, ...) to
computations reached through `call`, and one computation may be called from
several places. A plan needs one name per kernel instruction, and the simulator
one task per instruction, so each call site gets its own copy of the callee's
instructions, in the caller: parameters become the call's operands, and the
callee's root takes the call's place. Calls marked `inlineable="false"` (JAX's
shard_map body, our own fusion boundaries) stay calls, as they do in XLA.
Computations no longer called are removed.
"""

from __future__ import annotations

from disco_xla.hlo import edit
from disco_xla.hlo.graph import HloModule, Instruction


class InlineCalls:
    """The pass (`pass_interface.HloPass`); it takes no configuration."""

    name = "inline-calls"

    def run(self, module: HloModule) -> bool:
        """Inline every inlineable call; returns whether the module changed."""
        changed = False
        while True:
            calls = _innermost_inlineable_calls(module)
            if not calls:
                break
            for call in calls:
                _inline(call)
            module.remove_instructions(calls)
            module.rebuild()
            changed = True
        if changed:
            _remove_uncalled_computations(module)
        return changed


def _innermost_inlineable_calls(module: HloModule) -> list[Instruction]:
    """The inlineable calls of program code whose callee has none left: callees
    are copied innermost first, each once it has no calls of its own."""
    return [
        instr
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.instructions
        if _inlineable(instr)
        and not any(_inlineable(inner) for inner in instr.called_computations[0].instructions)
    ]


def _inlineable(instr: Instruction) -> bool:
    return (
        instr.opcode == "call"
        and instr.proto.frontend_attributes.map.get("inlineable") != "false"
        and len(instr.called_computations) == 1
    )


def _inline(call: Instruction) -> None:
    caller = call.computation
    callee = call.called_computations[0]
    new_id: dict[int, int] = {}
    for instr in callee.topological_order:
        if instr.opcode == "parameter":
            new_id[instr.id] = call.proto.operand_ids[instr.proto.parameter_number]
            continue
        copy = edit.add_instruction(caller, instr.name, instr.opcode, instr.proto.shape)
        fresh = copy.id
        name = copy.name
        copy.CopyFrom(instr.proto)
        copy.id, copy.name = fresh, name
        del copy.operand_ids[:]
        copy.operand_ids.extend(new_id[o] for o in instr.proto.operand_ids)
        del copy.control_predecessor_ids[:]
        copy.control_predecessor_ids.extend(
            new_id[p] for p in instr.proto.control_predecessor_ids if p in new_id
        )
        new_id[instr.id] = fresh
    result = new_id[callee.root.id]
    edit.replace_uses(caller, call.id, result, keep=set())
    for proto in caller.proto.instructions:  # control edges on the call move to the result
        if call.id in proto.control_predecessor_ids:
            proto.control_predecessor_ids[:] = [
                result if p == call.id else p for p in proto.control_predecessor_ids
            ]
    if caller.proto.root_id == call.id:
        caller.proto.root_id = result


def _remove_uncalled_computations(module: HloModule) -> None:
    while True:
        called = {c.id for instr in module.instructions() for c in instr.called_computations}
        kept = [c.proto for c in module.computations if c is module.entry or c.id in called]
        if len(kept) == len(module.proto.computations):
            return
        del module.proto.computations[:]
        module.proto.computations.extend(kept)
        module.rebuild()
