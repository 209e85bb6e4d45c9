"""Every baseline, the two ablations and the full search, over one captured module.

This is what `disco-xla optimize` and `benchmarks/search_table.py` report:

- the baselines of BASELINES as plans over the captured module (XLA's fusion
  mapped back onto it, see `baselines.captured_baselines`);
- `fusion-only`: the search with fusion moves only, from the best baseline (and
  the greedy fusion);
- `bucketing-only`: the search with bucket moves only, from the best baseline
  that keeps XLA's fusion;
- `found`: the search with every move, from the best baseline, the greedy fusion
  and both ablations' plans, so it is never slower than any of them.

T_ideal = max(C, A) uses for C the kernel time of XLA's fusion (the `xla-nocombine`
plan has no bucket copies) and for A one all-reduce of every gradient byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.search.backtracking import SearchResult, greedy_fusion_plan, search
from disco_xla.search.baselines import BASELINES, Baseline, captured_baselines
from disco_xla.settings import DEFAULTS
from disco_xla.simulator.cost_models import CostModel, boundary_charged
from disco_xla.simulator.events import simulate
from disco_xla.simulator.incremental import GroupCosts
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile
from disco_xla.simulator.result import SimulationResult

ABLATIONS = ("fusion-only", "bucketing-only")
# The rows every report prints, in order.
ROWS = (*BASELINES, *ABLATIONS, "found")


@dataclass(frozen=True)
class PlanComparison:
    """Every baseline, ablation and the search, simulated over one module."""

    baselines: dict[str, Baseline]
    results: dict[str, SimulationResult]  # by ROWS name, all over the captured module
    searches: dict[str, SearchResult]  # 'fusion-only', 'bucketing-only', 'found'

    @property
    def found(self) -> SearchResult:
        return self.searches["found"]


def compare_plans(
    module: HloModule,
    compiled_separate: HloModule,
    profile: ClusterProfile,
    cost_model: CostModel,
    alpha: float = DEFAULTS.alpha,
    budget_s: float = DEFAULTS.budget_s,
    max_evaluations: int = DEFAULTS.max_evaluations,
    seed: int = DEFAULTS.seed,
    on_search: Callable[[str], Callable[[int, float], None]] | None = None,
    keep: int = 1,
) -> PlanComparison:
    """Simulate every baseline, run both ablations and the full search (each with
    the whole budget), and simulate what they found. `on_search(label)` gives the
    progress callback of each search. The full search keeps its `keep` best
    plans (`SearchResult.top_plans`)."""
    baselines = captured_baselines(module, compiled_separate, profile, cost_model)
    # XLA's own groups: what the rewrite leaves to XLA. Plans only split them, and
    # pay the profile's boundary cost for each group that departs.
    own_groups = baselines["xla-nocombine"].plan.fusion_groups
    cost_model = boundary_charged(cost_model, profile, own_groups)

    def run(graph, ideal=None) -> SimulationResult:
        return simulate(graph, profile, cost_model, ideal_compute_s=ideal)

    xla_compute_s = run(build_task_graph(module, baselines["xla-nocombine"].plan)).compute_s
    results = {name: run(b.task_graph(), xla_compute_s) for name, b in baselines.items()}

    def best_of(names) -> Plan:
        return baselines[min(names, key=lambda n: (results[n].iteration_s, n))].plan

    # Each search starts from the best baseline it may start from (it would pick
    # that one anyway), so it need not simulate the others again.
    best_baseline = best_of(BASELINES)
    best_xla_fused = best_of([name for name in BASELINES if name != "none"])
    costs = GroupCosts(module, cost_model, profile.kernel_time_scale)
    searches: dict[str, SearchResult] = {}
    plans = {
        "fusion-only": ("fusion", [best_baseline, greedy_fusion_plan(module)]),
        "bucketing-only": ("bucketing", [best_xla_fused]),
    }
    for label in (*ABLATIONS, "found"):
        if label == "found":
            moves = "all"
            starts = plans["fusion-only"][1] + [s.plan for s in searches.values()]
        else:
            moves, starts = plans[label]
        searches[label] = search(
            module,
            profile,
            cost_model,
            starts,
            alpha=alpha,
            budget_s=budget_s,
            max_evaluations=max_evaluations,
            seed=seed,
            on_evaluation=on_search(label) if on_search else lambda evaluations, best_s: None,
            moves=moves,
            costs=costs,
            within_groups=own_groups,
            keep=keep if label == "found" else 1,
        )
        results[label] = run(build_task_graph(module, searches[label].plan), xla_compute_s)
    return PlanComparison(baselines, {name: results[name] for name in ROWS}, searches)


def comparison_summary(comparison: PlanComparison) -> dict:
    """The figures `disco-xla optimize --json` prints (without file paths)."""
    results = comparison.results
    found = results["found"]
    xla_s = results["xla"].iteration_s
    return {
        "plan_s": found.iteration_s,
        "baselines": {name: results[name].iteration_s for name in ROWS if name != "found"},
        "ideal_s": found.ideal_s,
        "speedup_vs_xla": xla_s / found.iteration_s,
        "t_over_ideal": found.t_over_ideal,
        "exposed_comm_s": found.exposed_comm_s,
        "buckets": found.buckets,
        "kernels": found.kernels,
        "evaluations": comparison.found.evaluations,
        "search_s": comparison.found.search_s,
        "rows": {
            name: {
                "iteration_s": r.iteration_s,
                "speedup_vs_xla": xla_s / r.iteration_s,
                "t_over_ideal": r.t_over_ideal,
                "exposed_comm_s": r.exposed_comm_s,
                "buckets": r.buckets,
                "kernels": r.kernels,
            }
            for name, r in results.items()
        },
    }


def format_table(comparison: PlanComparison) -> str:
    """The human table: every baseline, the ablations and the found plan."""
    results = comparison.results
    xla_s = results["xla"].iteration_s
    header = ("plan", "iteration ms", "vs xla", "T/T_ideal", "exposed ms", "buckets", "kernels")
    lines = ["{:<16}{:>14}{:>9}{:>11}{:>12}{:>9}{:>9}".format(*header)]
    for name, r in results.items():
        lines.append(
            f"{name:<16}{r.iteration_s * 1e3:>14.3f}{xla_s / r.iteration_s:>8.2f}x"
            f"{r.t_over_ideal:>11.2f}{r.exposed_comm_s * 1e3:>12.3f}{r.buckets:>9}{r.kernels:>9}"
        )
    return "\n".join(lines)
