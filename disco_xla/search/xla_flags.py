"""The `XLA_FLAGS` closest to a plan, for a user who runs XLA's own program on a
cluster disco-xla cannot reach (`disco-xla optimize --xla-flags`).

XLA:GPU's flags cannot say which ops fuse, nor which gradients share a bucket.
What they set is a combine threshold for each kind of collective, whether the
latency-hiding scheduler runs, and which kinds its collective pipeliner moves
a loop trip: the flag set of the `xla-tuned` and `maxtext` baselines
(`expert_flags`). So the program they give is XLA's fusion, with each kind's
gradients combined in ready order up to its threshold
(`combiners.kind_threshold_buckets`), beside compute, simulated as XLA:GPU
compiles it (`simulator.xla_gpu_run`: the partitioner's all-reduce +
dynamic-slice pairs are reduce-scatters by the time it combines). Each kind's
threshold is chosen from the sizes of the plan's own buckets of that kind and
NVIDIA's sweep, refined a quarter of an octave apart
(`combiners.tuned_buckets`), by the simulated time of the program it gives.
Where the module has all-gathers, the all-gather threshold is then chosen
likewise, from the sizes of the plan's all-gather buckets and the sweep
(`all_gather_buckets.combined_all_gathers` at each threshold). Where the plan
issues all-gathers a loop trip ahead, the flags turn on XLA's pipelining of
all-gathers if that simulates faster; they turn on its pipelining of
reduce-scatters and all-reduces, and while-loop double buffering with any
pipelining, where that simulates faster (as `baselines.tuned_pipelining`).
Last, windowed einsum from the threshold that simulates fastest, where any
does (`windowed_einsum`, as `xla-tuned` chooses it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from disco_xla.hlo.collectives import collective_bytes
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.xla_gpu_patterns import sinkable_collectives
from disco_xla.plan import Plan, all_gathers
from disco_xla.search.all_gather_buckets import fastest_combined
from disco_xla.search.baselines import (
    bucketing_price,
    gradient_kinds,
    gradients_in_ready_order,
    legal_buckets,
)
from disco_xla.search.combiners import threshold_sweep, tuned_buckets
from disco_xla.search.expert_flags import combiner_kinds
from disco_xla.search.prefetch import pipelined_all_gathers
from disco_xla.search.windowed_einsum import (
    MIB,
    threshold_flag,
    tuned_windowed_einsum,
    windowed_plan,
)
from disco_xla.simulator.cost_models import CostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import TaskGraph, build_task_graph
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.xla_gpu_run import PIPELINED_KINDS, XlaGpuRun, as_xla_gpu_runs

THRESHOLD_FLAGS = {
    "all-gather": "--xla_gpu_all_gather_combine_threshold_bytes",
    "all-reduce": "--xla_gpu_all_reduce_combine_threshold_bytes",
    "reduce-scatter": "--xla_gpu_reduce_scatter_combine_threshold_bytes",
}
SCHEDULER_FLAG = "--xla_gpu_enable_latency_hiding_scheduler=true"
PIPELINED_ALL_GATHER_FLAG = "--xla_gpu_enable_pipelined_all_gather=true"
PIPELINED_FLAGS = {
    "all-reduce": "--xla_gpu_enable_pipelined_all_reduce=true",
    "reduce-scatter": "--xla_gpu_enable_pipelined_reduce_scatter=true",
}
DOUBLE_BUFFERING_FLAG = "--xla_gpu_enable_while_loop_double_buffering=true"


@dataclass(frozen=True)
class XlaFlags:
    """The flags, and the program they give as the simulator runs it."""

    thresholds: dict[str, int]  # by collective kind
    buckets: tuple[tuple[str, ...], ...]
    simulated_s: float
    all_gather_buckets: tuple[tuple[str, ...], ...] = ()
    # What XLA's collective pipeliner issues a loop trip ahead, when the flags
    # turn it on (`prefetch.pipelined_all_gathers`); () when they leave it off.
    pipelined_all_gathers: tuple[str, ...] = ()
    # The kinds it sinks a loop trip on (`simulator.xla_gpu_run`).
    pipelined_kinds: frozenset[str] = frozenset()
    # Windowed einsum from this many MiB (`windowed_einsum`); None: off.
    windowed_einsum_mib: int | None = None

    def plan(self, module: HloModule, xla_fusion: Plan) -> Plan:
        """The program these flags give, as a plan over XLA's fusion of `module`."""
        plan = replace(
            xla_fusion,
            all_reduce_buckets=legal_buckets(module, self.buckets),
            all_gather_buckets=self.all_gather_buckets,
            prefetched_all_gathers=self.pipelined_all_gathers,
        )
        if self.windowed_einsum_mib is None:
            return plan
        return windowed_plan(module, plan, self.windowed_einsum_mib * MIB)

    def task_graph(self, module: HloModule, xla_fusion: Plan) -> TaskGraph:
        """The program these flags give, as XLA:GPU runs it."""
        run = XlaGpuRun(buckets_by_xla=True, pipelined=self.pipelined_kinds)
        graph = build_task_graph(module, self.plan(module, xla_fusion))
        return as_xla_gpu_runs(graph, module, run)

    @property
    def flags(self) -> str:
        thresholds = [f"{THRESHOLD_FLAGS[k]}={v}" for k, v in sorted(self.thresholds.items())]
        pipelining = [PIPELINED_ALL_GATHER_FLAG] if self.pipelined_all_gathers else []
        pipelining += [PIPELINED_FLAGS[k] for k in sorted(self.pipelined_kinds)]
        if pipelining:
            pipelining.append(DOUBLE_BUFFERING_FLAG)
        if self.windowed_einsum_mib is not None:
            pipelining.append(threshold_flag(self.windowed_einsum_mib))
        return " ".join([*thresholds, SCHEDULER_FLAG, *pipelining])


def closest_xla_flags(
    module: HloModule,
    plan: Plan,
    xla_fusion: Plan,
    profile: ClusterProfile,
    cost_model: CostModel,
) -> XlaFlags:
    """The flags whose program (XLA's fusion `xla_fusion`, a plan with one
    all-reduce per gradient; its combiners at their thresholds) simulates
    fastest, the thresholds taken from `plan`'s bucket sizes and NVIDIA's
    sweep."""
    ready = simulate(build_task_graph(module, xla_fusion), profile, cost_model).collective_ready_s
    gradients = gradients_in_ready_order(module, ready)
    kinds = combiner_kinds(module, gradient_kinds(module))
    sizes = dict(gradients)
    plan_sizes: dict[str, list[int]] = {}
    for bucket in plan.all_reduce_buckets:
        kind = kinds.get(bucket[0], "all-reduce")
        plan_sizes.setdefault(kind, []).append(sum(sizes[name] for name in bucket))
    price = bucketing_price(module, xla_fusion, profile, cost_model, XlaGpuRun(True))
    buckets, thresholds = tuned_buckets(gradients, kinds, price, plan_sizes)
    flags = XlaFlags(thresholds, buckets, price(buckets))
    flags = _with_all_gathers(flags, module, plan, xla_fusion, profile, cost_model)
    flags = _with_pipelining(flags, module, xla_fusion, profile, cost_model)
    return _with_windowed_einsum(flags, module, xla_fusion, profile, cost_model)


def _with_all_gathers(
    flags: XlaFlags,
    module: HloModule,
    plan: Plan,
    xla_fusion: Plan,
    profile: ClusterProfile,
    cost_model: CostModel,
) -> XlaFlags:
    """`flags` with the fastest all-gather threshold, and the all-gather
    pipelining where `plan` prefetches and that is faster."""
    gathers = all_gathers(module)
    if len(gathers) < 2:
        return flags
    thresholds, buckets = flags.thresholds, flags.buckets
    gathered = {instr.name: collective_bytes(instr) for instr in gathers}
    bucket_sizes = [sum(gathered[name] for name in bucket) for bucket in plan.all_gather_buckets]
    limits = sorted({*threshold_sweep(sum(gathered.values())), *bucket_sizes})
    found = fastest_combined(module, flags.plan(module, xla_fusion), limits, profile, cost_model)
    if found is not None:
        program, seconds, limit = found
        thresholds = {**thresholds, "all-gather": limit}
        flags = XlaFlags(thresholds, buckets, seconds, program.all_gather_buckets)
        graph = flags.task_graph(module, xla_fusion)  # as XLA:GPU runs it
        flags = replace(flags, simulated_s=simulate(graph, profile, cost_model).iteration_s)
    if not plan.prefetched_all_gathers:
        return flags
    pipelined = replace(
        flags, pipelined_all_gathers=pipelined_all_gathers(module, flags.plan(module, xla_fusion))
    )
    seconds = simulate(pipelined.task_graph(module, xla_fusion), profile, cost_model).iteration_s
    return replace(pipelined, simulated_s=seconds) if seconds < flags.simulated_s else flags


def _with_pipelining(
    flags: XlaFlags,
    module: HloModule,
    xla_fusion: Plan,
    profile: ClusterProfile,
    cost_model: CostModel,
) -> XlaFlags:
    """`flags` with the pipelining of reduce-scatters and all-reduces that
    simulates fastest (none, each kind, both), as `xla-tuned` chooses it."""
    if not sinkable_collectives(module):
        return flags
    best = flags
    for kinds in (("reduce-scatter",), ("all-reduce",), PIPELINED_KINDS):
        trial = replace(flags, pipelined_kinds=frozenset(kinds))
        graph = trial.task_graph(module, xla_fusion)
        trial = replace(trial, simulated_s=simulate(graph, profile, cost_model).iteration_s)
        if trial.simulated_s < best.simulated_s:
            best = trial
    return best


def _with_windowed_einsum(
    flags: XlaFlags,
    module: HloModule,
    xla_fusion: Plan,
    profile: ClusterProfile,
    cost_model: CostModel,
) -> XlaFlags:
    """`flags` with the windowed-einsum threshold that simulates fastest, as
    `xla-tuned` chooses it (`windowed_einsum.tuned_windowed_einsum`); unchanged
    where none is faster."""
    run = XlaGpuRun(buckets_by_xla=True, pipelined=flags.pipelined_kinds)

    def price(plan: Plan) -> float:
        try:
            graph = as_xla_gpu_runs(build_task_graph(module, plan), module, run)
        except RuntimeError:  # no kernel order runs it
            return math.inf
        return simulate(graph, profile, cost_model).iteration_s

    program = flags.plan(module, xla_fusion)
    _, threshold_mib, seconds = tuned_windowed_einsum(module, program, price)
    if threshold_mib is None:
        return flags
    return replace(flags, windowed_einsum_mib=threshold_mib, simulated_s=seconds)
