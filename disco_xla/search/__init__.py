"""Search over op-fusion groups and all-reduce buckets, and the baselines.

`optimize(module, cluster=...)` is the Python entry point; `backtracking` holds the
search, `baselines` builds every baseline as a plan,
`xla_fusion` maps XLA's compiled kernels back onto the captured module, and
`compare` runs every baseline, the ablations and the search side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.settings import DEFAULTS

if TYPE_CHECKING:
    from disco_xla.search.backtracking import SearchResult
    from disco_xla.simulator.step_time_fit import CollectiveCosts


def optimize(
    module: HloModule,
    cluster: str,
    budget_s: float = DEFAULTS.budget_s,
    max_evaluations: int = DEFAULTS.max_evaluations,
    alpha: float = DEFAULTS.alpha,
    seed: int = DEFAULTS.seed,
    cost_model: str = DEFAULTS.cost_model,
    table: str | None = None,
    compiled: HloModule | None = None,
) -> Plan:
    """The plan with the lowest simulated iteration time that the backtracking
    search finds for `module` on `cluster` (a profile name or a YAML path),
    priced with the figures the profile holds for the module's worker count.

    `compiled` is the module as XLA compiled it with its all-reduce combiner off
    (`runtime.xla_runner.compile_module(module, ["cpu-all-reduce-combiner"])`).
    When given, the search also starts from every baseline (XLA's fusion mapped
    onto `module`, with each baseline's buckets), so the plan is never slower than
    any of them, and its fusion only splits XLA's groups (what the rewrite can
    realise); without it, from no fusion and a greedy XLA-like fusion."""
    found, _ = optimize_with_candidates(
        module, cluster, budget_s, max_evaluations, alpha, seed, cost_model, table, compiled
    )
    return found.plan


def optimize_with_candidates(
    module: HloModule,
    cluster: str,
    budget_s: float = DEFAULTS.budget_s,
    max_evaluations: int = DEFAULTS.max_evaluations,
    alpha: float = DEFAULTS.alpha,
    seed: int = DEFAULTS.seed,
    cost_model: str = DEFAULTS.cost_model,
    table: str | None = None,
    compiled: HloModule | None = None,
    keep: int = 1,
    measured_s: dict[str, float] | None = None,
    learned: CollectiveCosts | None = None,
) -> tuple[SearchResult, dict[str, tuple[Plan, float]]]:
    """`optimize`'s search, whole: its result, which keeps the `keep` best
    distinct plans (`SearchResult.top_plans`), and every baseline it started
    from as (plan, simulated seconds) by name (none without `compiled`).
    `measured_s` holds kernel times measured on this machine (structural hash
    -> seconds): they are trusted first, `cost_model` gives the others.
    `learned` collective costs, where known, replace the profile's cost of
    each collective and of each tuple tensor (`ClusterProfile.collective_message_s`,
    `tuple_all_reduce_element_s`; learned by `planning`)."""
    from disco_xla.search.backtracking import greedy_fusion_plan, search
    from disco_xla.simulator.cost_models import (
        TableCostModel,
        boundary_charged,
        make_cost_model,
    )
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    profile = load_profile(cluster, module.worker_count())
    if learned is not None:
        profile = learned.applied_to(profile)
    model = make_cost_model(cost_model, profile, table)
    if measured_s:
        model = TableCostModel(measured_s, fallback=model)
    starts = [Plan.unfused(module), greedy_fusion_plan(module)]
    within_groups = None
    baselines: dict = {}
    if compiled is not None:
        from disco_xla.search.baselines import captured_baselines

        baselines = captured_baselines(module, compiled, profile, model)
        starts += [b.plan for b in baselines.values()]
        within_groups = baselines["xla-nocombine"].plan.fusion_groups
        model = boundary_charged(model, profile, within_groups)
    found = search(
        module,
        profile,
        model,
        starts,
        alpha=alpha,
        budget_s=budget_s,
        max_evaluations=max_evaluations,
        seed=seed,
        within_groups=within_groups,
        keep=keep,
    )
    simulated = {
        name: (
            baseline.plan,
            simulate(
                baseline.task_graph() if name == "xla" else build_task_graph(module, baseline.plan),
                profile,
                model,
            ).iteration_s,
        )
        for name, baseline in baselines.items()
    }
    return found, simulated
