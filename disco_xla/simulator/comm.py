"""Communication model: the time of one all-reduce of S bytes over the cluster.

- ring over p workers on one link (alpha latency per step, B bandwidth):
  T(S) = 2(p-1)·alpha + 2(p-1)/p · S/B
- hierarchical over n nodes of g devices: reduce-scatter inside each node, a ring
  across nodes on each device's 1/g shard, then all-gather inside the node:
  T(S) = 2·[(g-1)·alpha_in + (g-1)/g · S/B_in] + 2(n-1)·alpha_out + 2(n-1)/n · S/(g·B_out)
  with B_out the bandwidth each device has between nodes. When one adapter serves
  the whole node (`per: node` in the profile), the g rings share it: B_out is the
  adapter's bandwidth / g, and the last term is 2(n-1)/n · S/B_adapter.

A flat ring over several nodes runs at the slowest link's speed.

The other collectives are costed from the all-reduce model of the same buffer
(S bytes, the whole unsharded tensor; `collectives.collective_bytes`), by the ring
formulas' ratios, so that a calibrated all-reduce calibrates them too:
- all-gather and reduce-scatter are each one half of a ring all-reduce,
  (p-1)·alpha + (p-1)/p · S/B: half the all-reduce time;
- all-to-all sends (p-1)/p of the buffer from every device: half as well;
- collective-permute and collective-broadcast send the whole buffer once,
  alpha + S/B on a ring: the all-reduce time · p / (2(p-1)), which matches the
  bandwidth term exactly and puts p·alpha for the latency.
A collective spans the profile's workers, unless its device groups say it spans
fewer (`group_profile`): a module captured at the profile's worker count, on a
mesh, has collectives over one axis (an FSDP all-gather over the 8 devices of a
node, a gradient all-reduce over one device in each node), and each is priced
over the nodes and devices its group holds. Where a
one-node profile carries measured times for a collective
(`ClusterProfile.collective_points`, written by `disco-xla calibrate`), its time
is read off them as the all-reduce's is off its own points (below), and the
ratio is not used.

A GPU profile with an `nccl` section is priced as NCCL runs (`nccl`): XLA's
measured table inside a node, NCCL's tuning model with published achieved
bandwidths across nodes; the formulas below are then not used. Times measured
on the machine itself (`disco-xla calibrate`'s points, below) come first.

A one-node profile calibrated on this machine carries the measured times
themselves (`ClusterProfile.all_reduce_points`); there the time is read off them
instead of the formula, because neither runtime here follows the two-parameter
model across sizes (benchmarks/BENCHMARKS.md, "All-reduce calibration"), as
`measured_points.measured_s` reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from disco_xla.simulator.measured_points import measured_s
from disco_xla.simulator.nccl import gpu_collective_s
from disco_xla.simulator.profiles import ClusterProfile, Link

# A communication model: (bytes all-reduced, cluster profile) -> seconds.
CommCostFn = Callable[[float, ClusterProfile], float]


def ring_all_reduce_s(size_bytes: float, workers: int, link: Link) -> float:
    """Ring all-reduce: T = 2(p-1)·alpha + 2(p-1)/p · S/B."""
    if workers <= 1 or size_bytes <= 0:
        return 0.0
    steps = 2 * (workers - 1)
    return steps * link.latency_s + steps / workers * size_bytes / link.bandwidth_bytes_per_s


def all_reduce_s(size_bytes: float, profile: ClusterProfile) -> float:
    """All-reduce time of `size_bytes` with the profile's algorithm and topology."""
    if size_bytes <= 0 or profile.workers <= 1:
        return 0.0
    if profile.all_reduce_points and profile.nodes == 1:
        return measured_s(size_bytes, profile.all_reduce_points)
    if profile.nccl is not None:
        return gpu_collective_s("all-reduce", size_bytes, profile)
    per_node, nodes = profile.devices_per_node, profile.nodes
    if nodes == 1:
        return ring_all_reduce_s(size_bytes, per_node, profile.intra_node)
    if profile.all_reduce == "ring":
        slowest = min(
            (profile.intra_node, profile.inter_node), key=lambda link: link.bandwidth_bytes_per_s
        )
        latency = max(profile.intra_node.latency_s, profile.inter_node.latency_s)
        return ring_all_reduce_s(
            size_bytes, profile.workers, Link(slowest.bandwidth_bytes_per_s, latency)
        )
    inside = 0.0
    if per_node > 1:
        one_way = (per_node - 1) * profile.intra_node.latency_s + (per_node - 1) / per_node * (
            size_bytes / profile.intra_node.bandwidth_bytes_per_s
        )
        inside = 2 * one_way  # reduce-scatter, then all-gather
    link = profile.inter_node
    if link.shared_by_node:  # the node's devices run their rings through one adapter
        link = Link(link.bandwidth_bytes_per_s / per_node, link.latency_s)
    across = ring_all_reduce_s(size_bytes / per_node, nodes, link)
    return inside + across


# The share of an all-reduce's time each collective takes on the same buffer, as
# a function of the worker count (see the module's docstring).
_SHARE_OF_ALL_REDUCE: dict[str, Callable[[int], float]] = {
    "all-reduce": lambda workers: 1.0,
    "all-gather": lambda workers: 0.5,
    "reduce-scatter": lambda workers: 0.5,
    "all-to-all": lambda workers: 0.5,
    "collective-permute": lambda workers: workers / (2 * (workers - 1)),
    "collective-broadcast": lambda workers: workers / (2 * (workers - 1)),
}
COLLECTIVE_KINDS = tuple(_SHARE_OF_ALL_REDUCE)


def group_profile(
    profile: ClusterProfile, group: tuple[int, ...], module_devices: int
) -> ClusterProfile:
    """The profile of the devices of one collective group: `group` holds the
    device ids of one of its groups (() when one group holds every device) in a
    module of `module_devices` devices. Device d sits on node
    d // devices_per_node, as XLA assigns devices in order, so the group spans
    the nodes its ids fall on, with as many devices on each as the most it has
    on one. The groups of a collective run at once (one per FSDP shard, say),
    so where one adapter serves a node, its devices share it as before. Only a
    module of the profile's own worker count is mapped this way;
    otherwise (a step captured on a few devices and priced at many) the
    collective spans every worker."""
    if not group or module_devices != profile.workers or len(group) >= profile.workers:
        return profile
    per_node = profile.devices_per_node
    on_node: dict[int, int] = {}
    for device in group:
        on_node[device // per_node] = on_node.get(device // per_node, 0) + 1
    inside = max(on_node.values())
    link = profile.inter_node
    if link.shared_by_node:
        # The node's other groups run their collectives at the same time through
        # the same adapter: each device still gets 1/devices_per_node of it.
        link = Link(link.bandwidth_bytes_per_s * inside / per_node, link.latency_s, True)
    nccl = profile.nccl
    if nccl is not None:  # the group's ranks on a node use their share of its adapters
        nccl = replace(nccl, nics_per_node=nccl.nics_per_node * inside / per_node)
    return replace(profile, nodes=len(on_node), devices_per_node=inside, inter_node=link, nccl=nccl)


def collective_s(
    kind: str,
    size_bytes: float,
    profile: ClusterProfile,
    all_reduce: CommCostFn = all_reduce_s,
    group: tuple[int, ...] = (),
    module_devices: int = 0,
) -> float:
    """The time of collective `kind` (`collectives.collective_kind`) on a buffer of
    `size_bytes` over the devices of `group` (`group_profile`; () for every
    worker): read off the profile's measured points for that kind when it
    has them and `all_reduce` is the profile's own model, else from the
    all-reduce model `all_reduce` by the ring ratios."""
    profile = group_profile(profile, group, module_devices)
    if size_bytes <= 0 or profile.workers <= 1:
        return 0.0
    points = profile.collective_points.get(kind) if profile.nodes == 1 else None
    if points and all_reduce is all_reduce_s:
        return measured_s(size_bytes, points)
    if profile.nccl is not None and all_reduce is all_reduce_s and not profile.all_reduce_points:
        return gpu_collective_s(kind, size_bytes, profile)
    return all_reduce(size_bytes, profile) * _SHARE_OF_ALL_REDUCE[kind](profile.workers)
