"""Sample legal op-fusion plans of a module and measure every group's kernel time.

Plans per module (`sample_plans`): the XLA-like greedy fusion (producer into its
only consumer, at most one dot/convolution per group), no fusion, and random
merges of producer-consumer groups, started from either of those. A merge joins
a group with a group that reads it, if the result keeps at most one expensive op
and stays acyclic: no path leaves the producer and reaches the consumer through a
third node. Each plan passes `verify_plan`, the one verifier of legality.

Measurement (`measure_plan`): every group is outlined into a call XLA may not
inline (the fusion-boundaries pass), except groups that hold a convolution or a
dot: inside a call those take another, much slower path (23-26x, see
`hlo_passes/fusion_boundaries.py`), so their samples come from XLA's own compile
alone (`measure_xla_compiled`). The module is compiled with XLA's all-reduce
combiner off, run on as many devices of the platform ('cpu' or 'gpu') as its
partitions or replicas ask for, and profiled (`profile_kernel_times`, blocking
after each step). A group's time is the sum of the median times of the kernels
XLA emitted inside its call (divided by the number of calls, where the group sits
in a computation called from several places); a group XLA emitted no kernel for
(a reshape that became a bitcast) gets the time of its call thunk with
`kernel_count` 0, if the trace shows one, else no sample.

`measure_xla_compiled` adds the kernels of XLA's own compile of the unmodified
module: each top-level instruction of the compiled module is a kernel.

Every sample keeps the machine's speed reference, taken around its plan's
traced runs (`profiling/speed_reference.py`).
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from disco_xla.costmodel.dataset import KernelSample
from disco_xla.costmodel.features import kernel_graph
from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.fusion_boundaries import GROUP_MARK, OutlineFusionGroups
from disco_xla.plan import (
    Plan,
    compute_instructions,
    departing_groups,
    fusion_weight,
    verify_plan,
)
from disco_xla.profiling.kernel_times import KERNEL_PLANES, profile_kernel_times
from disco_xla.profiling.speed_reference import reference_seconds
from disco_xla.runtime.xla_runner import no_combiner, program_for, random_arguments
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.kernels import Kernel, build_task_graph, kernel_for

MAX_VISITS = 4000  # nodes one acyclicity check may visit
_GROUP_COMPUTATION = re.compile(re.escape(GROUP_MARK) + r"\.(\d+)")


def random_merge_plan(base: Plan, module: HloModule, merges: int, rng: random.Random) -> Plan:
    """`base` with up to `merges` random producer-consumer merges (see the module
    docstring); every merge keeps the plan legal. Up to `4 * merges` draws: a
    random group, then a random one of the groups that read it."""
    compute = compute_instructions(module)
    groups = _MergeableGroups(base, module, compute)
    done = 0
    attempts = 0
    while done < merges and attempts < merges * 4:
        attempts += 1
        producer = rng.choice(list(groups.members))
        consumers = groups.consumers(producer)
        if not consumers:
            continue
        consumer = rng.choice(sorted(consumers))
        if not groups.can_merge(producer, consumer):
            continue
        groups.merge(producer, consumer)
        done += 1
    return replace(base, fusion_groups=groups.fusion_groups(compute))


class _MergeableGroups:
    """A plan's fusion groups by index, as `random_merge_plan` merges them:
    each group's members and expensive-op count, and each instruction's group."""

    def __init__(self, base: Plan, module: HloModule, compute: list) -> None:
        by_name = {i.name: i for i in compute}
        self.group_of: dict[int, int] = {}
        self.members: dict[int, list] = {}
        self.expensive: dict[int, int] = {}
        for index, group in enumerate(base.fusion_groups):
            instrs = [by_name[n] for n in group]
            self.members[index] = instrs
            self.expensive[index] = sum(fusion_weight(i) for i in instrs)
            for instr in instrs:
                self.group_of[id(instr)] = index
        self.control_successors: dict[int, list] = defaultdict(list)
        for instr in module.instructions():
            for predecessor in instr.control_predecessors:
                self.control_successors[id(predecessor)].append(instr)

    def consumers(self, producer: int) -> set[int]:
        """The other groups that read a result of `producer`."""
        group_of = self.group_of
        return {
            group_of[id(u)]
            for m in self.members[producer]
            for u in m.users
            if id(u) in group_of and group_of[id(u)] != producer
        }

    def can_merge(self, producer: int, consumer: int) -> bool:
        """At most one expensive op in the merged group, and no cycle."""
        if self.expensive[producer] + self.expensive[consumer] > 1:
            return False
        return not self.creates_cycle(producer, consumer)

    def merge(self, producer: int, consumer: int) -> None:
        for instr in self.members[producer]:
            self.group_of[id(instr)] = consumer
        self.members[consumer] = self.members[consumer] + self.members.pop(producer)
        self.expensive[consumer] += self.expensive.pop(producer)

    def fusion_groups(self, compute: list) -> tuple:
        """The groups as a plan's `fusion_groups`: names in program order, the
        groups sorted by their first name."""
        position = {id(i): n for n, i in enumerate(compute)}
        groups = sorted(
            (
                tuple(i.name for i in sorted(g, key=lambda i: position[id(i)]))
                for g in self.members.values()
            ),
            key=lambda g: g[0],
        )
        return tuple(groups)

    def _successors(self, instr) -> list:
        return instr.users + self.control_successors.get(id(instr), [])

    def creates_cycle(self, producer: int, consumer: int) -> bool:
        """Is there a path producer -> (other node) -> ... -> consumer in the graph
        where each group is one node? A search that visits more than
        `MAX_VISITS` nodes counts as yes (the merge is skipped)."""
        group_of, members = self.group_of, self.members
        stack = [
            u
            for m in members[producer]
            for u in self._successors(m)
            if group_of.get(id(u)) not in (producer, consumer)
        ]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            if len(seen) > MAX_VISITS:
                return True
            group = group_of.get(id(node))
            if group == consumer:
                return True
            seen.add(id(node))
            frontier = members[group] if group is not None else [node]
            for instr in frontier:
                seen.add(id(instr))
                for user in self._successors(instr):
                    if group_of.get(id(user)) == consumer:
                        return True
                    if id(user) not in seen and group_of.get(id(user)) != producer:
                        stack.append(user)
        return False


def sample_plans(module: HloModule, count: int, seed: int = 0) -> list[tuple[str, Plan]]:
    """`count` legal plans: XLA-like, unfused, then random merges (kind, plan)."""
    rng = random.Random(seed)
    greedy = greedy_fusion_plan(module)
    unfused = Plan.unfused(module)
    plans = [("xla-like", greedy), ("unfused", unfused)][:count]
    for index in range(count - len(plans)):
        base = (greedy, unfused)[index % 2]
        fraction = rng.uniform(0.05, 0.6)
        merges = max(1, int(fraction * len(base.fusion_groups)))
        plan = random_merge_plan(base, module, merges, rng)
        verify_plan(plan, module, source=f"random plan {index}")
        plans.append(("random", plan))
    return plans


def group_kernels(module: HloModule, plan: Plan) -> list[Kernel]:
    """The plan's groups as the simulator's `Kernel`s, in plan order."""
    by_name = {i.name: i for i in module.instructions()}
    return [kernel_for([by_name[n] for n in group]) for group in plan.fusion_groups]


def _samples(
    module, kernels, times_s, counts, module_name, model, kind, reference_s
) -> list[KernelSample]:
    samples = []
    for kernel in kernels:
        time_s = times_s.get(kernel.name)
        if time_s is None or time_s <= 0:
            continue
        samples.append(
            KernelSample(
                graph=kernel_graph(kernel),
                time_s=time_s,
                kernel_count=counts.get(kernel.name, 1),
                module=module_name,
                model=model,
                plan_kind=kind,
                structural_hash=kernel.structural_hash,
                element_type=kernel.element_type,
                op_class=kernel.op_class,
                reference_s=reference_s,
            )
        )
    return samples


def measure_plan(
    module: HloModule,
    plan: Plan,
    kind: str,
    module_name: str,
    model: str,
    repeats: int = 5,
    seed: int = 0,
    platform: str = "cpu",
) -> list[KernelSample]:
    """One sample per group of `plan` that XLA ran (see the module docstring)."""
    verify_plan(plan, module, source=f"{kind} plan")
    rewritten = HloModule.from_bytes(module.to_bytes(), f"{module.source} + {kind} plan")
    OutlineFusionGroups(plan.fusion_groups, departing_groups(rewritten, plan, None)).run(rewritten)
    program = _program(rewritten, platform)
    run = program.device_runner(random_arguments(program.parameters, seed))
    times, reference_s = _timed_with_reference(run, repeats, platform)
    compiled = program.compiled_module()
    group_s: dict[int, float] = defaultdict(float)
    emitted: dict[int, int] = defaultdict(int)
    call_s: dict[int, list[float]] = defaultdict(list)
    instances: dict[int, int] = defaultdict(int)
    for computation in compiled.computations:
        for instr in computation.instructions:
            called = instr.called_computations
            match = _GROUP_COMPUTATION.match(called[0].name) if called else None
            if instr.opcode == "call" and match:
                instances[int(match.group(1))] += 1
                if instr.name in times:
                    call_s[int(match.group(1))].append(times[instr.name])
    for computation in compiled.computations:
        match = _GROUP_COMPUTATION.match(computation.name)
        for instr in computation.instructions:
            if instr.name not in times:
                continue
            if match:
                group = int(match.group(1))
                group_s[group] += times[instr.name]
                emitted[group] += 1
    kernels = group_kernels(module, plan)
    by_kernel: dict[str, float] = {}
    counts: dict[str, int] = {}
    for group, kernel in enumerate(kernels):
        # A group inside a computation called from several places runs once per
        # call site (XLA clones the callee): a sample is one run of the group.
        runs = max(instances[group], 1)
        if group in group_s:
            by_kernel[kernel.name] = group_s[group] / runs
            counts[kernel.name] = round(emitted[group] / runs)
        elif group in call_s:
            by_kernel[kernel.name] = float(np.median(call_s[group]))
            counts[kernel.name] = 0
    return _samples(module, kernels, by_kernel, counts, module_name, model, kind, reference_s)


def measure_xla_compiled(
    module: HloModule,
    module_name: str,
    model: str,
    repeats: int = 5,
    seed: int = 0,
    platform: str = "cpu",
) -> list[KernelSample]:
    """One sample per kernel of XLA's own compile (combiner off)."""
    program = _program(module, platform)
    run = program.device_runner(random_arguments(program.parameters, seed))
    times, reference_s = _timed_with_reference(run, repeats, platform)
    compiled = program.compiled_module()
    graph = build_task_graph(compiled, Plan.unfused(compiled))
    return _samples(
        compiled, graph.kernels, times, {}, module_name, model, "xla-compiled", reference_s
    )


def _timed_with_reference(run, repeats: int, platform: str) -> tuple[dict[str, float], float]:
    """(each instruction's traced seconds, the speed reference around them: the
    mean of one taken just before and one just after)."""
    before = reference_seconds(platform)
    times = profile_kernel_times(run, repeats, platform)
    return times, (before + reference_seconds(platform)) / 2


def profile_module(
    module: HloModule,
    module_name: str,
    model: str,
    plans: int,
    repeats: int = 5,
    seed: int = 0,
    on_plan: Callable[[str], None] = lambda kind: None,
    platform: str = "cpu",
) -> list[KernelSample]:
    """Samples of XLA's own compile and of `plans` sampled plans of `module`."""
    on_plan("xla-compiled")
    samples = measure_xla_compiled(module, module_name, model, repeats, seed, platform)
    for kind, plan in sample_plans(module, plans, seed):
        on_plan(kind)
        samples += measure_plan(module, plan, kind, module_name, model, repeats, seed, platform)
    return samples


def _program(module: HloModule, platform: str):
    """The module compiled for its devices on `platform` ('cpu' or 'gpu'), XLA's
    all-reduce combiner off (`runtime.xla_runner.no_combiner`); DevicesUnavailable
    (bad input, one line) where the platform has too few devices."""
    if platform not in KERNEL_PLANES:
        raise DiscoInputError(
            module.source, f"cannot profile on {platform!r}: choose {', '.join(KERNEL_PLANES)}"
        )
    return program_for(module, disabled_passes=no_combiner(platform), platform=platform)
