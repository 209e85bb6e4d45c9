"""The FLOP model: an estimate of the floating-point operations of each
instruction, by opcode, and of one run of a whole module.

An analysis over the IR (`graph`); it changes nothing. Data movement and
opcodes the model does not know count zero.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from disco_xla.hlo.custom_calls import library_call_flops
from disco_xla.hlo.trip_counts import executions

if TYPE_CHECKING:
    from disco_xla.hlo.graph import HloModule, Instruction

# One FLOP per output element.
ELEMENTWISE_OPCODES = frozenset(
    """abs add atan2 and cbrt ceil clamp compare cosine divide erf exponential
    exponential-minus-one floor imag is-finite log log-plus-one logistic maximum minimum
    multiply negate not or popcnt power real remainder round-nearest-afz round-nearest-even
    rsqrt select shift-left shift-right-arithmetic shift-right-logical sign sine sqrt
    subtract tan tanh xor count-leading-zeros stochastic-convert""".split()
)


def estimate_flops(instr: Instruction) -> int:
    """A FLOP estimate by opcode: dot 2·M·N·K, convolution 2·out·window·in-features,
    elementwise one per output element, reductions one per input element, fusion the
    sum of its fused computation, a library call by its target (`custom_calls`).
    Data movement and unknown opcodes count zero."""
    opcode = instr.opcode
    if opcode in ELEMENTWISE_OPCODES:
        return instr.shape.elements
    if opcode == "dot":
        numbers = instr.proto.dot_dimension_numbers
        lhs = instr.operands[0].shape.dims if instr.operands else ()
        contracted = math.prod(
            max(lhs[d], 0) for d in numbers.lhs_contracting_dimensions if 0 <= d < len(lhs)
        )
        return 2 * instr.shape.elements * contracted
    if opcode == "convolution":
        return _convolution_flops(instr)
    if opcode in ("reduce", "all-reduce", "all-reduce-start", "reduce-scatter"):
        inputs = (
            instr.operands[: max(1, len(instr.operands) // 2)]
            if opcode == "reduce"
            else instr.operands
        )
        return sum(op.shape.elements for op in inputs)
    if opcode == "reduce-window":
        window = math.prod(max(d.size, 1) for d in instr.proto.window.dimensions)
        return instr.shape.elements * window
    if opcode == "fusion":
        return sum(i.flops for c in instr.called_computations for i in c.instructions)
    if opcode == "custom-call":
        return library_call_flops(instr, _convolution_flops)
    return 0


def _convolution_flops(instr: Instruction, output: int | None = None) -> int:
    """2 · output elements · kernel window · input features (`output`: the
    output's elements, where the result is a tuple, as a cuDNN call's is)."""
    if len(instr.operands) < 2:
        return 0
    kernel = instr.operands[1].shape.dims
    numbers = instr.proto.convolution_dimension_numbers
    window = math.prod(
        max(kernel[d], 0) for d in numbers.kernel_spatial_dimensions if 0 <= d < len(kernel)
    )
    in_dim = numbers.kernel_input_feature_dimension
    in_features = max(kernel[in_dim], 0) if 0 <= in_dim < len(kernel) else 1
    return 2 * (instr.shape.elements if output is None else output) * window * in_features


def total_flops(module: HloModule) -> int:
    """FLOPs of one run of the program: entry and program computations, each
    as often as it runs (a loop body once per trip: `trip_counts`); a fusion
    counts its fused computation; reducers passed as `to_apply` are counted
    by the instruction that applies them."""
    runs = executions(module)
    return sum(
        instr.flops * runs.get(computation.name, 1)
        for computation in module.computations
        if computation.role in ("entry", "program")
        for instr in computation.instructions
    )


def computed_instructions(members: list[Instruction]) -> Iterator[Instruction]:
    """The instructions a kernel computes: its members, with the bodies of
    fusion instructions in place of them (a compiled module's kernels are
    fusions)."""
    stack = list(members)
    while stack:
        instr = stack.pop()
        if instr.opcode == "fusion":
            for computation in instr.called_computations:
                stack.extend(computation.instructions)
        else:
            yield instr
