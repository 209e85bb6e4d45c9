"""A GPU profile's published measurements: its `measured` and `nccl` sections.

Each figure carries its published source in the section's `sources` map; a
figure without one is refused. `measured` is what `gpu_kernels` prices kernels
with (XLA's tables of an architecture, achieved HBM bandwidth, SM count, clock,
FP32 lanes, fused-attention rates) and `nccl` what `nccl` prices collectives
across nodes with (achieved bus and adapter bandwidths).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from disco_xla.errors import DiscoInputError
from disco_xla.simulator.profile_checks import number_map, positive


@dataclass(frozen=True)
class MeasuredDevice:
    """A GPU profile's measured figures (`measured` in its YAML), each with its
    published source in `sources`: what `gpu_kernels.MeasuredKernelModel`
    prices kernels with, and `nccl` collectives inside a node."""

    tables: str  # the architecture's rows in XLA's tables ('sm_90')
    memory_bandwidth_bytes_per_s: float  # achieved (a streaming kernel), not the datasheet's
    sm_count: int
    clock_hz: float
    fp32_lanes: int  # per SM
    compute_scale: float = 1.0  # this GPU's GEMM rate over the tables' GPU
    collective_scale: float = 1.0  # this node's collective speed over the tables' node
    # Achieved FLOP/s of fused attention calls, by library-call kind
    # ('attention-forward', 'attention-backward').
    attention_flops_per_s: dict[str, float] = field(default_factory=dict)
    cycle_tables: str = ""  # the op-cycle table's architecture, where it differs
    sources: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class NcclNetwork:
    """A GPU cluster's achieved NCCL figures (the profile's `nccl` section),
    each with its published source in `sources`."""

    intra_node_bus_bytes_per_s: float  # ring bus bandwidth inside a node
    nic_bytes_per_s: float  # achieved per network adapter through NCCL
    # The adapters a node's ranks of one collective use: all of the node's for
    # a collective over every GPU, a share of them for a group with fewer
    # GPUs on each node (`comm.group_profile`).
    nics_per_node: float
    # NVLink SHARP's all-reduce algorithm bandwidth in a node (0: no NVSwitch SHARP).
    nvls_algorithm_bytes_per_s: float = 0.0
    # Latency the network path adds to each network hop beyond NCCL's model
    # (a TCP or socket transport's; 0 on InfiniBand).
    extra_network_hop_s: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)


_MEASURED_NUMBERS = {
    "memory_bandwidth_bytes_per_s": float,
    "sm_count": int,
    "clock_hz": float,
    "fp32_lanes": int,
    "compute_scale": float,
    "collective_scale": float,
}


def _sourced_section(section: dict, where: str, source: str) -> dict[str, str]:
    """A section's `sources`: one text for each of its figures (a figure
    without its source is refused)."""
    sources = section.get("sources")
    if not isinstance(sources, dict) or not all(
        isinstance(text, str) and text for text in sources.values()
    ):
        raise DiscoInputError(source, f"bad or missing key '{where}.sources': a text per figure")
    for key in section:
        if key not in ("sources", "tables", "cycle_tables") and key not in sources:
            raise DiscoInputError(source, f"'{where}.{key}' has no source in '{where}.sources'")
    return {str(k): v for k, v in sources.items()}


def measured_device(section, source: str) -> MeasuredDevice:
    if not isinstance(section, dict):
        raise DiscoInputError(source, "bad key 'measured': expected a mapping")
    known = {*_MEASURED_NUMBERS, "tables", "cycle_tables", "attention_flops_per_s", "sources"}
    for key in section:
        if key not in known:
            raise DiscoInputError(source, f"unknown key 'measured.{key}'")
    if not isinstance(section.get("tables"), str):
        raise DiscoInputError(source, "bad or missing key 'measured.tables': an architecture")
    numbers = {
        key: kind(positive(section, key, "measured", source))
        for key, kind in _MEASURED_NUMBERS.items()
        if key in section or key not in ("compute_scale", "collective_scale")
    }
    attention = (
        number_map(section, "attention_flops_per_s", "measured.attention_flops_per_s", source)
        if "attention_flops_per_s" in section
        else {}
    )
    return MeasuredDevice(
        tables=section["tables"],
        cycle_tables=str(section.get("cycle_tables", "")),
        attention_flops_per_s=attention,
        sources=_sourced_section(section, "measured", source),
        **numbers,
    )


_NCCL_NUMBERS = {
    "intra_node_bus_bytes_per_s": float,
    "nic_bytes_per_s": float,
    "nics_per_node": float,
    "nvls_algorithm_bytes_per_s": float,
    "extra_network_hop_s": float,
}
_NCCL_OPTIONAL = ("nvls_algorithm_bytes_per_s", "extra_network_hop_s")


def nccl_network(section, source: str) -> NcclNetwork:
    if not isinstance(section, dict):
        raise DiscoInputError(source, "bad key 'nccl': expected a mapping")
    for key in section:
        if key not in _NCCL_NUMBERS and key != "sources":
            raise DiscoInputError(source, f"unknown key 'nccl.{key}'")
    numbers = {
        key: kind(positive(section, key, "nccl", source, allow_zero=key in _NCCL_OPTIONAL))
        for key, kind in _NCCL_NUMBERS.items()
        if key in section or key not in _NCCL_OPTIONAL
    }
    return NcclNetwork(sources=_sourced_section(section, "nccl", source), **numbers)
