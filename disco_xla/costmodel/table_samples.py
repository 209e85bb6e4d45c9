"""XLA's measured GEMM table as kernel samples the GNN cost model reads.

The GEMM table (`simulator/gpu_tables.py`, from openxla/xla
`xla/service/gpu/model/matmul_interpolator_data.h`, Apache License 2.0, The
OpenXLA Authors; converted to `configs/gpu_tables/xla_perf_tables.json`) holds
the FLOP/s XLA measured for [b] x (m x k) . (k x n) products on H100 (`sm_90`)
and B200 (`sm_100`), b in {1, 2, 4} and m, n, k in {256, ..., 4096}, bf16 and
f32. Each grid point becomes one sample (`table_samples`): the graph of a
one-dot kernel of that shape and element type, built as the data set builds a
kernel's graph (a tiny JAX function lowered to HLO, its dot made a `Kernel`,
`features.kernel_graph`), and the time the table says, 2·b·m·n·k / FLOP/s.
A b = 1 point is a plain two-dimensional dot (as a model's dense layer is), a
larger b a dot with one leading batch dimension; both in the layout the
library takes, so the graph is exactly what a captured dot of that shape gives.

`held_out_along` splits the points for a held-out test: every point whose size
on one axis is one of the given values is held out, so the rest is still a
full grid and `GemmTable` interpolates it (`gemm_table_of`).

`tables_seconds` prices stored kernel graphs the way the `tables` cost model
(`simulator/gpu_kernels.MeasuredKernelModel`) prices the kernels they came
from, so the GNN and the tables can be scored on the same data set samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disco_xla.costmodel.dataset import KernelDataset, KernelSample, from_samples
from disco_xla.costmodel.features import ATTRIBUTE_NAMES
from disco_xla.hlo.flops import ELEMENTWISE_OPCODES
from disco_xla.simulator.gpu_kernels import CONVOLUTION_EFFICIENCY
from disco_xla.simulator.gpu_tables import GemmTable, OpCycles, load_tables
from disco_xla.simulator.kernels import Kernel, kernel_for
from disco_xla.simulator.profiles import ClusterProfile

TABLE_PLAN_KIND = "xla-gemm-table"  # the samples' plan kind
# The table's rows by element type (`gpu_tables._GEMM_ROW` for these two).
TABLE_ROWS = {"bf16": "bf16xbf16->bf16", "f32": "f32xf32->f32"}
AXES = ("b", "m", "n", "k")


@dataclass(frozen=True)
class GemmPoint:
    """One measured point of XLA's GEMM table."""

    arch: str  # 'sm_90' (H100), 'sm_100' (B200)
    b: int
    m: int
    n: int
    k: int
    element_type: str  # 'bf16' or 'f32'
    flops_per_s: float

    @property
    def flops(self) -> int:
        return 2 * self.b * self.m * self.n * self.k

    @property
    def seconds(self) -> float:
        """The measured time of the product: its FLOPs at the table's rate."""
        return self.flops / self.flops_per_s

    @property
    def key(self) -> tuple[str, str, int, int, int, int]:
        return (self.arch, self.element_type, self.b, self.m, self.n, self.k)


def gemm_points(
    arch: str = "sm_90",
    element_types: Sequence[str] = ("bf16", "f32"),
    tables: dict | None = None,
) -> list[GemmPoint]:
    """Every point of the GEMM table of `arch` for `element_types`, sorted."""
    by_row = (tables or load_tables())["matmul"][arch]
    points = []
    for element_type in element_types:
        for b, m, n, k, flops_per_s in by_row.get(TABLE_ROWS[element_type], []):
            points.append(GemmPoint(arch, b, m, n, k, element_type, float(flops_per_s)))
    return sorted(points, key=lambda p: p.key)


def dot_kernel(b: int, m: int, n: int, k: int, element_type: str) -> Kernel:
    """The `Kernel` of one dot of XLA's table shape, lowered by JAX: [m, k] x
    [k, n] for b = 1, else [b, m, k] x [b, k, n] batched over the first
    dimension; operands and result of `element_type`."""
    import jax
    from jax import lax

    from disco_xla.capture import capture_jax

    dtype = {"bf16": jax.numpy.bfloat16, "f32": jax.numpy.float32}[element_type]
    if b == 1:
        shapes = ((m, k), (k, n))
        numbers = (((1,), (0,)), ((), ()))
    else:
        shapes = ((b, m, k), (b, k, n))
        numbers = (((2,), (1,)), ((0,), (0,)))

    def product(lhs, rhs):
        return lax.dot_general(lhs, rhs, numbers)

    module = capture_jax(product, *(jax.ShapeDtypeStruct(s, dtype) for s in shapes))
    dots = [i for i in module.instructions() if i.opcode == "dot"]
    if len(dots) != 1:
        raise AssertionError(f"expected one dot in the lowered product, found {len(dots)}")
    return kernel_for(dots)


def table_samples(points: Sequence[GemmPoint], compute_scale: float = 1.0) -> KernelDataset:
    """One sample per point: its one-dot kernel's graph and time. The time is
    divided by `compute_scale`, as the `tables` cost model divides it for a
    device priced from another's table (a cluster profile's
    `measured.compute_scale`: 1.0 for the H200 from the H100's table)."""
    from disco_xla.costmodel.features import kernel_graph

    samples = []
    for point in points:
        kernel = dot_kernel(point.b, point.m, point.n, point.k, point.element_type)
        if kernel.flops != point.flops:
            raise AssertionError(f"{point}: the lowered dot has {kernel.flops} FLOPs")
        samples.append(
            KernelSample(
                graph=kernel_graph(kernel),
                time_s=point.seconds / compute_scale,
                kernel_count=1,
                module=f"xla_gemm_table.{point.arch}",
                model=f"xla_gemm_table_{point.arch}",
                plan_kind=TABLE_PLAN_KIND,
                structural_hash=kernel.structural_hash,
                element_type=kernel.element_type,
                op_class=kernel.op_class,
            )
        )
    return from_samples(samples)


def held_out_along(
    points: Sequence[GemmPoint], axis: str, values: Sequence[int]
) -> tuple[list[GemmPoint], list[GemmPoint]]:
    """(kept, held out): the points whose size on `axis` ('b', 'm', 'n' or
    'k') is one of `values` are held out. Holding out interior sizes leaves a
    full grid, which `GemmTable` can interpolate (`gemm_table_of`)."""
    if axis not in AXES:
        raise ValueError(f"axis {axis!r}: one of {AXES}")
    chosen = set(values)
    kept = [p for p in points if getattr(p, axis) not in chosen]
    held = [p for p in points if getattr(p, axis) in chosen]
    return kept, held


def gemm_table_of(points: Sequence[GemmPoint]) -> GemmTable:
    """A `GemmTable` that knows `points` only (one architecture): XLA's
    interpolation as it would be had the others never been measured."""
    archs = {p.arch for p in points}
    if len(archs) != 1:
        raise ValueError(f"points of one architecture, not {sorted(archs)}")
    rows: dict[str, list[list[float]]] = {}
    for p in points:
        rows.setdefault(TABLE_ROWS[p.element_type], []).append([p.b, p.m, p.n, p.k, p.flops_per_s])
    arch = archs.pop()
    return GemmTable(arch, {"matmul": {arch: rows}})


def tables_seconds(data: KernelDataset, profile: ClusterProfile) -> np.ndarray:
    """The `tables` cost model's time of each stored kernel graph of `data`
    (`MeasuredKernelModel.kernel_s` on the graph's values): launch + max(compute,
    memory). Each dot at the GEMM table's rate for its (batch, rows, columns,
    contracted) node attributes over the profile's `compute_scale`; each
    convolution at its type's peak times `CONVOLUTION_EFFICIENCY`; each
    elementwise op and reduction at the op-cycle table's cycles per element
    over the device's lanes; the kernel's bytes at the measured HBM bandwidth.
    A stored graph keeps no operand types, so a dot's or a convolution's
    result type stands for its input type; a graph with a custom call (whose
    target the stored graph does not keep) raises ValueError."""
    measured = profile.measured
    if measured is None:
        raise ValueError(f"profile {profile.name} has no measured GPU figures")
    tables = load_tables()
    gemms = GemmTable(measured.tables, tables)
    cycles = OpCycles(measured.cycle_tables or measured.tables, tables)
    lane_cycles_per_s = 2.0 * measured.clock_hz * measured.sm_count * measured.fp32_lanes
    column = {name: n for n, name in enumerate(ATTRIBUTE_NAMES)}
    out = np.zeros(len(data))
    for g in range(len(data)):
        gemm_s = 0.0
        lane_cycles = 0.0
        for node in range(int(data.node_offsets[g]), int(data.node_offsets[g + 1])):
            opcode = str(data.node_opcode[node])
            element_type = str(data.node_dtype[node])
            attributes = data.node_attributes[node]
            if opcode == "dot":
                b, m, n, k = (
                    int(round(attributes[column[name]]))
                    for name in ("batch", "rows", "columns", "contracted")
                )
                gemm_s += gemms.seconds(b, m, n, k, element_type)
            elif opcode == "convolution":
                peak = profile.peak_flops.get(element_type, profile.peak_flops.get("f32", 1.0))
                gemm_s += data.node_flops[node] / (peak * CONVOLUTION_EFFICIENCY)
            elif opcode == "custom-call":
                raise ValueError("a stored graph with a custom call cannot be priced")
            elif opcode in ELEMENTWISE_OPCODES or opcode in ("reduce", "reduce-window"):
                rank = int(data.node_rank[node])
                if opcode.startswith("reduce"):
                    elements = float(data.node_flops[node])
                else:
                    elements = float(math.prod(int(d) for d in data.node_dims[node][:rank]))
                lane_cycles += elements * cycles.cycles(opcode, element_type)
        compute_s = gemm_s / measured.compute_scale + lane_cycles / lane_cycles_per_s
        memory_s = (
            data.kernel_bytes_in[g] + data.kernel_bytes_out[g]
        ) / measured.memory_bandwidth_bytes_per_s
        out[g] = max(compute_s, memory_s) + profile.kernel_launch_s
    return out
