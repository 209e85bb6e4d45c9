"""XLA's own measured GPU tables, read and interpolated.

The figures come from openxla/xla (Apache License 2.0, The OpenXLA Authors),
converted to `configs/gpu_tables/xla_perf_tables.json` by
`tools/import_xla_perf_tables.py`:

- GEMMs (`matmul_interpolator_data.h`): FLOP/s on H100 (`sm_90`) and B200
  (`sm_100`) for b in {1, 2, 4} and m, n, k in {256, ..., 4096}, bf16 and f32.
  `GemmTable.seconds` interpolates log FLOP/s multilinearly in (log b, log m,
  log n, log k). Outside the grid: above it a GEMM runs at the efficiency of
  the nearest grid point (its FLOP/s); below it, it takes the time of the
  nearest grid point (a GEMM's tiles are no smaller than the grid's edge, so a
  smaller one is not faster).
- Collectives (`collective_interpolator_data.h`): NCCL all-reduce, all-gather,
  reduce-scatter and all-to-all inside one 8-GPU H100 node, f32, 2^8 to 2^29
  elements, groups of 8, 4 and 2 devices (all 8 devices busy). A row's time is
  its whole buffer's bytes over its throughput; a reduce-scatter row stores its
  result's shape, so its whole buffer is that times the group's size (with
  this reading the four kinds agree: reduce-scatter and all-gather each take
  about half an all-reduce's time). `CollectiveTable.seconds` reads a size's
  time off those points (`measured_points.measured_s`, as calibrated
  points are read) (times made non-decreasing
  in size, linear between sizes, the last bandwidth beyond the largest).
- Elementwise ops (`hlo_op_profiles_data.h`): clock cycles per element by
  opcode and element type.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from disco_xla.errors import DiscoInputError
from disco_xla.simulator.measured_points import measured_s
from disco_xla.simulator.profiles import profile_directories

TABLES_FILE = "xla_perf_tables.json"
# The GEMM table's keys by input element type. Types it has no row for are
# priced at the nearest row: f16 and 8-bit types at bf16's (an assumption:
# fp8 runs faster on Hopper, so fp8 GEMMs are priced high), 64-bit at f32's.
_GEMM_ROW = {
    "bf16": "bf16xbf16->bf16",
    "f16": "bf16xbf16->bf16",
    "f8e4m3fn": "bf16xbf16->bf16",
    "f8e5m2": "bf16xbf16->bf16",
    "s8": "bf16xbf16->bf16",
    "f32": "f32xf32->f32",
    "f64": "f32xf32->f32",
}
# Element types the op-cycle table lacks, priced as the type given (assumed).
_CYCLE_TYPE = {"bf16": "f16", "pred": "u8"}


def tables_path() -> Path:
    """The converted tables beside the cluster profiles (`configs/gpu_tables`)."""
    for directory in profile_directories():
        candidate = directory.parent / "gpu_tables" / TABLES_FILE
        if candidate.is_file():
            return candidate
    raise DiscoInputError(TABLES_FILE, "XLA's GPU tables are not installed (configs/gpu_tables)")


@lru_cache(maxsize=2)
def _tables(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise DiscoInputError(path, f"not XLA's GPU tables ({error})") from None


def load_tables() -> dict:
    return _tables(str(tables_path()))


class GemmTable:
    """Measured GEMM FLOP/s of one architecture, interpolated (module docstring)."""

    def __init__(self, arch: str, tables: dict | None = None):
        by_dtype = (tables or load_tables())["matmul"].get(arch)
        if not by_dtype:
            raise DiscoInputError(arch, "XLA's GEMM table has no such architecture")
        self.arch = arch
        self.axes: dict[str, list[list[float]]] = {}
        self.log_rate: dict[str, dict[tuple[int, int, int, int], float]] = {}
        for key, rows in by_dtype.items():
            self.log_rate[key] = {tuple(row[:4]): math.log(row[4]) for row in rows}
            self.axes[key] = [sorted({row[axis] for row in rows}) for axis in range(4)]

    def flops_per_s(self, b: int, m: int, n: int, k: int, element_type: str) -> float:
        """The interpolated FLOP/s of a [b] x (m x k) . (k x n) product, each
        size clamped to the grid."""
        key = _GEMM_ROW.get(element_type, "f32xf32->f32")
        axes, table = self.axes[key], self.log_rate[key]
        corners = [_bracket(axis, size) for axis, size in zip(axes, (b, m, n, k), strict=True)]
        total = 0.0
        for mask in range(16):
            weight, point = 1.0, []
            for axis in range(4):
                low, high, share = corners[axis]
                upper = (mask >> axis) & 1
                weight *= share if upper else 1.0 - share
                point.append(high if upper else low)
            if weight:
                total += weight * table[tuple(point)]
        return math.exp(total)

    def seconds(self, b: int, m: int, n: int, k: int, element_type: str) -> float:
        """A GEMM's time: its FLOPs at the interpolated rate; a size below the
        grid counts as the grid's edge (no faster than the smallest tile)."""
        b, m, n, k = (max(int(size), 1) for size in (b, m, n, k))
        key = _GEMM_ROW.get(element_type, "f32xf32->f32")
        floors = [axis[0] for axis in self.axes[key]]
        sizes = [max(size, floor) for size, floor in zip((b, m, n, k), floors, strict=True)]
        sizes[0] = b  # the batch counts as it is: b products of one shape
        return 2.0 * math.prod(sizes) / self.flops_per_s(b, m, n, k, element_type)


def _bracket(axis: list[float], size: float) -> tuple[float, float, float]:
    """The grid points around `size` on `axis` and the share of the upper one,
    linear in log size; clamped at the ends."""
    if size <= axis[0]:
        return axis[0], axis[0], 0.0
    if size >= axis[-1]:
        return axis[-1], axis[-1], 0.0
    for low, high in zip(axis, axis[1:], strict=False):
        if low <= size <= high:
            return low, high, math.log(size / low) / math.log(high / low)
    raise AssertionError("unreachable: the axis is sorted")


class CollectiveTable:
    """Measured NCCL collective times inside one node (module docstring)."""

    def __init__(self, arch: str, tables: dict | None = None):
        # An architecture without rows (B200's are not in this version) covers
        # nothing: its collectives are priced by NCCL's model.
        rows = (tables or load_tables())["collectives"].get(arch, [])
        self.arch = arch
        points: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for opcode, elements, element_type, _groups, per_group, bytes_per_s in rows:
            width = 8 if element_type in ("f64", "s64", "u64", "c64") else 4
            whole = elements * width * (per_group if opcode == "reduce-scatter" else 1)
            points.setdefault((opcode, per_group), []).append((whole, whole / bytes_per_s))
        self.points = {key: tuple(sorted(found)) for key, found in points.items()}
        self.group_sizes = sorted({size for _, size in self.points})

    def covers(self, kind: str, devices: int) -> bool:
        return (kind, devices) in self.points

    def seconds(self, kind: str, size_bytes: float, devices: int) -> float:
        """The time of collective `kind` on a whole buffer of `size_bytes` over
        a group of `devices` devices of the node (`covers` must hold)."""
        return measured_s(size_bytes, self.points[(kind, devices)])


class OpCycles:
    """Clock cycles per element of elementwise ops on one architecture."""

    def __init__(self, arch: str, tables: dict | None = None):
        self.by_type = (tables or load_tables())["op_cycles"].get(arch, {})
        if not self.by_type:
            raise DiscoInputError(arch, "XLA's op profiles have no such architecture")
        # Ops the table does not list (compare, select, maximum, convert, ...)
        # cost what an f32 add costs (an assumption).
        self.default_cycles = self.by_type["f32"]["add"]

    def cycles(self, opcode: str, element_type: str) -> float:
        by_op = self.by_type.get(_CYCLE_TYPE.get(element_type, element_type), {})
        return by_op.get(opcode, self.default_cycles)
