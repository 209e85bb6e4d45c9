"""Kernel times on a GPU from measurements (`MeasuredKernelModel`, cost model 'tables').

A fused kernel is priced by what it computes (`MeasuredKernelModel.compute_s`):
- each dot (and each cuBLAS GEMM call) at XLA's measured GEMM rate for its
  b, m, n, k and its *input* element type (`gpu_tables.GemmTable`), scaled by
  the profile's `compute_scale`;
- each convolution at its input type's peak FLOP/s times the roofline's
  convolution efficiency (no measured table: an assumption);
- each fused attention call (cuDNN, Transformer Engine) at the profile's
  published achieved attention FLOP/s, forward and backward; a causal one
  (its backend config's mask) at the published causal rate, over the half of
  its FLOPs the mask leaves, as those rates count them;
- each elementwise op at XLA's measured clock cycles per element
  (`gpu_tables.OpCycles`), spread over every FP32 lane of the device:
  cycles · elements / (2 · clock · SMs · lanes), XLA's own reading of them;
- its bytes (read from outside, written for outside) at the achieved HBM
  bandwidth.

Time = launch + max(compute, memory): the kernel is bound by whichever is
longer. Dots inside fusions (XLA's compiled modules) count the same way.
"""

from __future__ import annotations

import math

from disco_xla.hlo.custom_calls import library_call_flops, library_call_kind
from disco_xla.hlo.flops import ELEMENTWISE_OPCODES, computed_instructions
from disco_xla.hlo.graph import Instruction
from disco_xla.simulator.gpu_tables import GemmTable, OpCycles, load_tables
from disco_xla.simulator.kernels import Kernel, TaskGraph
from disco_xla.simulator.profiles import ClusterProfile

# The convolution efficiency the roofline assumes (`cost_models.DEFAULT_EFFICIENCY`).
CONVOLUTION_EFFICIENCY = 0.6


def gemm_dimensions(instr: Instruction) -> tuple[int, int, int, int]:
    """(b, m, n, k) of a dot: batch, the left operand's free size, the right
    operand's free size, and the contracted size."""
    numbers = instr.proto.dot_dimension_numbers
    lhs = instr.operands[0].shape.dims if instr.operands else ()
    rhs = instr.operands[1].shape.dims if len(instr.operands) > 1 else ()

    def size(dims, chosen) -> int:
        return math.prod(max(dims[d], 0) for d in chosen if 0 <= d < len(dims))

    batch = size(lhs, numbers.lhs_batch_dimensions)
    k = size(lhs, numbers.lhs_contracting_dimensions)
    m = size(lhs, range(len(lhs))) // max(batch * k, 1)
    rhs_fixed = set(numbers.rhs_batch_dimensions) | set(numbers.rhs_contracting_dimensions)
    n = size(rhs, [d for d in range(len(rhs)) if d not in rhs_fixed])
    return batch, m, n, k


def _input_type(instr: Instruction) -> str:
    leaves = instr.operands[0].shape.leaves() if instr.operands else []
    return leaves[0].element_type if leaves else "f32"


class MeasuredKernelModel:
    """Kernel times from XLA's measured tables and the profile's published
    figures (module docstring). Needs a profile with a `measured` section."""

    name = "tables"

    def __init__(self, profile: ClusterProfile, tables: dict | None = None):
        measured = profile.measured
        if measured is None:
            raise ValueError(f"profile {profile.name} has no measured GPU figures")
        tables = tables or load_tables()
        self.profile, self.device = profile, measured
        self.gemms = GemmTable(measured.tables, tables)
        self.cycles = OpCycles(measured.cycle_tables or measured.tables, tables)
        self.lane_cycles_per_s = 2.0 * measured.clock_hz * measured.sm_count * measured.fp32_lanes
        self._seconds: dict[int, tuple[Kernel, float]] = {}

    def compute_s(self, kernel: Kernel) -> float:
        """The kernel's compute time: its dots, convolutions, library calls and
        elementwise ops, each at its measured or published rate."""
        device = self.device
        seconds = 0.0
        cycles = 0.0
        for instr in computed_instructions(kernel.instructions):
            opcode = instr.opcode
            if opcode == "dot":
                seconds += self.gemms.seconds(*gemm_dimensions(instr), _input_type(instr))
            elif opcode == "convolution":
                peak = self.profile.peak_flops.get(
                    _input_type(instr), self.profile.peak_flops.get("f32", 1.0)
                )
                seconds += instr.flops / (peak * CONVOLUTION_EFFICIENCY)
            elif opcode == "custom-call":
                seconds += self._library_s(instr)
            elif opcode in ELEMENTWISE_OPCODES or opcode in ("reduce", "reduce-window"):
                leaves = instr.shape.leaves()
                element_type = leaves[0].element_type if leaves else "f32"
                elements = instr.flops if opcode.startswith("reduce") else instr.shape.elements
                cycles += elements * self.cycles.cycles(opcode, element_type)
        return seconds / device.compute_scale + cycles / self.lane_cycles_per_s

    def _library_s(self, instr: Instruction) -> float:
        kind = library_call_kind(instr)
        flops = library_call_flops(instr, lambda *_: 0)
        if kind == "gemm" and flops:
            leaves = instr.shape.leaves()
            n = leaves[0].dims[-1] if leaves and leaves[0].dims else 1
            k = flops // max(2 * (leaves[0].elements if leaves else 1), 1)
            m = (leaves[0].elements if leaves else 1) // max(n, 1)
            return self.gemms.seconds(1, m, n, k, _input_type(instr))
        if kind.startswith("attention") and is_causal(instr):
            # Published causal rates count the FLOPs a causal mask leaves: half.
            rate = self.device.attention_flops_per_s.get(f"{kind}-causal")
            if rate:
                return flops / 2 / rate
        rate = self.device.attention_flops_per_s.get(kind)
        if rate:
            return flops / rate
        return 0.0  # other library calls: their bytes at the memory bandwidth

    def kernel_s(self, kernel: Kernel) -> float:
        found = self._seconds.get(id(kernel))
        if found is not None and found[0] is kernel:
            return found[1]
        memory_s = kernel.bytes / self.device.memory_bandwidth_bytes_per_s
        seconds = max(self.compute_s(kernel), memory_s) + self.profile.kernel_launch_s
        self._seconds[id(kernel)] = (kernel, seconds)
        return seconds

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        return [self.kernel_s(kernel) for kernel in graph.kernels]


def is_causal(instr: Instruction) -> bool:
    """Whether a fused attention call masks causally, as its backend config
    says (XLA's cuDNN calls: `mask_type` CAUSAL)."""
    return b"causal" in bytes(instr.proto.backend_config).lower()
