"""Collectives priced as NCCL runs them on a GPU cluster.

Inside one node, where the profile has XLA's measured tables (`measured`), a
collective over 2, 4 or 8 of the node's GPUs is read off XLA's measured H100
table (`gpu_tables.CollectiveTable`), scaled by the profile's
`collective_scale`.

Otherwise NCCL's own choice is modelled: the time of every algorithm and
protocol it could pick, and the least of them, as NCCL's tuner picks
(NVIDIA/nccl `src/enqueue.cc`, `topoGetAlgoInfo`). Each is
time = latency + bytes on the wire / bus bandwidth:

- latencies: NCCL 2.30.7's tuning model (`src/graph/tuning.cc`, commit
  5067397c): base latency per algorithm and protocol, plus per-hop latencies
  on NVLink and on the network. A ring all-reduce over n ranks on N nodes
  takes 2(n-1) steps, 2(N-1) of them across the network; a ring all-gather
  or reduce-scatter n-1, N-1 of them across; a tree all-reduce
  2·((n/N - 1) intra hops + floor(log2 N) network hops); NVLSTree (NVLink
  SHARP in the node, a tree across nodes) 25 us + 2·floor(log2 N)·20.9 us.
  On several nodes an intra-node hop costs at least the network overhead
  (1 us, x3 for Simple), and a ring Simple all-reduce's latency x1.4.
- bandwidths: achieved bus bandwidths published from nccl-tests, written in
  the profile's `nccl` section with their sources: the ring bus bandwidth
  inside a node, the achieved bandwidth of each network adapter (the ring
  across nodes runs at adapters x that, at most the node's own), and NVLink
  SHARP's algorithm bandwidth in the node. NCCL's protocol factors apply: LL
  at half the bandwidth and at most `LL_MAX_BUS_BYTES_PER_S`, LL128 at 0.92
  (a tree at 120/128 across nodes); a tree all-reduce sends twice the buffer
  at 0.92 of the bus bandwidth, scaled by NCCL's tree correction by size.
  NVLSTree's rate is the least of NVLS's in the node and the adapters'
  across (halved beyond two nodes: a tree's inner nodes send to two).

Published bus bandwidths across nodes climb to their plateau only over
hundreds of megabytes; NCCL's model (a selection model, not a predictor)
leaves that ramp out, so mid-size collectives across nodes are priced fast
(benchmarks/collective_model_check.py prints by how much).

Bytes on the wire per rank, over the bus bandwidth as nccl-tests defines it:
all-reduce 2(n-1)/n·S (a tree: 2·S), all-gather and reduce-scatter (n-1)/n·S
of the whole buffer S, all-to-all (n-1)/n·S, a permute S.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from disco_xla.simulator.gpu_profile import NcclNetwork
from disco_xla.simulator.gpu_tables import CollectiveTable

PROTOCOLS = ("LL", "LL128", "Simple")
# NCCL 2.30.7, src/graph/tuning.cc: base latency (us) by algorithm and protocol.
BASE_LATENCY_US = {"Ring": (6.6, 14.0, 8.4), "Tree": (6.8, 14.0, 8.4), "NVLSTree": (0, 0, 0)}
# Per-hop latency (us) on NVLink and on the network, by algorithm and protocol.
NVLINK_HOP_US = {"Ring": (0.6, 1.9, 3.4), "Tree": (0.6, 1.25, 4.0), "NVLSTree": (0, 0, 25.0)}
NETWORK_HOP_US = {"Ring": (2.7, 4.0, 14.0), "Tree": (5.0, 8.5, 14.0), "NVLSTree": (0, 0, 20.9)}
# The network overhead an intra-node hop costs at least on several nodes
# (`NCCL_NET_OVERHEAD` auto: 1 us on Intel CPUs), three times for Simple.
NETWORK_OVERHEAD_US = 1.0
# LL's bus bandwidth cap (GB/s, `llMaxBws`): one Hopper node, then by node
# count on an Intel host (2 nodes, 3 or more).
LL_MAX_BUS_BYTES_PER_S = (141.0e9, 39.0e9, 20.4e9)
# NCCL's tree correction (`treeCorrectionFactor`) by floor(log2(bytes / 64)).
TREE_CORRECTION = {
    "LL": (1, 1, 1, 1, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6)
    + (0.7, 0.8, 0.9, 1, 1, 1, 1),
    "LL128": (1, 1, 1, 1, 1, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6)
    + (0.8, 0.9, 0.9, 0.9, 0.9, 1, 1),
    "Simple": (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5)
    + (0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9),
}


@dataclass(frozen=True)
class Choice:
    """One algorithm and protocol's predicted time."""

    algorithm: str
    protocol: str
    seconds: float


def _wire_share(kind: str, ranks: int) -> float:
    """Bytes each rank sends per byte of the whole buffer, over bus bandwidth."""
    if kind == "all-reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return (ranks - 1) / ranks
    return 1.0  # collective-permute, collective-broadcast: the buffer once


def _ring(kind: str, size: float, ranks: int, nodes: int, net: NcclNetwork) -> list[Choice]:
    steps, network_steps = _ring_steps(kind, ranks, nodes)
    bus = net.intra_node_bus_bytes_per_s
    if nodes > 1:
        bus = min(bus, net.nics_per_node * net.nic_bytes_per_s)
    choices = []
    for p, protocol in enumerate(PROTOCOLS):
        intra_us = NVLINK_HOP_US["Ring"][p]
        if nodes > 1:
            intra_us = max(intra_us, NETWORK_OVERHEAD_US * (3 if protocol == "Simple" else 1))
        network_us = NETWORK_HOP_US["Ring"][p] + net.extra_network_hop_s * 1e6
        latency_us = (
            BASE_LATENCY_US["Ring"][p]
            + (steps - network_steps) * intra_us
            + network_steps * network_us
        )
        if protocol == "Simple" and kind == "all-reduce" and nodes > 1:
            latency_us *= 1.4
        rate = _protocol_rate(bus, protocol, nodes)
        seconds = latency_us * 1e-6 + size * _wire_share(kind, ranks) / rate
        choices.append(Choice("Ring", protocol, seconds))
    return choices


def _ring_steps(kind: str, ranks: int, nodes: int) -> tuple[int, int]:
    """A ring's steps, and how many of them cross the network."""
    if kind == "all-reduce":
        return 2 * (ranks - 1), 2 * (nodes - 1)
    if kind in ("all-gather", "reduce-scatter", "all-to-all"):
        return ranks - 1, nodes - 1
    return 1, int(nodes > 1)  # a permute or broadcast: the buffer once, pipelined


def _protocol_rate(bus: float, protocol: str, nodes: int, tree: bool = False) -> float:
    if protocol == "LL":
        cap = LL_MAX_BUS_BYTES_PER_S[min(nodes, 3) - 1]
        return min(bus / (3.8 if tree else 2.0), cap)
    if protocol == "LL128":
        return bus * (120 / 128 if tree and nodes > 1 else 0.92)
    return bus


def _tree(size: float, ranks: int, nodes: int, net: NcclNetwork) -> list[Choice]:
    """Tree all-reduce: NCCL models it for all-reduce only."""
    per_node = ranks // nodes
    bus = net.intra_node_bus_bytes_per_s
    if nodes > 1:
        bus = min(bus, net.nics_per_node * net.nic_bytes_per_s)
    bus *= 0.92
    index = min(max(int(math.log2(max(size, 64) / 64)), 0), 22)
    choices = []
    for p, protocol in enumerate(PROTOCOLS):
        network_us = NETWORK_HOP_US["Tree"][p] + net.extra_network_hop_s * 1e6
        latency_us = BASE_LATENCY_US["Tree"][p] + 2 * (
            (per_node - 1) * NVLINK_HOP_US["Tree"][p] + int(math.log2(nodes)) * network_us
        )
        rate = _protocol_rate(bus, protocol, nodes, tree=True) * TREE_CORRECTION[protocol][index]
        choices.append(Choice("Tree", protocol, latency_us * 1e-6 + 2 * size / rate))
    return choices


def _nvls_tree(size: float, nodes: int, net: NcclNetwork) -> Choice:
    """NVLink SHARP in the node, a tree across nodes (all-reduce, N > 1)."""
    hops = int(math.log2(nodes))
    network_us = NETWORK_HOP_US["NVLSTree"][2] + net.extra_network_hop_s * 1e6
    latency_us = NVLINK_HOP_US["NVLSTree"][2] + 2 * hops * network_us
    across = net.nics_per_node * net.nic_bytes_per_s / (1 if nodes <= 2 else 2)
    rate = min(net.nvls_algorithm_bytes_per_s, across)
    return Choice("NVLSTree", "Simple", latency_us * 1e-6 + size / rate)


def choices(kind: str, size: float, ranks: int, nodes: int, net: NcclNetwork) -> list[Choice]:
    """Every algorithm and protocol NCCL could run `kind` with, and its time."""
    found = _ring(kind, size, ranks, nodes, net)
    if kind == "all-reduce" and ranks > 2:
        found += _tree(size, ranks, nodes, net)
        if nodes > 1 and net.nvls_algorithm_bytes_per_s > 0:
            found.append(_nvls_tree(size, nodes, net))
    return found


def nccl_s(kind: str, size: float, ranks: int, nodes: int, net: NcclNetwork) -> float:
    """NCCL's predicted time of `kind` on a whole buffer of `size` bytes over
    `ranks` GPUs on `nodes` nodes: its fastest choice."""
    if ranks <= 1 or size <= 0:
        return 0.0
    return min(choice.seconds for choice in choices(kind, size, ranks, nodes, net))


@lru_cache(maxsize=4)
def _table(arch: str) -> CollectiveTable:
    return CollectiveTable(arch)


def gpu_collective_s(kind: str, size: float, profile) -> float:
    """The time of `kind` on a buffer of `size` bytes over the profile's
    workers (a `group_profile` for a collective over some of them): XLA's
    measured table inside one node where it has the group's size, else
    NCCL's model (module docstring)."""
    ranks, nodes = profile.workers, profile.nodes
    if ranks <= 1 or size <= 0:
        return 0.0
    measured = profile.measured
    if nodes == 1 and measured is not None:
        table = _table(measured.tables)
        if table.covers(kind, ranks):
            return table.seconds(kind, size, ranks) / measured.collective_scale
    return nccl_s(kind, size, ranks, nodes, profile.nccl)
