"""Search over op-fusion groups and all-reduce buckets, and the baselines.

`optimize(module, cluster=...)` is the Python entry point; `backtracking` holds the
search and `baselines` builds every baseline of the design notes as a plan.
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
) -> Plan:
    """The plan with the lowest simulated iteration time that the backtracking
    search finds for `module` on `cluster` (a profile name or a YAML path)."""
    from disco_xla.errors import DiscoInputError
    from disco_xla.search.backtracking import greedy_fusion_plan, search
    from disco_xla.simulator.cost_models import RooflineCostModel, TableCostModel
    from disco_xla.simulator.profiles import load_profile

    profile = load_profile(cluster)
    model = RooflineCostModel(profile)
    if cost_model == "table":
        if table is None:
            raise DiscoInputError("optimize", "the table cost model needs a table of kernel times")
        model = TableCostModel.load(table, fallback=model)
    elif cost_model != "roofline":
        raise DiscoInputError(
            "optimize", f"unknown cost model {cost_model!r}; use roofline or table"
        )
    starts = [Plan.unfused(module), greedy_fusion_plan(module)]
    return search(
        module,
        profile,
        model,
        starts,
        alpha=alpha,
        budget_s=budget_s,
        max_evaluations=max_evaluations,
        seed=seed,
    ).plan
