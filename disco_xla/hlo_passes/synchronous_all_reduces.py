"""Pass: each asynchronous all-reduce pair becomes one all-reduce.

A module XLA:GPU scheduled (an after-optimizations dump) sends its all-reduces
as `all-reduce-start` and `all-reduce-done` pairs. Bucketing replaces the
gradient (the start) by a slice of its bucket, which would leave the done
waiting for something that is no longer a start. So, before bucketing, each
pair becomes the synchronous `all-reduce` it was before XLA's async conversion:
the start keeps its name (the plan's name for the gradient) and its attributes,
the done's users read it, and the done goes. XLA makes the pairs again when it
compiles the rewritten module.
"""

from __future__ import annotations

from disco_xla.hlo import edit
from disco_xla.hlo.graph import HloModule


class SynchronousAllReduces:
    """The pass (`pass_interface.HloPass`); it takes no configuration."""

    name = "synchronous-all-reduces"

    def run(self, module: HloModule) -> bool:
        """Turn every start/done pair into an all-reduce; whether there was one."""
        dones = [
            instr
            for instr in module.instructions()
            if instr.opcode == "all-reduce-done"
            and len(instr.operands) == 1
            and instr.operands[0].opcode == "all-reduce-start"
        ]
        for done in dones:
            start = done.operands[0].proto
            start.opcode = "all-reduce"
            start.backend_config = b""  # the async queue it was scheduled on
            edit.replace_uses(done.computation, done.id, start.id, keep={done.id})
        if dones:
            module.remove_instructions(dones)
            module.rebuild()
        return bool(dones)
