"""Communication model: the time of one all-reduce of S bytes over the cluster.

- ring over p workers on one link (alpha latency per step, B bandwidth):
  T(S) = 2(p-1)·alpha + 2(p-1)/p · S/B
- hierarchical over n nodes of g devices: reduce-scatter inside each node, a ring
  across nodes on each device's 1/g shard, then all-gather inside the node:
  T(S) = 2·[(g-1)·alpha_in + (g-1)/g · S/B_in] + 2(n-1)·alpha_out + 2(n-1)/n · S/(g·B_out)

A flat ring over several nodes runs at the slowest link's speed.
"""

from __future__ import annotations

from collections.abc import Callable

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
    across = ring_all_reduce_s(size_bytes / per_node, nodes, profile.inter_node)
    return inside + across
