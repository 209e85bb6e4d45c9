"""A fused kernel as a small graph of instructions: what the GNN cost model reads.

`kernel_graph(kernel)` turns a `Kernel` (one op-fusion group) into plain arrays:
one node per instruction (opcode, dtype, dims, FLOPs, bytes, and the attributes
of `ATTRIBUTE_NAMES`: window, strides, groups, fan-in, the minor dimension and
whether a transpose moves it; for a dot or a convolution, the shape of its matrix
product and whether its operands come in the library's layout) and one edge per
operand → user pair inside the kernel, weighted by the tensor's bytes. A `fusion`
instruction (a kernel of a compiled module) is opened up: its fused computation's
instructions become the nodes, its parameters the kernel's inputs. The data set
(`dataset.py`) stores these arrays as they are, and the network featurises them
with a fixed vocabulary (`network.featurize`), so one function serves training and
prediction.

Feature sets (`FEATURE_SETS`) say how many of those attributes the network reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from disco_xla.hlo.graph import Instruction
from disco_xla.simulator.kernels import Kernel

MAX_RANK = 6  # dims beyond this are folded into the last one

# The fixed opcode vocabulary of the GNN; anything else goes to the 'other' bucket.
OPCODE_VOCABULARY = (
    "abs add and atan2 bitcast bitcast-convert broadcast cbrt ceil clamp compare "
    "concatenate constant convert convolution copy cosine divide dot dynamic-slice "
    "dynamic-update-slice erf exponential exponential-minus-one floor gather iota "
    "is-finite log log-plus-one logistic maximum minimum multiply negate not or pad "
    "popcnt power reduce reduce-precision reduce-window remainder reshape reverse "
    "round-nearest-afz round-nearest-even rsqrt rng-bit-generator scatter select "
    "select-and-scatter shift-left shift-right-arithmetic shift-right-logical sign sine "
    "slice sort sqrt subtract tan tanh transpose tuple get-tuple-element xor"
).split()
OTHER = "other"
DTYPE_VOCABULARY = ("pred", "s8", "s16", "s32", "s64", "u8", "u32", "f16", "bf16", "f32", "f64")

# Per-node attributes that FLOPs and bytes do not show, which set how fast a CPU
# runs the same work: a convolution's (or window reduction's) window elements and
# stride product, a convolution's groups (feature x batch group count: depthwise
# when it equals the channels), the elements of the largest operand per result
# element (a reduction's fan-in; below 1 for a broadcast), the size of the minor
# (last, row-major) dimension of the result, which sets vector width, and whether
# a transpose moves that minor dimension (a strided, cache-unfriendly copy).
STRUCTURAL_ATTRIBUTE_NAMES = (
    "window",
    "stride",
    "groups",
    "fan_in",
    "minor_dim",
    "transposes_minor",
)
# Per-node attributes of the instructions XLA:CPU hands to a library (dot and
# convolution), whose time follows the shape of the matrix product they are more
# than their FLOPs: the product's `rows` x `contracted` by `contracted` x
# `columns`, `batch` times over (a convolution as the product it lowers to: rows
# are the result's positions, batch x spatial; columns its output features;
# contracted the input features of a group x the window), and whether each
# operand and the result is laid out as the library takes it, without a
# transpose first: a dot's batch dimensions leading, the lhs's contracted
# dimensions last and the rhs's right after its batch ones; a convolution's input
# and result batch-first and feature-last, its kernel input- then output-feature
# last. Other nodes read 1 for each.
LIBRARY_ATTRIBUTE_NAMES = (
    "rows",
    "columns",
    "contracted",
    "batch",
    "canonical_lhs",
    "canonical_rhs",
    "canonical_result",
)
ATTRIBUTE_NAMES = STRUCTURAL_ATTRIBUTE_NAMES + LIBRARY_ATTRIBUTE_NAMES

# Feature sets: 1, the plain node features; 2, those and each node's structural
# attributes (`STRUCTURAL_ATTRIBUTE_NAMES`); 3, all of `ATTRIBUTE_NAMES` (the
# library instructions' too). A model's config names its set; weights written
# before sets existed read as set 1. Set -> how many attribute columns it reads.
SET_ATTRIBUTES = {1: 0, 2: len(STRUCTURAL_ATTRIBUTE_NAMES), 3: len(ATTRIBUTE_NAMES)}
FEATURE_SETS = tuple(SET_ATTRIBUTES)
LATEST_FEATURE_SET = 3


@dataclass(frozen=True)
class KernelGraph:
    """One kernel's instruction graph as raw (unfeaturised) values."""

    opcodes: tuple[str, ...]  # per node
    dtypes: tuple[str, ...]  # per node, of the (largest) result
    dims: np.ndarray  # [nodes, MAX_RANK] int64, zero-padded
    ranks: np.ndarray  # [nodes] int64
    flops: np.ndarray  # [nodes] float64
    out_bytes: np.ndarray  # [nodes] float64: the result's size
    in_bytes: np.ndarray  # [nodes] float64: operands read from outside the kernel
    is_output: np.ndarray  # [nodes] bool: the result leaves the kernel
    attributes: np.ndarray  # [nodes, len(ATTRIBUTE_NAMES)] float64, raw values
    senders: np.ndarray  # [edges] int64: operand node
    receivers: np.ndarray  # [edges] int64: user node
    edge_bytes: np.ndarray  # [edges] float64
    kernel_flops: float
    kernel_bytes_in: float
    kernel_bytes_out: float

    @property
    def node_count(self) -> int:
        return len(self.opcodes)

    @property
    def edge_count(self) -> int:
        return len(self.senders)


def _expanded(instructions: list[Instruction]) -> tuple[list[Instruction], dict[int, object]]:
    """The kernel's nodes, with each fusion replaced by its fused instructions, and
    for each fused parameter the fusion operand it stands for."""
    nodes: list[Instruction] = []
    stands_for: dict[int, object] = {}
    for instr in instructions:
        if instr.opcode == "fusion" and instr.called_computations:
            body = instr.called_computations[0]
            for inner in body.topological_order:
                if inner.opcode == "parameter":
                    number = inner.proto.parameter_number
                    if number < len(instr.operands):
                        stands_for[id(inner)] = instr.operands[number]
                else:
                    nodes.append(inner)
        else:
            nodes.append(instr)
    return nodes, stands_for


def _dims(instr: Instruction) -> tuple[str, tuple[int, ...]]:
    leaves = instr.shape.leaves()
    largest = max(leaves, key=lambda s: s.bytes) if leaves else instr.shape
    dims = tuple(max(d, 0) for d in largest.dims)
    if len(dims) > MAX_RANK:
        dims = dims[: MAX_RANK - 1] + (math.prod(dims[MAX_RANK - 1 :]),)
    return largest.element_type, dims


def _library_attributes(instr: Instruction) -> tuple[float, ...]:
    """`instr`'s values of LIBRARY_ATTRIBUTE_NAMES (all 1 unless a dot or a
    convolution with its two operands)."""
    proto = instr.proto
    if instr.opcode not in ("dot", "convolution") or len(instr.operands) < 2:
        return (1.0,) * len(LIBRARY_ATTRIBUTE_NAMES)
    lhs, rhs = (o.shape for o in instr.operands[:2])
    if instr.opcode == "dot":
        numbers = proto.dot_dimension_numbers
        lhs_batch = list(numbers.lhs_batch_dimensions)
        lhs_contracted = list(numbers.lhs_contracting_dimensions)
        batch = math.prod(lhs.dims[d] for d in lhs_batch)
        contracted = math.prod(lhs.dims[d] for d in lhs_contracted)
        shared = max(batch * contracted, 1)
        rank, kept = len(lhs.dims), len(lhs_batch)
        return (
            max(lhs.elements / shared, 1.0),
            max(rhs.elements / shared, 1.0),
            float(max(contracted, 1)),
            float(max(batch, 1)),
            float(
                lhs_batch == list(range(kept))
                and lhs_contracted == list(range(rank - len(lhs_contracted), rank))
            ),
            float(
                list(numbers.rhs_batch_dimensions) == list(range(kept))
                and list(numbers.rhs_contracting_dimensions)
                == list(range(kept, kept + len(lhs_contracted)))
            ),
            1.0,
        )
    numbers = proto.convolution_dimension_numbers
    result = instr.shape
    features = max(result.dims[numbers.output_feature_dimension], 1)
    window = math.prod(rhs.dims[d] for d in numbers.kernel_spatial_dimensions)
    contracted = max(rhs.dims[numbers.kernel_input_feature_dimension] * window, 1)
    last = len(result.dims) - 1
    return (
        max(result.elements / features, 1.0),
        float(features),
        float(contracted),
        1.0,
        float(numbers.input_batch_dimension == 0 and numbers.input_feature_dimension == last),
        float(
            numbers.kernel_input_feature_dimension == last - 1
            and numbers.kernel_output_feature_dimension == last
        ),
        float(numbers.output_batch_dimension == 0 and numbers.output_feature_dimension == last),
    )


def node_attributes(instr: Instruction, dims: tuple[int, ...] | None = None) -> tuple[float, ...]:
    """`instr`'s values of ATTRIBUTE_NAMES (1 where an attribute does not apply;
    0 for `transposes_minor` off transposes and for a library instruction's
    operand laid out otherwise). `dims`: its node dims, if known."""
    proto = instr.proto
    opcode = instr.opcode
    window = stride = groups = 1.0
    if opcode in ("convolution", "reduce-window", "select-and-scatter"):
        for dimension in proto.window.dimensions:
            window *= max(dimension.size, 1)
            stride *= max(dimension.stride, 1)
    if opcode == "convolution":
        groups = float(max(proto.feature_group_count, 1) * max(proto.batch_group_count, 1))
    elements = max(instr.shape.elements, 1)
    operand_elements = max((o.shape.elements for o in instr.operands), default=elements)
    fan_in = max(operand_elements, 1) / elements
    dims = _dims(instr)[1] if dims is None else dims
    minor = float(dims[-1]) if dims else 1.0
    moves_minor = 0.0
    if opcode == "transpose" and len(proto.dimensions) > 1:
        moves_minor = float(proto.dimensions[-1] != len(proto.dimensions) - 1)
    structural = (window, stride, groups, fan_in, max(minor, 1.0), moves_minor)
    return structural + _library_attributes(instr)


def kernel_graph(kernel: Kernel) -> KernelGraph:
    """The instruction graph of `kernel` (see the module docstring)."""
    nodes, stands_for = _expanded(kernel.instructions)
    index = {id(n): k for k, n in enumerate(nodes)}
    outer_members = {id(i) for i in kernel.instructions}
    count = len(nodes)
    dims = np.zeros((count, MAX_RANK), np.int64)
    ranks = np.zeros(count, np.int64)
    flops = np.zeros(count)
    out_bytes = np.zeros(count)
    in_bytes = np.zeros(count)
    is_output = np.zeros(count, bool)
    attributes = np.ones((count, len(ATTRIBUTE_NAMES)))
    dtypes = []
    senders, receivers, edge_bytes = [], [], []
    for k, node in enumerate(nodes):
        dtype, shape_dims = _dims(node)
        dtypes.append(dtype)
        dims[k, : len(shape_dims)] = shape_dims
        ranks[k] = len(shape_dims)
        flops[k] = node.flops
        out_bytes[k] = node.shape.bytes
        attributes[k] = node_attributes(node, shape_dims)
        for operand in node.operands:
            source = stands_for.get(id(operand), operand)
            if id(source) in index:
                senders.append(index[id(source)])
                receivers.append(k)
                edge_bytes.append(source.shape.bytes)
            else:
                in_bytes[k] += source.shape.bytes
        users = node.users
        if node.computation.root is node and id(node) not in outer_members:
            # the root of a fused computation: what the fusion returns
            fusion_users = [u for c in node.computation.callers for u in c.users]
            is_output[k] = not fusion_users or any(id(u) not in outer_members for u in fusion_users)
        else:
            is_output[k] = not users or any(id(u) not in index for u in users)
    return KernelGraph(
        opcodes=tuple(n.opcode for n in nodes),
        dtypes=tuple(dtypes),
        dims=dims,
        ranks=ranks,
        flops=flops,
        out_bytes=out_bytes,
        in_bytes=in_bytes,
        is_output=is_output,
        attributes=attributes,
        senders=np.array(senders, np.int64),
        receivers=np.array(receivers, np.int64),
        edge_bytes=np.array(edge_bytes, np.float64),
        kernel_flops=float(flops.sum()),
        kernel_bytes_in=float(kernel.bytes_in),
        kernel_bytes_out=float(kernel.bytes_out),
    )
