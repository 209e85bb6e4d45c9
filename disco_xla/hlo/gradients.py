"""Gradient detection: which cross-device reductions of a module reduce gradients.

A gradient all-reduce (or reduce-scatter) is a cross-device sum of a tensor
computed in the backward pass. An instruction is backward code if its
`metadata.op_name` carries a backward mark (BACKWARD_MARKS) or one of its
operands is backward code; the result of a reduction is not (it has already
been reduced). If the module carries no marks at all (hand-written HLO), every
cross-device sum of a non-scalar is taken to be a gradient.

An analysis over the IR (`graph`); it changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.opcodes import REDUCTION_OPCODES

if TYPE_CHECKING:
    from disco_xla.hlo.graph import HloModule, Instruction

# What the all-reduce insertion pass (`insert_gradient_all_reduces`) puts in the
# op_name of each all-reduce and mean it adds: `GRADIENT_MARK/<gradient name>`.
GRADIENT_MARK = "disco_xla.gradient"
# Substrings of `metadata.op_name` that mark backward-pass (gradient) code:
# JAX autodiff names it `transpose(jvp(...))`, TF's GradientTape `gradient_tape/`,
# and our own all-reduce insertion pass marks what it adds with GRADIENT_MARK.
BACKWARD_MARKS = ("transpose(", "gradient_tape/", GRADIENT_MARK)


class BackwardCode:
    """The backward-pass instructions of a module's program computations (those
    that are not fusion bodies or applied reducers), found once."""

    def __init__(self, module: HloModule):
        self._ids: set[int] = set()  # id(instr) of backward instructions
        self.marked = False  # whether any instruction carries a backward mark
        for computation in module.computations:
            if computation.role in ("fusion", "applied"):
                continue
            for instr in computation.topological_order:
                if instr.opcode in REDUCTION_OPCODES:
                    continue
                if any(mark in instr.op_name for mark in BACKWARD_MARKS):
                    self.marked = True
                    self._ids.add(id(instr))
                elif self.reads_backward(instr):
                    self._ids.add(id(instr))

    def reads_backward(self, instr: Instruction) -> bool:
        """Whether one of `instr`'s operands is backward code."""
        return any(id(operand) in self._ids for operand in instr.operands)


def is_gradient_reduction(
    reduction: Instruction, cross_device_sum: bool, backward: BackwardCode
) -> bool:
    """Whether `reduction` (an all-reduce or reduce-scatter; `cross_device_sum`
    says whether it sums over more than one device) reduces a gradient."""
    if not cross_device_sum:
        return False
    if backward.marked:
        return backward.reads_backward(reduction) or GRADIENT_MARK in reduction.op_name
    return any(leaf.dims for leaf in reduction.shape.leaves())
