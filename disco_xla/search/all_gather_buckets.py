"""All-gather buckets: XLA:GPU's all-gather combiner as a rule, and the sweep
that picks a plan's all-gather buckets by simulated time.

XLA:GPU combines all-gathers as it combines all-reduces: in program order,
those of one kind (dtype, device groups, computation) go into one all-gather up
to a threshold of bytes (`xla_gpu_all_gather_combine_threshold_bytes`, 30 MiB
by default), never one that reads another of the same combined group. XLA:CPU
has no all-gather combiner: its baselines keep every all-gather.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.collectives import collective_bytes
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import (
    Plan,
    all_gather_dependencies,
    all_gather_kinds,
    all_gathers,
    verify_plan,
)
from disco_xla.search.combiners import threshold_sweep
from disco_xla.search.expert_flags import maxtext_thresholds
from disco_xla.search.prefetch import pipelined_all_gathers
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile

MB = 1 << 20
XLA_GPU_ALL_GATHER_COMBINE_BYTES = 30 * MB  # xla_gpu_all_gather_combine_threshold_bytes


def combined_all_gathers(module: HloModule, limit_bytes: int) -> tuple[tuple[str, ...], ...]:
    """The all-gather buckets XLA's combiner makes at `limit_bytes`: each kind's
    all-gathers in program order, a bucket closed when the next would pass the
    limit or reads a member of it (through any path: the dependencies are
    transitive). Buckets are in the order of their last member. () where no
    bucket holds two (the module's own all-gathers)."""
    gathers = all_gathers(module)
    kinds = all_gather_kinds(module)
    depends = all_gather_dependencies(module)
    position = {instr.name: index for index, instr in enumerate(gathers)}
    open_buckets: dict[tuple, list[str]] = {}  # by kind
    filled: dict[tuple, int] = {}  # bytes of each open bucket
    closed: list[list[str]] = []
    for instr in gathers:
        name, kind, size = instr.name, kinds[instr.name], collective_bytes(instr)
        members = open_buckets.get(kind)
        if members is not None and (
            not depends.get(name, frozenset()).isdisjoint(members)
            or filled[kind] + size > limit_bytes
        ):
            closed.append(members)
            members = None
        if members is None:
            members = open_buckets[kind] = []
            filled[kind] = 0
        members.append(name)
        filled[kind] += size
    closed.extend(open_buckets.values())
    if all(len(members) == 1 for members in closed):
        return ()
    closed.sort(key=lambda members: position[members[-1]])
    return tuple(tuple(members) for members in closed)


def fastest_combined(
    module: HloModule,
    plan: Plan,
    limits: Iterable[int],
    profile: ClusterProfile,
    cost_model: CostModel,
) -> tuple[Plan, float, int] | None:
    """`plan` with the combiner's all-gather buckets at whichever of `limits`
    simulates fastest (the first of equals): (plan, seconds, limit); None where
    none of them gives a legal plan."""
    best = None
    for limit in limits:
        trial = replace(plan, all_gather_buckets=combined_all_gathers(module, limit))
        try:
            verify_plan(trial, module)
        except DiscoInputError:
            continue
        try:
            seconds = simulate(build_task_graph(module, trial), profile, cost_model).iteration_s
        except RuntimeError:  # no kernel order runs these buckets
            continue
        if best is None or seconds < best[1]:
            best = (trial, seconds, limit)
    return best


def all_gather_sweep(module: HloModule) -> list[int]:
    """The all-gather thresholds NVIDIA's guide would sweep for this module:
    powers of two from 16 MiB up to the first at least all its all-gathers'
    bytes, XLA's default, and, for steps too small to reach 16 MiB, each power
    of two from 1 KiB up to their total."""
    total = sum(collective_bytes(instr) for instr in all_gathers(module))
    sweep = {XLA_GPU_ALL_GATHER_COMBINE_BYTES}
    threshold = 1 << 10
    while True:
        if threshold >= 16 * MB or threshold < total:
            sweep.add(threshold)
        if threshold >= max(total, 16 * MB):
            return sorted(sweep)
        threshold *= 2


def best_all_gather_buckets(
    module: HloModule,
    current: tuple[tuple[str, ...], ...],
    price: Callable[[tuple[tuple[str, ...], ...]], float],
    more: Iterable[tuple[tuple[str, ...], ...]] = (),
) -> tuple[tuple[tuple[str, ...], ...], float]:
    """The fastest all-gather buckets by `price` (the simulated step time of the
    plan with them; inf where they cannot run) among `current`, `more`, none,
    and the combiner's at every threshold of `all_gather_sweep`; ties keep the
    earlier, so the result is `current` unless another is faster. Returns
    (buckets, seconds)."""
    best, best_s = current, price(current)
    if not all_gathers(module):
        return best, best_s
    tried = {current}
    candidates = [(), *more]
    candidates += [combined_all_gathers(module, limit) for limit in all_gather_sweep(module)]
    for buckets in candidates:
        if buckets in tried:
            continue
        tried.add(buckets)
        seconds = price(buckets)
        if seconds < best_s:
            best, best_s = buckets, seconds
    return best, best_s


def xla_gpu_all_gathers(
    name: str, module: HloModule, plan: Plan, profile: ClusterProfile, cost_model: CostModel
) -> tuple[Plan, str]:
    """`plan` with the all-gather buckets XLA:GPU's combiner makes for baseline
    `name` (`all_gather_buckets.combined_all_gathers`), and a note to add:
    `xla` and `xla-overlap` at XLA's default threshold, `maxtext` at MaxText's,
    `xla-tuned` at the swept threshold the simulator finds fastest. `maxtext`
    also pipelines loop-body all-gathers a trip ahead (`prefetch`), and
    `xla-tuned` does where that simulates faster. Unchanged on
    CPU profiles (XLA:CPU has no all-gather combiner), for the other baselines,
    and where the module has no all-gather to combine."""
    gpu = profile.execution == "gpu-streams"
    if not gpu or name not in ("xla", "xla-overlap", "xla-tuned", "maxtext"):
        return plan, ""
    gathers = all_gathers(module)
    if len(gathers) < 2:
        return plan, ""
    if name == "maxtext":
        limits = [maxtext_thresholds(profile)["all-gather"]]
    elif name == "xla-tuned":
        limits = threshold_sweep(sum(collective_bytes(instr) for instr in gathers))
    else:
        limits = [XLA_GPU_ALL_GATHER_COMBINE_BYTES]
    found = fastest_combined(module, plan, limits, profile, cost_model)
    if found is None:
        return plan, ", all-gathers one by one (the combiner's buckets are not legal here)"
    best, best_s, best_limit = found
    note = f", all-gathers combined up to {best_limit // MB} MB"
    pipelined = replace(best, prefetched_all_gathers=pipelined_all_gathers(module, best))
    # MaxText sets XLA's collective pipelining on; the tuned baseline keeps it
    # where it simulates faster.
    if pipelined != best and (
        name == "maxtext"
        or name == "xla-tuned"
        and simulate(build_task_graph(module, pipelined), profile, cost_model).iteration_s < best_s
    ):
        best, note = pipelined, note + ", pipelined a loop trip ahead"
    return best, note
