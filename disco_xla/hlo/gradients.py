"""Gradient detection: which cross-device reductions of a module reduce gradients.

A gradient all-reduce (or reduce-scatter) is a cross-device sum of a tensor
computed in the backward pass. An instruction is backward code if its
`metadata.op_name` carries a backward mark (BACKWARD_MARKS) or one of its
operands is backward code; the result of a reduction is not (it has already
been reduced), except a reduce-scatter's: its block is what the partitioner's
slice of a reduced gradient was, and a further all-reduce of it (data
parallelism over an FSDP shard) reduces a gradient. If the module carries no
marks at all (hand-written HLO), every cross-device sum of a non-scalar is
taken to be a gradient.

An analysis over the IR (`graph`); it changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.opcodes import CONTROL_FLOW_OPCODES, REDUCTION_OPCODES

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
                    # A reduce-scatter's block stands for the partitioner's
                    # slice of a reduced gradient, which is backward code: a
                    # data-parallel all-reduce of it reduces a gradient.
                    if instr.opcode == "reduce-scatter" and self.reads_backward(instr):
                        self._ids.add(id(instr))
                    continue
                if any(mark in instr.op_name for mark in BACKWARD_MARKS):
                    self.marked = True
                    self._ids.add(id(instr))
                elif self.reads_backward(instr):
                    self._ids.add(id(instr))

    def reads_backward(self, instr: Instruction) -> bool:
        """Whether one of `instr`'s operands is backward code."""
        return any(id(operand) in self._ids for operand in instr.operands)


def computations_with_several_call_sites(module: HloModule) -> set[str]:
    """The computations that run at more than one call site, directly or through
    a caller that does (a `jit`-ed function a step calls twice, say)."""
    sites: dict[str, int] = {}

    def count(computation) -> int:
        found = sites.get(computation.name)
        if found is None:
            sites[computation.name] = 1  # guards against a cycle through calls
            callers = [c for c in computation.callers if c.opcode in CONTROL_FLOW_OPCODES]
            found = sum(count(c.computation) for c in callers) if callers else 1
            sites[computation.name] = found
        return found

    return {c.name for c in module.computations if count(c) > 1}


def is_gradient_reduction(
    reduction: Instruction, cross_device_sum: bool, backward: BackwardCode, shared: set[str]
) -> bool:
    """Whether `reduction` (an all-reduce or reduce-scatter; `cross_device_sum`
    says whether it sums over more than one device) reduces a gradient that a
    plan can bucket. One in a computation with several call sites (`shared`) is
    left as it is: it is a reduction per call, and a bucket of it would bucket
    every call's at once."""
    if not cross_device_sum or reduction.computation.name in shared:
        return False
    if backward.marked:
        return backward.reads_backward(reduction) or GRADIENT_MARK in reduction.op_name
    return any(leaf.dims for leaf in reduction.shape.leaves())
