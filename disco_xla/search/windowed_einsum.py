"""XLA:GPU's windowed einsum ("collective matmul") as an expert tunes it.

With `--xla_gpu_threshold_for_windowed_einsum_mib=T`, XLA's SPMD partitioner
turns an all-gather that feeds a dot, or a dot whose partial sums are reduced,
into a loop over the group's shards: each step moves one shard by
collective-permute while the dot computes on the one before. Off by default.
What the loop computes is what the plan's chunk dimension computes
(`hlo.chunking`: the collective in chunks, the dots next to it chunk by chunk),
so it is priced as that dimension: every chunkable collective of at least T
bytes split into as many chunks as its group has devices (XLA's loop takes a
step a shard), or the largest count of `CHUNK_COUNTS` that divides the split
dimension and is not above it. Assumed, not measured: that a
collective-permute ring of p shards costs what the same bytes cost as p
chunked collectives, and that T compares with the collective's whole result.

An expert sets the threshold by measuring (JAX-Toolbox's GPU performance guide
tunes it per model): `tuned_windowed_einsum` tries each size among the
chunkable collectives', in whole MiB, and keeps the fastest, or none where none
is faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.chunking import CHUNK_COUNTS, ChunkSplit
from disco_xla.hlo.collectives import collective_bytes
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.xla_gpu_patterns import group_size
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.chunking import chunk_candidates
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.profiles import ClusterProfile

if TYPE_CHECKING:  # baselines imports this module
    from disco_xla.search.baselines import Baseline

WINDOWED_EINSUM_FLAG = "--xla_gpu_threshold_for_windowed_einsum_mib"
MIB = 2**20


def windows(split: ChunkSplit, devices: int) -> int:
    """The chunks XLA's loop would take for `split` over `devices` shards: the
    largest allowed count not above `devices` (0 where none is)."""
    counts = [c for c in CHUNK_COUNTS if c <= devices and split.allows(c)]
    return max(counts, default=0)


def windowed_plan(module: HloModule, plan: Plan, threshold_bytes: int) -> Plan:
    """`plan` with every collective it may still split (`chunk_candidates`)
    of at least `threshold_bytes` split as windowed einsum would split it; a
    collective sharing a dot with one split before it stays whole."""
    workers = module.worker_count()
    taken: set[str] = set()
    pairs = []
    for split in chunk_candidates(module, plan):
        if collective_bytes(split.collective) < threshold_bytes:
            continue
        dots = {dot.name for dot in split.dots}
        chunks = windows(split, group_size(split.collective, workers))
        if chunks and not dots & taken:
            pairs.append((split.collective.name, chunks))
            taken |= dots
    return replace(plan, chunked_collectives=(*plan.chunked_collectives, *pairs))


def tuned_windowed_einsum(
    module: HloModule, plan: Plan, price: Callable[[Plan], float]
) -> tuple[Plan, int | None, float]:
    """`plan` under the windowed-einsum threshold that `price` (seconds; inf
    where the plan cannot run) finds fastest, or `plan` itself where none is
    faster. The thresholds tried are the chunkable collectives' sizes in whole
    MiB, as the flag takes them. Returns the plan, the threshold in MiB (None:
    off) and its seconds."""
    best, best_threshold, best_s = plan, None, price(plan)
    sizes = {collective_bytes(s.collective) // MIB for s in chunk_candidates(module, plan)}
    for threshold_mib in sorted(sizes, reverse=True):  # the fewest windows first
        trial = windowed_plan(module, plan, threshold_mib * MIB)
        if trial == plan:
            continue
        try:
            verify_plan(trial, module)
        except DiscoInputError:  # a mix the verifier refuses is not a candidate
            continue
        seconds = price(trial)
        if seconds < best_s:  # ties keep fewer windows
            best, best_threshold, best_s = trial, threshold_mib, seconds
    return best, best_threshold, best_s


def threshold_flag(threshold_mib: int) -> str:
    """The flag that turns windowed einsum on from `threshold_mib`."""
    return f"{WINDOWED_EINSUM_FLAG}={threshold_mib}"


def with_windowed_einsum(
    chosen: Baseline, profile: ClusterProfile, cost_model: CostModel
) -> Baseline:
    """`chosen` (the `xla-tuned` baseline) with the windowed-einsum threshold
    that simulates fastest as XLA runs its program, said in its note; as it is
    on CPU profiles, or where no threshold is faster."""
    if chosen.xla_run is None:
        return chosen

    def price(plan: Plan) -> float:
        try:
            graph = replace(chosen, plan=plan).task_graph()
            return simulate(graph, profile, cost_model).iteration_s
        except RuntimeError:  # no kernel order runs it
            return math.inf

    plan, threshold_mib, _ = tuned_windowed_einsum(chosen.module, chosen.plan, price)
    if threshold_mib is None:
        return chosen
    note = f"{chosen.note}, windowed einsum from {threshold_mib} MiB"
    return replace(chosen, plan=plan, note=note)
