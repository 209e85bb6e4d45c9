"""Cluster and hardware profiles: what the simulator knows about the machines.

A profile is a YAML file (`configs/clusters/NAME.yaml`, or any path). It gives:

- `execution`: `gpu-streams` (one compute stream plus communication streams) or
  `cpu-threads` (K executor threads; a blocking collective occupies one);
- `device`: peak FLOP/s per dtype, memory bandwidth, kernel launch overhead;
- `topology`: devices per node and nodes (their product is the number of workers);
- `links`: bandwidth and latency inside a node and between nodes. The link
  between nodes may say `per: node` when one network adapter serves all the
  node's devices (its bandwidth is then shared by them); the default, `per:
  device`, is an adapter for each device;
- `all_reduce`: `ring` or `hierarchical`;
- optionally `overlap` (false when collectives never run beside compute),
  `collectives_after_compute` (true when the runtime sends the gradients only
  after the compute part, as Horovod does here),
  `communication_streams`, `compute_threads`, `efficiency` factors per op class
  for the roofline, and the host's cost of a step: `step_overhead_s` plus
  `step_buffer_s` for each argument and result buffer (both 0 unless
  `disco-xla calibrate` measured them), `kernel_time_scale`, the factor
  kernels take on cores the workers share (1 unless measured), and
  `worker_lag`, how far behind the slowest worker reaches a collective, as a
  fraction of the kernel time since the workers last met (0 unless measured).

`disco-xla calibrate` also records what it measured under `calibration`: the
all-reduce's (bytes, seconds) `points` and, for each of the other collectives it
times, `collective_points` (`MEASURED_COLLECTIVE_KINDS`).

A one-node profile may also hold `other_worker_counts`: for each further worker
count, the keys `disco-xla calibrate --add-to` measured at that count (topology,
links, step costs, calibration). On this machine a small all-reduce adds 0.5-0.8
ms to a step on 2 gloo processes and 5.4-5.8 ms on 4 (benchmarks/BENCHMARKS.md,
"What a collective adds to a step on 2 and on 4 gloo processes"), so a module is
priced with the figures measured at its own worker count where the profile has
them (`ClusterProfile.for_workers`, `load_profile(..., workers=)`).

A profile of vendor figures can be named at another scale, `NAME@NODESxDEVICES`
(`h100-32x8-ib400@4x8`: 4 nodes of 8 devices, the same GPU, links and network
adapters; `rescaled`). A profile measured by `disco-xla calibrate` cannot: its
figures hold at the worker counts it was measured at.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from disco_xla.errors import DiscoInputError
from disco_xla.settings import AUTO_CLUSTER
from disco_xla.simulator.gpu_profile import (
    MeasuredDevice,
    NcclNetwork,
    measured_device,
    nccl_network,
)
from disco_xla.simulator.profile_checks import number_map as _number_map
from disco_xla.simulator.profile_checks import positive as _positive

_REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "clusters"
_INSTALLED_CONFIGS = Path(sys.prefix) / "share" / "disco-xla" / "configs" / "clusters"


def profile_directories() -> list[Path]:
    """Where named profiles are looked up, first match wins."""
    extra = os.environ.get("DISCO_XLA_PROFILES")
    return [Path(p) for p in ([extra] if extra else [])] + [_REPO_CONFIGS, _INSTALLED_CONFIGS]


# The collectives `disco-xla calibrate` times beside the all-reduce, named as
# `collectives.collective_kind` names them.
MEASURED_COLLECTIVE_KINDS = ("all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass(frozen=True)
class Link:
    bandwidth_bytes_per_s: float
    latency_s: float
    shared_by_node: bool = False  # one adapter for all the node's devices (`per: node`)


@dataclass(frozen=True)
class ClusterProfile:
    name: str
    execution: str  # 'gpu-streams' or 'cpu-threads'
    device_name: str
    peak_flops: dict[str, float]  # per dtype name ('f32', 'bf16', ...)
    memory_bandwidth_bytes_per_s: float
    kernel_launch_s: float
    devices_per_node: int
    nodes: int
    intra_node: Link
    inter_node: Link
    all_reduce: str  # 'ring' or 'hierarchical'
    overlap: bool = True
    # True where the runtime hands the gradients to its collectives only once the
    # compute part has finished: Horovod's ops run outside the XLA-compiled step
    # (`runtime.horovod`). Horovod's fusion then sees every gradient in one cycle
    # (the `horovod` baselines); with `overlap: false` the step's time is the same
    # whether a collective runs at its place or after the compute.
    collectives_after_compute: bool = False
    communication_streams: int = 1
    compute_threads: int = 1
    # What each tensor after the first adds to a tuple all-reduce (XLA's combined
    # one): 0 where the runtime sends the tuple as one message, as NCCL sends a
    # group. XLA:CPU sends the tensors one after another: `disco-xla calibrate`
    # measures it (a psum over a tuple of 36 tensors took 11.0 ms on 2 gloo
    # processes, against 0.51 ms for the same bytes concatenated).
    tuple_all_reduce_element_s: float = 0.0
    # What each collective (a tuple all-reduce once) adds to a step beyond the
    # communication model. Learned from step times measured on the machine,
    # together with a step's tuple tensor cost, which then replaces the figure
    # above (`simulator.step_time_fit`, by `planning`): on 4
    # gloo processes a plan with many small buckets ran 8-15x its simulated time
    # while one with a few ran 2x (benchmarks/BENCHMARKS.md, "Rank fidelity on 4
    # processes"). 0 unless learned or set.
    collective_message_s: float = 0.0
    # The host's cost of one step beyond its kernels and collectives (dispatch to
    # every worker, results handed back): step_overhead_s + step_buffer_s · (the
    # step's argument and result buffers). `disco-xla calibrate` measures both
    # on empty steps (`calibrate.StepOverhead`); 0 where not measured.
    step_overhead_s: float = 0.0
    step_buffer_s: float = 0.0
    # Wall time per second of kernel time while every worker computes at once: the
    # workers share the cores, and a kernel waits while another worker's runs.
    # `disco-xla calibrate` measures it on a probe against the profiler's kernel
    # times (`calibrate.StepCosts`); 1 where not measured.
    kernel_time_scale: float = 1.0
    # How far behind the slowest worker reaches a collective: this fraction of the
    # kernel time a worker ran since the workers last met (the step's start or the
    # previous collective). A collective waits for it, holding its thread (the
    # `cpu-threads` model). Workers that share cores drift apart as they compute:
    # on this machine, with 64 KB or more of kernels a round, 0.78-1.57 of it over
    # 2 gloo processes and 0.02-0.06 for 2 devices in one process
    # (`benchmarks/all_reduce_in_step.py`). `disco-xla calibrate` measures it
    # (`calibrate.StepCosts`); 0 where not measured.
    worker_lag: float = 0.0
    # What one kernel boundary the rewrite adds to XLA's fusion costs beyond the
    # extra kernel the cost model already charges (a non-inlineable call:
    # dispatch, and the simplification and layout choices XLA loses at its edge).
    # Charged to each fusion group that departs from XLA's own
    # (`plan.needs_boundary`), as kernel time (kernel_time_scale applies).
    # `disco-xla calibrate` measures it (`profiling.boundary_cost`); 0 where not
    # measured.
    fusion_boundary_s: float = 0.0
    efficiency: dict[str, float] = field(default_factory=dict)
    # (bytes, seconds) all-reduce times measured by `disco-xla calibrate` over this
    # profile's workers, by size. Where present, the communication model reads
    # them instead of the fitted ring formula (see `comm.all_reduce_s`).
    all_reduce_points: tuple[tuple[float, float], ...] = ()
    # The same for other collectives, by kind (`MEASURED_COLLECTIVE_KINDS`), each
    # point on a buffer of that many bytes as `collectives.collective_bytes` counts it.
    # Where present, `comm.collective_s` reads them instead of the ring ratios.
    collective_points: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # The same machine measured at other worker counts (`other_worker_counts`):
    # each a whole profile, this one with that count's figures in place.
    by_worker_count: dict[int, ClusterProfile] = field(default_factory=dict)
    source: str = ""
    # A GPU's measured figures (`MeasuredDevice`); None: roofline only.
    measured: MeasuredDevice | None = None
    # How collectives between nodes are priced (`nccl.NcclNetwork`); None:
    # the ring formulas of `comm`.
    nccl: NcclNetwork | None = None

    @property
    def workers(self) -> int:
        return self.devices_per_node * self.nodes

    def for_workers(self, workers: int) -> ClusterProfile:
        """This profile as measured at `workers` workers: the section for that
        count when it has one, else itself (its own count's figures)."""
        return self.by_worker_count.get(workers, self)


_REQUIRED = {
    "name": str,
    "execution": str,
    "device": dict,
    "topology": dict,
    "links": dict,
    "all_reduce": str,
}
_OPTIONAL = {
    "overlap": bool,
    "collectives_after_compute": bool,
    "communication_streams": int,
    "compute_threads": int,
    "tuple_all_reduce_element_s": object,  # a number >= 0, checked below
    "collective_message_s": object,  # a number >= 0, checked below
    "step_overhead_s": object,  # a number >= 0, checked below
    "step_buffer_s": object,  # a number >= 0, checked below
    "kernel_time_scale": object,  # a number > 0, checked below
    "worker_lag": object,  # a number >= 0, checked below
    "fusion_boundary_s": object,  # a number >= 0, checked below
    "efficiency": dict,
    "description": str,
    "calibration": dict,
    "other_worker_counts": dict,
    "measured": dict,
    "nccl": dict,
}
# The keys a section of `other_worker_counts` may replace: what `disco-xla
# calibrate` measures; the rest (name, execution, all_reduce) is the machine's.
SECTION_KEYS = (
    "description",
    "compute_threads",
    "device",
    "topology",
    "links",
    "tuple_all_reduce_element_s",
    "step_overhead_s",
    "step_buffer_s",
    "kernel_time_scale",
    "worker_lag",
    "fusion_boundary_s",
    "calibration",
)


def available_profiles() -> list[str]:
    names = set()
    for directory in profile_directories():
        if directory.is_dir():
            names.update(p.stem for p in directory.glob("*.yaml"))
    return sorted(names)


# A profile named at another scale: "NAME@NODESxDEVICES" (`rescaled`).
_AT_SCALE = re.compile(r"(?P<base>.+)@(?P<nodes>[0-9]+)x(?P<devices_per_node>[0-9]+)")


def at_scale(name_or_path: str, nodes: int, devices_per_node: int) -> str:
    """The reference `load_profile` reads as the profile `name_or_path` with
    `nodes` nodes of `devices_per_node` devices (`rescaled`)."""
    return f"{name_or_path}@{nodes}x{devices_per_node}"


def load_profile(name_or_path: str, workers: int | None = None) -> ClusterProfile:
    """A profile by name (see `available_profiles`) or by path to a YAML file,
    either of them at another scale as `NAME@NODESxDEVICES` (`rescaled`); with
    `workers`, as measured at that worker count where it has figures for it
    (`ClusterProfile.for_workers`)."""
    if name_or_path == AUTO_CLUSTER:
        raise DiscoInputError(
            AUTO_CLUSTER,
            "the profile is read from the devices only where a step runs (disco_xla.jit, "
            "disco_xla.tf_function, DISCO_XLA_FLAGS); here name one: "
            f"{', '.join(available_profiles())}, or a path to a YAML file",
        )
    scaled = _AT_SCALE.fullmatch(name_or_path)
    if scaled is not None:
        base = load_profile(scaled["base"])
        profile = rescaled(base, int(scaled["nodes"]), int(scaled["devices_per_node"]))
        return profile.for_workers(workers) if workers else profile
    path = Path(name_or_path)
    if not (name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path):
        for directory in profile_directories():
            candidate = directory / f"{name_or_path}.yaml"
            if candidate.is_file():
                path = candidate
                break
        else:
            raise DiscoInputError(
                name_or_path,
                f"unknown cluster profile; choose from {', '.join(available_profiles())} "
                "or give a path to a YAML file",
            )
    profile = profile_from_dict(_yaml_file(path), str(path))
    return profile.for_workers(workers) if workers else profile


def rescaled(profile: ClusterProfile, nodes: int, devices_per_node: int) -> ClusterProfile:
    """`profile`'s machine with `nodes` nodes of `devices_per_node` devices: the
    same device, links and all-reduce algorithm. A node keeps its network
    adapters, at most one per device it holds (`nccl.nics_per_node`). Only a
    profile of vendor figures scales; one with figures measured at its own
    worker counts (`calibration`, `other_worker_counts`) is refused, unless
    asked for at its own topology."""
    where = at_scale(profile.name, nodes, devices_per_node)
    if nodes < 1 or devices_per_node < 1:
        raise DiscoInputError(where, "a profile needs at least one node of one device")
    if (nodes, devices_per_node) == (profile.nodes, profile.devices_per_node):
        return profile
    if profile.all_reduce_points or profile.collective_points or profile.by_worker_count:
        raise DiscoInputError(
            where,
            f"{profile.name} holds figures measured at {profile.workers} workers; measure the "
            "others with `disco-xla calibrate --add-to` instead of rescaling it",
        )
    nccl = profile.nccl
    if nccl is not None:
        nccl = replace(nccl, nics_per_node=min(nccl.nics_per_node, devices_per_node))
    return replace(profile, name=where, nodes=nodes, devices_per_node=devices_per_node, nccl=nccl)


def profile_data(path: str | os.PathLike) -> dict:
    """The YAML profile file at `path` as a plain mapping, checked as
    `profile_from_dict` checks it."""
    data = _yaml_file(Path(path))
    profile_from_dict(data, str(path))
    return data


def _yaml_file(path: Path):
    """The parsed YAML at `path`, unchecked; a missing or unparsable file is a
    one-line DiscoInputError."""
    if not path.is_file():
        raise DiscoInputError(str(path), "no such profile file")
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        problem = " ".join(str(error).split())[:200]
        raise DiscoInputError(str(path), f"not a valid YAML profile ({problem})") from None


def profile_from_dict(data, source: str) -> ClusterProfile:
    """Validate a parsed profile; the first bad or missing key is reported."""
    if not isinstance(data, dict):
        raise DiscoInputError(source, "a profile must be a YAML mapping")
    for key, kind in _REQUIRED.items():
        if key not in data:
            raise DiscoInputError(source, f"missing key {key!r}")
        _expect(data[key], kind, key, source)
    for key in data:
        if key not in _REQUIRED and key not in _OPTIONAL:
            raise DiscoInputError(source, f"unknown key {key!r}")
        if key in _OPTIONAL:
            _expect(data[key], _OPTIONAL[key], key, source)
    if data["execution"] not in ("gpu-streams", "cpu-threads"):
        raise DiscoInputError(source, "bad key 'execution': use gpu-streams or cpu-threads")
    if data["all_reduce"] not in ("ring", "hierarchical"):
        raise DiscoInputError(source, "bad key 'all_reduce': use ring or hierarchical")
    device, topology, links = data["device"], data["topology"], data["links"]
    peak = _number_map(device, "peak_flops", "device.peak_flops", source)
    return ClusterProfile(
        name=data["name"],
        execution=data["execution"],
        device_name=str(device.get("name", "")),
        peak_flops=peak,
        memory_bandwidth_bytes_per_s=_positive(
            device, "memory_bandwidth_bytes_per_s", "device", source
        ),
        kernel_launch_s=_positive(device, "kernel_launch_s", "device", source, allow_zero=True),
        devices_per_node=int(_positive(topology, "devices_per_node", "topology", source)),
        nodes=int(_positive(topology, "nodes", "topology", source)),
        intra_node=_link(links, "intra_node", source),
        inter_node=_link(links, "inter_node", source),
        all_reduce=data["all_reduce"],
        overlap=data.get("overlap", True),
        collectives_after_compute=data.get("collectives_after_compute", False),
        communication_streams=data.get("communication_streams", 1),
        compute_threads=data.get("compute_threads", 1),
        tuple_all_reduce_element_s=_optional_number(
            data, "tuple_all_reduce_element_s", 0.0, source
        ),
        collective_message_s=_optional_number(data, "collective_message_s", 0.0, source),
        step_overhead_s=_optional_number(data, "step_overhead_s", 0.0, source),
        step_buffer_s=_optional_number(data, "step_buffer_s", 0.0, source),
        kernel_time_scale=_optional_number(
            data, "kernel_time_scale", 1.0, source, allow_zero=False
        ),
        worker_lag=_optional_number(data, "worker_lag", 0.0, source),
        fusion_boundary_s=_optional_number(data, "fusion_boundary_s", 0.0, source),
        all_reduce_points=_calibration_points(data.get("calibration", {}), source),
        collective_points=_collective_points(data.get("calibration", {}), source),
        efficiency=_number_map(data, "efficiency", "efficiency", source)
        if "efficiency" in data
        else {},
        by_worker_count=_worker_count_sections(data, source),
        source=source,
        measured=measured_device(data["measured"], source) if "measured" in data else None,
        nccl=nccl_network(data["nccl"], source) if "nccl" in data else None,
    )


def _worker_count_sections(data: dict, source: str) -> dict[int, ClusterProfile]:
    """`other_worker_counts`, each section made a whole profile: `data` with the
    section's keys in place. A section must hold a one-node topology of its
    count, and only keys calibration measures (`SECTION_KEYS`)."""
    sections = data.get("other_worker_counts", {})
    if sections and data["topology"].get("nodes") != 1:
        raise DiscoInputError(source, "'other_worker_counts' needs a one-node profile")
    profiles = {}
    for count, section in sections.items():
        where = f"other_worker_counts.{count}"
        if isinstance(count, bool) or not isinstance(count, int) or count < 2:
            raise DiscoInputError(source, f"bad key {where!r}: expected a worker count >= 2")
        if count == data["topology"].get("devices_per_node"):
            raise DiscoInputError(source, f"bad key {where!r}: the profile's own count")
        if not isinstance(section, dict):
            raise DiscoInputError(source, f"bad key {where!r}: expected a mapping")
        for key in section:
            if key not in SECTION_KEYS:
                raise DiscoInputError(source, f"bad key '{where}.{key}': not measured by count")
        merged = {k: v for k, v in data.items() if k != "other_worker_counts"} | section
        topology = merged["topology"]
        if (
            not isinstance(topology, dict)
            or topology.get("nodes") != 1
            or (topology.get("devices_per_node") != count)
        ):
            raise DiscoInputError(
                source, f"bad key '{where}.topology': expected {count} devices on one node"
            )
        profiles[count] = profile_from_dict(merged, f"{source} ({where})")
    return profiles


def _calibration_points(calibration: dict, source: str) -> tuple[tuple[float, float], ...]:
    points = calibration.get("points", [])
    if not isinstance(points, list) or not all(isinstance(p, dict) for p in points):
        raise DiscoInputError(source, "bad key 'calibration.points': expected a list of mappings")
    return tuple(
        sorted(
            (
                _positive(p, "bytes", "calibration.points", source),
                _positive(p, "measured_s", "calibration.points", source),
            )
            for p in points
        )
    )


def _collective_points(
    calibration: dict, source: str
) -> dict[str, tuple[tuple[float, float], ...]]:
    """`calibration.collective_points`: {kind: [[bytes, seconds], ...]}."""
    where = "calibration.collective_points"
    by_kind = calibration.get("collective_points", {})
    if not isinstance(by_kind, dict):
        raise DiscoInputError(source, f"bad key {where!r}: expected a mapping by collective")
    points = {}
    for kind, pairs in by_kind.items():
        if kind not in MEASURED_COLLECTIVE_KINDS:
            raise DiscoInputError(
                source, f"bad key '{where}.{kind}': use {', '.join(MEASURED_COLLECTIVE_KINDS)}"
            )
        if not isinstance(pairs, list) or not pairs:
            raise DiscoInputError(source, f"bad key '{where}.{kind}': expected a list of points")
        measured = []
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise DiscoInputError(
                    source, f"bad key '{where}.{kind}': each point is [bytes, seconds]"
                )
            point = dict(zip(("bytes", "seconds"), pair, strict=True))
            measured.append(
                tuple(_positive(point, key, f"{where}.{kind}", source) for key in point)
            )
        points[kind] = tuple(sorted(measured))
    return points


def _optional_number(
    data: dict, key: str, default: float, source: str, allow_zero: bool = True
) -> float:
    """An optional top-level number (`default` when absent), >= 0, or > 0 when
    zero is not allowed."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DiscoInputError(source, f"bad key {key!r}: expected a number")
    if value < 0 or (value == 0 and not allow_zero):
        raise DiscoInputError(
            source, f"bad key {key!r}: expected a number {'>=' if allow_zero else '>'} 0"
        )
    return float(value)


def _expect(value, kind, key: str, source: str) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise DiscoInputError(source, f"bad key {key!r}: expected a {kind.__name__}")


def _link(links: dict, key: str, source: str) -> Link:
    link = links.get(key)
    if not isinstance(link, dict):
        raise DiscoInputError(source, f"bad or missing key 'links.{key}'")
    per = link.get("per", "device")
    if per not in ("device", "node"):
        raise DiscoInputError(source, f"bad key 'links.{key}.per': use device or node")
    return Link(
        bandwidth_bytes_per_s=_positive(link, "bandwidth_bytes_per_s", f"links.{key}", source),
        latency_s=_positive(link, "latency_s", f"links.{key}", source, allow_zero=True),
        shared_by_node=per == "node",
    )
