"""The planning pipeline: from a captured module to its plan, the one path that
`disco-xla optimize`, `disco_xla.optimize`, `planning.find_plan` (under
`disco_xla.jit`, `disco_xla.tf_function` and the env hook) and the demo all take.

1. Pricing (`pricing`): the settings' cluster profile at the module's worker
   count, and its cost model. Kernel times measured on this machine, and
   collective costs learned here, come first where given.
2. Baselines: given XLA's own fusion of the module (`fusion_source`: compiled
   here, from XLA's dump, or modelled), every baseline of `baselines.BASELINES`
   as a plan over the module, simulated as XLA runs it. XLA's own groups then
   bound the search: plans only split them, and pay the profile's boundary cost
   for each group that departs (`cost_models.boundary_charged`).
3. Ablations, when asked for (the CLI's report): `fusion-only`, the search with
   fusion moves only, from the best baseline and the greedy fusion; and
   `bucketing-only`, with bucket moves only, from the best baseline that keeps
   XLA's fusion.
4. The search, `found`: every move, from no fusion, the greedy fusion, every
   baseline and the ablations' plans, so it is never slower than any of them.
   Its moves keep a plan's all-gather buckets; the found plan then takes the
   fastest of a sweep of all-gather buckets (`all_gather_buckets`), of
   which loop-body all-gathers to issue a trip ahead (`prefetch`), and of how
   many chunks to split each collective into with the dots next to it
   (`chunking`). On GPU
   profiles, the program of the XLA flags closest to it replaces it where that
   is faster as the rewrite runs it (`xla_flags`; the flags' own figure is
   that program as XLA:GPU compiles it, `simulator.xla_gpu_run`).
5. The plan as it runs: the found plan, and every baseline's plan as the
   rewrite would run it, are priced compiled by XLA under the expert's flags
   (`expert_pipelining`: where `xla-tuned` pipelines loop collectives, XLA
   pipelines the rewritten program's too), and the fastest of them is the
   found plan: never slower than a baseline run the same way.
6. With the ablations, what a checking entry point would run (`ablation`):
   the found plan over XLA's own fusion where its fusion departs (that changes
   results), or the fastest plan searched or baseline that keeps XLA's fusion,
   whichever is faster; and the found plan with each dimension in turn set as
   `xla-tuned` has it.

T_ideal = max(C, A) uses for C the kernel time of XLA's fusion (the
`xla-nocombine` plan has no bucket copies) and for A every gradient byte sent as
one message (`events`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.chunking import chunkable_collectives
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import DIMENSIONS, Plan, all_gathers, prefetchable_all_gathers, verify_plan
from disco_xla.search.ablation import departs_from, leave_one_out, realisable_plan
from disco_xla.search.all_gather_buckets import best_all_gather_buckets
from disco_xla.search.backtracking import MoveSet, SearchResult, greedy_fusion_plan, search
from disco_xla.search.baselines import BASELINES, Baseline, captured_baselines
from disco_xla.search.chunking import best_chunks
from disco_xla.search.fusion_source import XlaFusion
from disco_xla.search.prefetch import best_prefetch
from disco_xla.search.xla_flags import closest_xla_flags
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.cost_models import (
    CostModel,
    TableCostModel,
    boundary_charged,
    make_cost_model,
)
from disco_xla.simulator.events import simulate
from disco_xla.simulator.incremental import GroupCosts
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile, load_profile
from disco_xla.simulator.result import SimulationResult
from disco_xla.simulator.step_time_fit import CollectiveCosts
from disco_xla.simulator.xla_gpu_run import XlaGpuRun, as_xla_gpu_runs

ABLATIONS = ("fusion-only", "bucketing-only")
# Every row a comparison can hold, in the order reports print them.
# `maxtext` only where MaxText published thresholds for the profile's scale.
_AFTER_TUNED = BASELINES.index("xla-tuned") + 1  # where `baseline_names` puts maxtext
ROWS = (*BASELINES[:_AFTER_TUNED], "maxtext", *BASELINES[_AFTER_TUNED:], *ABLATIONS, "found")


@dataclass(frozen=True)
class Pricing:
    """What the pipeline prices plans with."""

    profile: ClusterProfile  # at the module's worker count
    cost_model: CostModel  # kernel times


BACKTRACKING = "backtracking"
# Which step of the search chooses each plan dimension (`plan.DIMENSIONS`), in
# the order the steps run: the backtracking search's moves (fusion groups and
# all-reduce buckets, together), then the found plan's all-gather buckets and
# prefetches (`with_best_all_gathers`), then its chunks (`with_best_chunks`).
SEARCH_STEPS: dict[str, str] = {
    "fusion": BACKTRACKING,
    "all-reduce buckets": BACKTRACKING,
    "all-gather buckets": "all-gathers",
    "prefetch": "all-gathers",
    "chunks": "chunks",
}


def pricing(
    module: HloModule,
    settings: OptimizeSettings,
    table: str | None = None,
    measured_s: dict[str, float] | None = None,
    learned: CollectiveCosts | None = None,
) -> Pricing:
    """The settings' profile (`cluster`) for the module's worker count and its
    cost model (`cost_model`, with `table` for the table model). `measured_s`
    holds kernel times measured on this machine (structural hash -> seconds):
    they are trusted first, the cost model gives the others. `learned`
    collective costs, where known, replace the profile's cost of each collective
    and of each tuple tensor (`planning.learned_collective_costs`)."""
    profile = load_profile(settings.cluster, module.worker_count())
    if learned is not None:
        profile = learned.applied_to(profile)
    model = make_cost_model(settings.cost_model, profile, table)
    if measured_s:
        model = TableCostModel(measured_s, fallback=model)
    return Pricing(profile, model)


@dataclass(frozen=True)
class PlanComparison:
    """What the pipeline found for one module, and everything it compared."""

    baselines: dict[str, Baseline]  # none without XLA's fusion
    fusion: XlaFusion | None  # XLA's own fusion, and where it came from
    # By ROWS name, in that order: each baseline as XLA runs it, each ablation
    # run, and 'found'; all simulated over the captured module.
    results: dict[str, SimulationResult]
    searches: dict[str, SearchResult]  # each ablation run, and 'found'
    # Each baseline's plan and its simulated seconds as the rewrite would run it
    # (for 'xla', as XLA runs it: XLA's own program): the candidates to measure.
    baseline_plans: dict[str, tuple[Plan, float]]
    # With the ablations: the plan a checking entry point would run
    # (`ablation.realisable_plan`) and its seconds as the rewrite runs it; None
    # without them or without XLA's fusion.
    realisable: tuple[Plan, float] | None = None
    # With the ablations: the found plan's seconds with each dimension where it
    # departs from `xla-tuned` set as `xla-tuned` has it (`ablation.leave_one_out`).
    without_dimension: dict[str, float | None] = field(default_factory=dict)

    @property
    def found(self) -> SearchResult:
        return self.searches["found"]


OnSearch = Callable[[str], Callable[[int, float], None]]


def plan_module(
    module: HloModule,
    settings: OptimizeSettings,
    prices: Pricing,
    fusion: XlaFusion | None = None,
    *,
    ablations: bool = False,
    keep: int = 1,
    on_search: OnSearch | None = None,
) -> PlanComparison:
    """Run the pipeline (the module docstring) on `module` within the budget of
    `settings`. `fusion` is XLA's own fusion of the module
    (`fusion_source.xla_fusion_of`); without it there are no baselines, and the
    search starts from no fusion and the greedy fusion alone. The search keeps its `keep` best plans
    (`SearchResult.top_plans`). `on_search(label)` gives the progress callback
    of each search."""
    profile, cost_model = prices.profile, prices.cost_model
    baselines = captured_baselines(module, fusion, profile, cost_model) if fusion else {}
    own_groups = None
    if baselines:
        own_groups = baselines["xla-nocombine"].plan.fusion_groups
        cost_model = boundary_charged(cost_model, profile, own_groups)
    run = _Runs(module, settings, profile, cost_model, own_groups, on_search)
    run.under_xla = expert_pipelining(baselines)
    results = run.baselines(baselines)
    starts = [Plan.unfused(module), greedy_fusion_plan(module)]
    starts += [b.plan for b in baselines.values()]
    searches: dict[str, SearchResult] = {}
    if ablations and baselines:
        searches = run.ablations(baselines, results)
        starts += [found.plan for found in searches.values()]
    searches["found"] = run.search("found", starts, MoveSet.ALL, keep)
    if baselines and profile.execution == "gpu-streams":
        searches["found"] = run.with_flags_program(
            searches["found"], baselines["xla-nocombine"].plan
        )
    baseline_plans = run.baseline_plans(baselines, results)
    searches["found"] = run.no_slower_than(searches["found"], baseline_plans)
    for label, found in searches.items():
        results[label] = run.rewritten(found.plan)
    rows = {name: results[name] for name in ROWS if name in results}
    if not (ablations and baselines):
        return PlanComparison(baselines, fusion, rows, searches, baseline_plans)
    others = [(s, p) for name, (p, s) in baseline_plans.items() if name != "xla"]
    others += [(results[label].iteration_s, f.plan) for label, f in searches.items()]
    realisable = run.realisable(searches["found"].plan, baselines["xla-nocombine"].plan, others)
    expert = baselines["xla-tuned"].plan
    without = leave_one_out(searches["found"].plan, expert, run.rewritten_s)
    return PlanComparison(baselines, fusion, rows, searches, baseline_plans, realisable, without)


class _Runs:
    """The simulations and searches of one pipeline run, over one module with
    one profile and (charged) cost model."""

    def __init__(self, module, settings, profile, cost_model, own_groups, on_search):
        self.module, self.settings, self.profile = module, settings, profile
        self.cost_model, self.own_groups, self.on_search = cost_model, own_groups, on_search
        self.costs = GroupCosts(module, cost_model, profile.kernel_time_scale)
        self.ideal_compute_s: float | None = None
        self.under_xla: XlaGpuRun | None = None  # `expert_pipelining`

    def simulate(self, graph) -> SimulationResult:
        return simulate(graph, self.profile, self.cost_model, ideal_compute_s=self.ideal_compute_s)

    def baselines(self, baselines: dict[str, Baseline]) -> dict[str, SimulationResult]:
        """Each baseline simulated as XLA runs it, against the compute time of
        XLA's own fusion."""
        if not baselines:
            return {}
        own = build_task_graph(self.module, baselines["xla-nocombine"].plan)
        self.ideal_compute_s = self.simulate(own).compute_s
        return {name: self.simulate(b.task_graph()) for name, b in baselines.items()}

    def ablations(
        self, baselines: dict[str, Baseline], results: dict[str, SimulationResult]
    ) -> dict[str, SearchResult]:
        """Both ablations, each from the best baseline it may start from."""

        def best_of(names) -> Plan:
            return baselines[min(names, key=lambda n: (results[n].iteration_s, n))].plan

        fused_by_xla = [name for name in baselines if name != "none"]
        return {
            "fusion-only": self.search(
                "fusion-only",
                [best_of(baselines), greedy_fusion_plan(self.module)],
                MoveSet.FUSION,
            ),
            "bucketing-only": self.search(
                "bucketing-only", [best_of(fused_by_xla)], MoveSet.BUCKETING
            ),
        }

    def search(self, label: str, starts: list[Plan], moves: MoveSet, keep: int = 1) -> SearchResult:
        """The search from `starts` without their all-gather buckets,
        prefetches and chunks (its moves keep a plan's, and each can make every
        evaluation a full simulation), then the found plan with the fastest
        all-gather buckets and prefetches (`with_best_all_gathers`), then the
        fastest chunks (`with_best_chunks`)."""
        refined_later = {d.field: () for d in DIMENSIONS if SEARCH_STEPS[d.name] != BACKTRACKING}
        found = search(
            self.module,
            self.profile,
            self.cost_model,
            [replace(plan, **refined_later) for plan in starts],
            self.settings,
            moves=moves,
            keep=keep,
            costs=self.costs,
            within_groups=self.own_groups,
            on_evaluation=self.on_search(label) if self.on_search else lambda done, best_s: None,
        )
        for step in dict.fromkeys(SEARCH_STEPS.values()):
            if step != BACKTRACKING:
                found = REFINEMENTS[step](self, found, starts)
        return found

    def with_best_all_gathers(self, found: SearchResult, starts: list[Plan]) -> SearchResult:
        """`found` with the fastest all-gather buckets among the starts' and a
        sweep of XLA's combiner (`all_gather_buckets.best_all_gather_buckets`),
        then the fastest choice of all-gathers to issue a loop trip ahead
        (`prefetch.best_prefetch`), or the fastest start plan without its
        chunks, if that is faster still: so the result is never slower than a
        start's buckets and prefetches. Chunks are chosen after
        (`with_best_chunks`), from none: a start's chunks would hold the
        collectives they split out of that choice."""
        plan = found.plan
        if not all_gathers(self.module):
            return found
        plan_s = self._plan_s

        def price(buckets: tuple[tuple[str, ...], ...]) -> float:
            return plan_s(replace(plan, all_gather_buckets=buckets))

        extra = [start.all_gather_buckets for start in starts]
        buckets, seconds = best_all_gather_buckets(
            self.module, plan.all_gather_buckets, price, extra
        )
        best, best_s = replace(plan, all_gather_buckets=buckets), seconds
        if prefetchable_all_gathers(self.module):
            best, best_s = best_prefetch(self.module, best, plan_s)
        for start in starts:
            # Without its chunks: they are chosen next (`with_best_chunks`),
            # which keeps any a plan already has.
            start = replace(start, chunked_collectives=())
            if (start.all_gather_buckets or start.prefetched_all_gathers) and start != best:
                start_s = plan_s(start)
                if start_s < best_s:
                    best, best_s = start, start_s
        if best == plan:
            return found
        top = ((best_s, best), *found.top_plans)[: max(1, len(found.top_plans))]
        return replace(found, plan=best, iteration_s=best_s, top_plans=top)

    def with_best_chunks(self, found: SearchResult) -> SearchResult:
        """`found` with each collective split into the fastest number of chunks
        (`chunking.best_chunks`), where any split is faster."""
        if not chunkable_collectives(self.module):
            return found
        best, best_s = best_chunks(self.module, found.plan, self._plan_s)
        if best == found.plan:
            return found
        top = ((best_s, best), *found.top_plans)[: max(1, len(found.top_plans))]
        return replace(found, plan=best, iteration_s=best_s, top_plans=top)

    def _plan_s(self, trial: Plan) -> float:
        """The simulated seconds of `trial` (inf where it is not a valid plan)."""
        try:
            verify_plan(trial, self.module)
            return self.simulate(build_task_graph(self.module, trial)).iteration_s
        except (DiscoInputError, RuntimeError):  # RuntimeError: no kernel order runs it
            return math.inf

    def with_flags_program(self, found: SearchResult, xla_fusion: Plan) -> SearchResult:
        """`found`, or the program of the XLA flags closest to it
        (`xla_flags.closest_xla_flags`) where that is faster: its thresholds
        come from the found plan's bucket sizes, so it cannot be a start."""
        flags = closest_xla_flags(
            self.module, found.plan, xla_fusion, self.profile, self.cost_model
        )
        program = flags.plan(self.module, xla_fusion)
        # As the rewrite runs it (its buckets concatenated): the plan an entry
        # point runs. XLA's own run of it is the flags' figure.
        seconds = self.rewritten(program).iteration_s
        if seconds >= self.rewritten(found.plan).iteration_s:
            return found
        top = ((seconds, program), *found.top_plans)[: max(1, len(found.top_plans))]
        return replace(found, plan=program, iteration_s=seconds, top_plans=top)

    def baseline_plans(
        self, baselines: dict[str, Baseline], results: dict[str, SimulationResult]
    ) -> dict[str, tuple[Plan, float]]:
        """`PlanComparison.baseline_plans`: a baseline that XLA sends as tuples,
        or runs with blocking collectives, is simulated again as the rewrite
        would run its plan."""
        found = {}
        for name, b in baselines.items():
            if name == "xla" or not (b.tuple_buckets or b.collectives_block_compute or b.xla_run):
                found[name] = (b.plan, results[name].iteration_s)
            else:
                found[name] = (b.plan, self.rewritten(b.plan).iteration_s)
        return found

    def rewritten(self, plan: Plan) -> SimulationResult:
        """`plan` as the rewrite runs it, compiled by XLA under the expert's
        flags (`under_xla`: its pipelining of loop collectives), where set."""
        graph = build_task_graph(self.module, plan)
        if self.under_xla is not None:
            graph = as_xla_gpu_runs(graph, self.module, self.under_xla)
        return self.simulate(graph)

    def rewritten_s(self, plan: Plan) -> float:
        """`rewritten`'s seconds, inf where `plan` is not valid or cannot run."""
        try:
            verify_plan(plan, self.module)
            return self.rewritten(plan).iteration_s
        except (DiscoInputError, RuntimeError):  # RuntimeError: no kernel order runs it
            return math.inf

    def realisable(
        self, found: Plan, xla_fusion: Plan, others: list[tuple[float, Plan]]
    ) -> tuple[Plan, float]:
        """The fastest plan that keeps XLA's fusion among: the found plan's
        realisable part (`ablation.realisable_plan`), the same without its
        chunks (whose dots XLA's groups may hold otherwise), and `others`
        (seconds as the rewrite runs each, plan) that keep XLA's fusion."""
        options = [(s, p) for s, p in others if not departs_from(p, xla_fusion, "fusion")]
        kept = realisable_plan(found, xla_fusion)
        if kept is not found:  # `found` itself, where it keeps XLA's fusion, is in `others`
            options.append((self.rewritten_s(kept), kept))
            if kept.chunked_collectives:
                unchunked = replace(kept, chunked_collectives=())
                options.append((self.rewritten_s(unchunked), unchunked))
        seconds, plan = min(options, key=lambda pair: pair[0])
        return plan, seconds

    def no_slower_than(
        self, found: SearchResult, baseline_plans: dict[str, tuple[Plan, float]]
    ) -> SearchResult:
        """`found` priced as the rewrite runs it (`rewritten`), or the fastest
        baseline plan run the same way where that is faster (the search prices
        without XLA's pipelining, so it can miss a plan that gains by it)."""
        seconds = self.rewritten(found.plan).iteration_s
        best = min(
            ((s, plan) for name, (plan, s) in baseline_plans.items() if name != "xla"),
            default=None,
            key=lambda pair: pair[0],
        )
        if best is None or best[0] >= seconds:
            return replace(found, iteration_s=seconds)
        top = (best, *found.top_plans)[: max(1, len(found.top_plans))]
        return replace(found, plan=best[1], iteration_s=best[0], top_plans=top)


def expert_pipelining(baselines: dict[str, Baseline]) -> XlaGpuRun | None:
    """The pipelining of loop collectives the `xla-tuned` baseline keeps, as
    XLA would apply it to any program compiled under the same flags; None
    where it keeps none (or there is no such baseline)."""
    tuned = baselines.get("xla-tuned")
    if tuned is None or tuned.xla_run is None or not tuned.xla_run.pipelined:
        return None
    return XlaGpuRun(buckets_by_xla=False, pipelined=tuned.xla_run.pipelined)


# The refinements of the found plan, by the name `SEARCH_STEPS` gives them.
REFINEMENTS = {
    "all-gathers": lambda planner, found, starts: planner.with_best_all_gathers(found, starts),
    "chunks": lambda planner, found, starts: planner.with_best_chunks(found),
}
