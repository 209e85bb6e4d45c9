"""Fused-kernel cost models behind one interface.

- `RooflineCostModel`: max(flops / (peak · e_compute), bytes / (bandwidth · e_memory))
  + launch overhead, with per-op-class efficiency factors from the profile;
- `MeasuredKernelModel` ('tables', `gpu_kernels`): XLA's measured GPU tables
  and published rates, for a profile with a `measured` section (the default,
  'auto', on such a profile);
- `TableCostModel`: measured times keyed by the kernel's structural hash, falling
  back to the roofline for kernels it has not seen (and counting them);
- `GnnCostModel` (`disco_xla/costmodel/`): a graph network over the kernel's
  instructions that predicts its log-time, with shipped weights per device in
  `configs/costmodels/<device>/`. It sits above the simulator (it reads the
  simulator's `Kernel`), so `make_cost_model` imports it only when asked for 'gnn'.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from disco_xla.errors import DiscoInputError
from disco_xla.plan import needs_boundary
from disco_xla.simulator.gpu_kernels import MeasuredKernelModel
from disco_xla.simulator.kernels import Kernel, TaskGraph
from disco_xla.simulator.profiles import ClusterProfile

log = logging.getLogger(__name__)

# A kernel cost function: kernel -> predicted seconds.
KernelCostFn = Callable[[Kernel], float]

# Up to this many kernels, `RooflineCostModel.kernels_s` computes one at a time.
SCALAR_KERNELS = 8
# Default fraction of peak reached, by the most expensive op class in a kernel.
DEFAULT_EFFICIENCY = {"dot": 0.7, "convolution": 0.6, "reduce": 0.5, "elementwise": 0.5}


class CostModel(Protocol):
    name: str

    def kernel_s(self, kernel: Kernel) -> float:
        """Predicted time of one kernel, in seconds."""
        ...

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        """Predicted times of all the graph's kernels, batched."""
        ...


class RooflineCostModel:
    name = "roofline"

    def __init__(self, profile: ClusterProfile):
        self.profile = profile
        self.efficiency = {**DEFAULT_EFFICIENCY, **profile.efficiency}

    def kernel_s(self, kernel: Kernel) -> float:
        profile = self.profile
        peak = profile.peak_flops.get(kernel.element_type) or profile.peak_flops.get(
            "f32", next(iter(profile.peak_flops.values()))
        )
        efficiency = self.efficiency[kernel.op_class]
        compute_s = kernel.flops / (peak * efficiency)
        memory_s = kernel.bytes / (profile.memory_bandwidth_bytes_per_s * efficiency)
        return max(compute_s, memory_s) + profile.kernel_launch_s

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        """The same formula over arrays of every kernel's FLOPs and bytes (for a
        few kernels, such as the new kernels of a search move, the same float64
        operations one kernel at a time, which is faster than building arrays)."""
        profile = self.profile
        default_peak = profile.peak_flops.get("f32", next(iter(profile.peak_flops.values())))
        kernels = getattr(graph, "kernels", None)  # callers may pass the arrays alone
        if kernels is not None and len(kernels) <= SCALAR_KERNELS:
            try:
                return [self._batched_kernel_s(kernel, default_peak) for kernel in kernels]
            except ZeroDivisionError:
                pass  # numpy divides by zero to an infinity
        arrays = graph.kernel_arrays
        peak = np.array([profile.peak_flops.get(t, default_peak) for t in arrays.element_types])
        efficiency = np.array([self.efficiency[c] for c in arrays.op_classes])
        per_kernel_peak = peak[arrays.element_type_index] * efficiency[arrays.op_class_index]
        per_kernel_bandwidth = (
            profile.memory_bandwidth_bytes_per_s * efficiency[arrays.op_class_index]
        )
        seconds = np.maximum(arrays.flops / per_kernel_peak, arrays.bytes / per_kernel_bandwidth)
        return (seconds + profile.kernel_launch_s).tolist()

    def _batched_kernel_s(self, kernel: Kernel, default_peak: float) -> float:
        """One kernel's time exactly as `kernels_s` computes it over arrays: the
        same float64 operations in the same order (np.maximum propagates NaN)."""
        profile = self.profile
        efficiency = self.efficiency[kernel.op_class]
        peak = profile.peak_flops.get(kernel.element_type, default_peak) * efficiency
        compute_s = float(kernel.flops) / peak
        memory_s = float(kernel.bytes) / (profile.memory_bandwidth_bytes_per_s * efficiency)
        if compute_s != compute_s or memory_s != memory_s:  # NaN
            return math.nan
        return max(compute_s, memory_s) + profile.kernel_launch_s


class TableCostModel:
    """Measured kernel times ({structural hash: seconds}, from a JSON file or
    the plan cache's times measured on this machine), and `fallback`'s
    prediction for the kernels it has not seen (counted in `misses`)."""

    name = "table"

    def __init__(self, times_s: dict[str, float], fallback: CostModel):
        self.times_s = times_s
        self.fallback = fallback
        self.misses = 0

    @classmethod
    def load(cls, path: str, fallback: CostModel) -> TableCostModel:
        try:
            with open(path) as file:
                data = json.load(file)
            times = {str(k): float(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError, TypeError) as error:
            raise DiscoInputError(path, f"not a kernel time table ({error})") from None
        return cls(times, fallback)

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        """The measured times, and the fallback's (batched) for the others."""
        known = [self.times_s.get(kernel.structural_hash) for kernel in graph.kernels]
        missing = sum(seconds is None for seconds in known)
        if not missing:
            return known
        self.misses += missing
        predicted = self.fallback.kernels_s(graph)
        return [p if s is None else s for s, p in zip(known, predicted, strict=True)]

    def kernel_s(self, kernel: Kernel) -> float:
        measured = self.times_s.get(kernel.structural_hash)
        if measured is not None:
            return measured
        self.misses += 1
        return self.fallback.kernel_s(kernel)


class BoundaryChargedCostModel:
    """Another cost model's kernel times, plus `boundary_s` for each kernel whose
    group the rewrite must enforce with a boundary (`plan.needs_boundary`: not
    one of XLA's own groups, no library op). XLA's own fusion costs what it did."""

    def __init__(self, inner: CostModel, left_to_xla, boundary_s: float):
        self.inner = inner
        self.name = inner.name
        self.left_to_xla = {frozenset(group) for group in left_to_xla}
        self.boundary_s = boundary_s

    def _charge_s(self, kernel: Kernel) -> float:
        return self.boundary_s if needs_boundary(kernel.instructions, self.left_to_xla) else 0.0

    def kernel_s(self, kernel: Kernel) -> float:
        return self.inner.kernel_s(kernel) + self._charge_s(kernel)

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        seconds = self.inner.kernels_s(graph)
        return [s + self._charge_s(k) for s, k in zip(seconds, graph.kernels, strict=True)]


class CrossingChargedCostModel:
    """Another cost model's kernel times, plus, for each kernel that departs
    from XLA's fusion, the HBM write and read of each tensor that crosses its
    new boundary: a value XLA keeps inside one of its fused kernels that this
    kernel reads from, or writes for, another kernel (a GPU profile's price of
    a boundary; the extra kernel's launch is already in its time)."""

    def __init__(self, inner: CostModel, left_to_xla, bandwidth_bytes_per_s: float):
        self.inner = inner
        self.name = inner.name
        self.xla_group = {name: n for n, group in enumerate(left_to_xla) for name in group}
        self.bandwidth = bandwidth_bytes_per_s
        self._charges: dict[int, tuple[Kernel, float]] = {}

    def crossing_bytes(self, kernel: Kernel) -> int:
        """Bytes of the values XLA keeps inside one fused kernel that cross
        this kernel's edge (read in, or written out), each counted once."""
        group_of = self.xla_group
        inside = {id(i) for i in kernel.instructions}
        crossing: dict[int, int] = {}
        for instr in kernel.instructions:
            mine = group_of.get(instr.name)
            if mine is None:
                continue
            for operand in instr.operands:
                if id(operand) not in inside and group_of.get(operand.name) == mine:
                    crossing[id(operand)] = operand.shape.bytes
            for user in instr.users:
                if id(user) not in inside and group_of.get(user.name) == mine:
                    crossing[id(instr)] = instr.shape.bytes
        return sum(crossing.values())

    def _charge_s(self, kernel: Kernel) -> float:
        found = self._charges.get(id(kernel))
        if found is None or found[0] is not kernel:
            found = (kernel, self.crossing_bytes(kernel) / self.bandwidth)
            self._charges[id(kernel)] = found
        return found[1]

    def kernel_s(self, kernel: Kernel) -> float:
        return self.inner.kernel_s(kernel) + self._charge_s(kernel)

    def kernels_s(self, graph: TaskGraph) -> list[float]:
        seconds = self.inner.kernels_s(graph)
        return [s + self._charge_s(k) for s, k in zip(seconds, graph.kernels, strict=True)]


def boundary_charged(cost_model: CostModel, profile: ClusterProfile, left_to_xla) -> CostModel:
    """`cost_model`, charging each kernel that departs from XLA's groups
    `left_to_xla`: on a GPU profile with measured figures, the HBM traffic of
    the values its new boundary cuts (`CrossingChargedCostModel`); elsewhere the
    profile's measured `fusion_boundary_s` (unchanged where it is 0)."""
    if profile.measured is not None:
        bandwidth = profile.measured.memory_bandwidth_bytes_per_s
        cost_model = CrossingChargedCostModel(cost_model, left_to_xla, bandwidth)
    if profile.fusion_boundary_s <= 0:
        return cost_model
    return BoundaryChargedCostModel(cost_model, left_to_xla, profile.fusion_boundary_s)


COST_MODELS = ("auto", "roofline", "tables", "table", "gnn")


def cost_model_name(name: str, profile: ClusterProfile) -> str:
    """'auto': 'tables' on a profile with measured GPU figures, else 'roofline'."""
    if name != "auto":
        return name
    return "tables" if profile.measured is not None else "roofline"


def make_cost_model(
    name: str, profile: ClusterProfile, table: str | None = None, gnn_model: str | None = None
) -> CostModel:
    """The cost model called `name`: 'roofline', 'tables' (XLA's measured GPU
    tables, `gpu_kernels`; the profile needs a `measured` section), 'table'
    with a table file, 'gnn' with a model directory (default: the shipped
    weights for the profile's device, `costmodel.weights.weights_device`), or
    'auto' (`cost_model_name`)."""
    name = cost_model_name(name, profile)
    roofline = RooflineCostModel(profile)
    if name == "roofline":
        return roofline
    if name == "tables":
        if profile.measured is None:
            raise DiscoInputError(
                profile.source or profile.name,
                "the tables cost model needs a profile with measured GPU figures ('measured')",
            )
        try:
            return MeasuredKernelModel(profile)
        except DiscoInputError as error:  # an architecture XLA's tables lack
            raise DiscoInputError(
                profile.source or profile.name,
                f"bad key 'measured.tables': {profile.measured.tables!r} ({error.problem})",
            ) from None
    if name == "gnn":
        from disco_xla.costmodel.network import GnnCostModel
        from disco_xla.costmodel.weights import (
            DEFAULT_DEVICE,
            default_model_directory,
            weights_device,
        )

        device = weights_device(profile.device_name)
        if not gnn_model and device == DEFAULT_DEVICE and profile.execution == "gpu-streams":
            log.warning(
                "no GNN weights are shipped for %s: the CPU's predict its kernels "
                "(train some with benchmarks/gpu_profile.sh, or use --cost-model roofline)",
                profile.device_name,
            )
        return GnnCostModel.load(gnn_model or default_model_directory(device))
    if name == "table":
        if not table:
            raise DiscoInputError(
                "cost model", "the table cost model needs a table of kernel times"
            )
        return TableCostModel.load(table, fallback=roofline)
    raise DiscoInputError(
        "cost model", f"unknown cost model {name!r}; use {', '.join(COST_MODELS)}"
    )
