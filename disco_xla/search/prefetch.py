"""Which of a loop body's all-gathers a plan issues one trip ahead of their use
(`Plan.prefetched_all_gathers`, realised by `hlo_passes.prefetch_all_gathers`).

XLA:GPU does the same with `--xla_gpu_enable_pipelined_all_gather=true` (off by
default; NVIDIA's JAX-Toolbox GPU performance guide recommends it for FSDP, and
MaxText's GPU scripts set it): its collective pipeliner moves every all-gather
of a loop's invariant data one trip ahead (`pipelined_all_gathers`). A plan
chooses by simulated time among none, all of them, and each loop's alone
(`best_prefetch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan, prefetchable_all_gathers


def pipelined_all_gathers(module: HloModule, plan: Plan) -> tuple[str, ...]:
    """The all-gathers XLA's collective pipeliner issues a trip ahead under
    `plan`'s all-gather buckets: the members of each bucket (each all-gather, where the
    plan has no buckets) whose members all can be (`prefetchable_all_gathers`)."""
    allowed = prefetchable_all_gathers(module)
    if not plan.all_gather_buckets:
        return tuple(allowed)
    chosen = set(allowed)
    return tuple(
        name for bucket in plan.all_gather_buckets if chosen.issuperset(bucket) for name in bucket
    )


def prefetch_choices(module: HloModule, plan: Plan) -> list[tuple[str, ...]]:
    """What `best_prefetch` compares: none, every one the pipeliner would
    prefetch, and those of each loop alone (where there are several loops)."""
    every = pipelined_all_gathers(module, plan)
    by_loop: dict[str, list[str]] = {}
    for name in every:
        by_loop.setdefault(module.instruction(name).computation.name, []).append(name)
    choices = [(), every]
    if len(by_loop) > 1:
        choices += [tuple(names) for _, names in sorted(by_loop.items())]
    return list(dict.fromkeys(choices))


def best_prefetch(
    module: HloModule, plan: Plan, price: Callable[[Plan], float]
) -> tuple[Plan, float]:
    """`plan` with the fastest of `prefetch_choices` by `price` (simulated
    seconds), and its seconds. Ties keep the fewer prefetched: the plan as it
    was first."""
    best, best_s = plan, price(plan)
    for prefetched in prefetch_choices(module, plan):
        trial = replace(plan, prefetched_all_gathers=prefetched)
        if trial == plan:
            continue
        seconds = price(trial)
        if seconds < best_s:
            best, best_s = trial, seconds
    return best, best_s
