"""Search over op-fusion groups and all-reduce buckets, and the baselines.

`optimize(module, cluster=...)` is the Python entry point; `backtracking` holds the
search, `baselines` builds every baseline of the design notes as a plan,
`xla_fusion` maps XLA's compiled kernels back onto the captured module, and
`compare` runs every baseline, the ablations and the search side by side.
"""

from __future__ import annotations

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan


def optimize(
    module: HloModule,
    cluster: str,
    budget_s: float = 60.0,
    max_evaluations: int = 1000,
    alpha: float = 1.05,
    seed: int = 0,
    cost_model: str = "roofline",
    table: str | None = None,
    compiled: HloModule | None = None,
) -> Plan:
    """The plan with the lowest simulated iteration time that the backtracking
    search finds for `module` on `cluster` (a profile name or a YAML path).

    `compiled` is the module as XLA compiled it with its all-reduce combiner off
    (`runtime.xla_runner.compile_module(module, ["cpu-all-reduce-combiner"])`).
    When given, the search also starts from every baseline (XLA's fusion mapped
    onto `module`, with each baseline's buckets), so the plan is never slower than
    any of them, and its fusion only splits XLA's groups (what the rewrite can
    realise); without it, from no fusion and a greedy XLA-like fusion."""
    from disco_xla.search.backtracking import greedy_fusion_plan, search
    from disco_xla.simulator.cost_models import boundary_charged, make_cost_model
    from disco_xla.simulator.profiles import load_profile

    profile = load_profile(cluster)
    model = make_cost_model(cost_model, profile, table)
    starts = [Plan.unfused(module), greedy_fusion_plan(module)]
    within_groups = None
    if compiled is not None:
        from disco_xla.search.baselines import captured_baselines

        baselines = captured_baselines(module, compiled, profile, model)
        starts += [b.plan for b in baselines.values()]
        within_groups = baselines["xla-nocombine"].plan.fusion_groups
        model = boundary_charged(model, profile, within_groups)
    return search(
        module,
        profile,
        model,
        starts,
        alpha=alpha,
        budget_s=budget_s,
        max_evaluations=max_evaluations,
        seed=seed,
        within_groups=within_groups,
    ).plan
