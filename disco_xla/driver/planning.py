"""From a captured module to its plan and the candidates to measure beside it:
what every entry point (`disco_xla.jit`, `disco_xla.tf_function`, the env hook)
shares. `find_plan` reads the plan cache or runs the planning pipeline
(`search.pipeline`) and fills the cache; the first call's measurements go back
to the cache (`remember_measurement`, `learn_kernel_times`). Every function
takes one `OptimizeSettings` value. Planning compiles nothing: the caller hands
it XLA's compile (`find_plan`'s `compile_separately`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from disco_xla.driver.plan_cache import (
    CandidateRecord,
    PlanCache,
    cache_key,
    machine_key,
    times_digest,
)
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.create_reduce_scatters import CreateReduceScatters
from disco_xla.hlo_passes.inline_calls import InlineCalls
from disco_xla.hlo_passes.pass_interface import run_pipeline
from disco_xla.plan import Plan
from disco_xla.search.baselines import sends_tuples
from disco_xla.search.fusion_source import xla_fusion_of
from disco_xla.search.pipeline import PlanComparison, plan_module, pricing
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import ClusterProfile, load_profile
from disco_xla.simulator.step_time_fit import (
    CollectiveCosts,
    fit_collective_costs,
    message_counts,
)


@dataclass(frozen=True)
class PlanChoice:
    plan: Plan  # the search's best
    from_cache: bool
    seconds: float  # spent finding it (cache lookup or search)
    # The plans to measure against each other ('plan' among them), with their
    # simulated times, and the measured choice once a first call has made one.
    candidates: CandidateRecord
    cache_key: str = ""


def prepared(module: HloModule) -> HloModule:
    """The module plans are made for: `module` with its `call`s inlined, as XLA
    inlines them before fusion, and the partitioner's all-reduce +
    dynamic-slice pairs made reduce-scatters, as XLA:GPU makes them before it
    combines (`CreateReduceScatters`; a copy: `module` is left as it is)."""
    copy = HloModule.from_bytes(module.to_bytes(), module.source, module.file_format)
    run_pipeline(copy, [InlineCalls(), CreateReduceScatters()])
    return copy


def has_cross_device_all_reduces(module: HloModule) -> bool:
    """Whether the module is one we optimise: it reduces gradients across devices."""
    return bool(module.gradient_all_reduces)


def find_plan(
    module: HloModule,
    settings: OptimizeSettings,
    compile_separately: Callable[[HloModule], HloModule] | None = None,
    keep_measured_choice: bool = True,
) -> PlanChoice:
    """The plan for `module`, and the candidates to measure beside it
    (`measured_alternatives`): from the cache when there, else searched and
    cached. The search reads the kernel times measured on this machine
    (`learn_kernel_times`) first, the settings' cost model for other kernels,
    and prices each collective and each tuple tensor at what the step times
    measured on this machine before imply (`learned_collective_costs`). A
    cached plan found with costs far from today's is searched again, unless a
    trial here measured its candidates (then the choice it recorded stands, so
    that a rerun costs nothing; `keep_measured_choice=False` searches again,
    as `benchmarks/learned_regret.py` does to see what the measurement taught).

    `compile_separately(module)` is XLA's compile of the module with its
    all-reduce combiner off (`runtime.xla_runner.compile_separately`), called only
    when the search runs: the search then starts from every baseline too. Where
    it raises, XLA's fusion is modelled (`fusion_source.xla_fusion_of`)."""
    started = time.perf_counter()
    profile = load_profile(settings.cluster)
    cache = PlanCache(settings.cache_dir) if settings.use_cache else None
    # Kernel times measured on this machine before: the search trusts them over
    # any cost model, and a new measurement makes a new search.
    measured_s = cache.kernel_times(machine_key(profile)) if cache is not None else {}
    learned = learned_collective_costs(cache, profile, module) if cache is not None else None
    priced = profile.for_workers(module.worker_count())  # as measured at the module's count
    charged = learned.applied_to(priced) if learned is not None else priced
    options = settings.search_options()
    if measured_s:
        options["measured_kernels"] = times_digest(measured_s)
    key = cache_key(module.fingerprint, profile, options)
    if cache is not None:
        cached = _cached_plan(cache, key, module, charged, keep_measured_choice)
        if cached is not None:
            return PlanChoice(cached[0], True, time.perf_counter() - started, cached[1], key)
    # XLA's own fusion: the search then starts from every baseline too.
    fusion = xla_fusion_of(module, compile_separately) if compile_separately else None
    prices = pricing(module, settings, measured_s=measured_s, learned=learned)
    comparison = plan_module(module, settings, prices, fusion, keep=settings.candidates)
    record = _candidate_record(module, settings, comparison, priced, charged)
    if cache is not None:
        cache.put(key, comparison.found.plan)
        cache.put_candidates(key, record)
    return PlanChoice(comparison.found.plan, False, time.perf_counter() - started, record, key)


def _cached_plan(
    cache: PlanCache,
    key: str,
    module: HloModule,
    charged: ClusterProfile,
    keep_measured_choice: bool = True,
) -> tuple[Plan, CandidateRecord] | None:
    """The cached plan and its candidates, unless there is none for `module`, or what
    a collective costs here (`charged`) has moved far from what the plan was
    found with (a measured run of another module teaches it) and no candidate
    of this one was measured here."""
    plan = cache.get(key)
    if plan is None or plan.fingerprint != module.fingerprint:
        return None
    record = cache.get_candidates(key) or CandidateRecord({"plan": plan})
    if record.chosen is not None and keep_measured_choice:
        # Measured on this machine: the rerun runs that choice at once (a
        # measurement outranks a search re-priced with what it taught).
        return plan, record
    if _moved_far(record.message_s, charged.collective_message_s) or _moved_far(
        record.tuple_element_s, charged.tuple_all_reduce_element_s
    ):
        return None
    return plan, record


def _candidate_record(
    module: HloModule,
    settings: OptimizeSettings,
    comparison: PlanComparison,
    priced: ClusterProfile,
    charged: ClusterProfile,
) -> CandidateRecord:
    """The plans to measure (the search's best as 'plan', its next best, the
    best baseline), their simulated times and what each runs per step, and XLA's
    own program's as 'original'."""
    found, baselines = comparison.found, comparison.baseline_plans
    top_plans = found.top_plans or ((found.iteration_s, found.plan),)
    alternatives, simulated = measured_alternatives(top_plans, baselines, settings.candidates)
    plans = {"plan": found.plan, **alternatives}
    counts = _message_counts(module, plans)
    if "xla" in baselines:  # XLA's own program: what the first call times the others against
        counts["original"] = _original_message_counts(module, baselines["xla"][0], priced)
        simulated["original"] = baselines["xla"][1]
    return CandidateRecord(
        plans,
        simulated,
        messages={label: collectives for label, (collectives, _) in counts.items()},
        message_s=charged.collective_message_s,
        workers=module.worker_count(),
        tuple_tensors={label: tensors for label, (_, tensors) in counts.items()},
        tuple_element_s=charged.tuple_all_reduce_element_s,
    )


def _moved_far(before_s: float, now_s: float) -> bool:
    """Whether a learned cost moved enough to search again: from
    nothing to something (or back), or by more than 2x. Smaller moves keep the
    cached plan, so that each further measured module does not send every
    other one back to the search."""
    if before_s <= 0 or now_s <= 0:
        return (before_s > 0) != (now_s > 0)
    return max(before_s, now_s) > 2 * min(before_s, now_s)


def _message_counts(module: HloModule, plans: dict[str, Plan]) -> dict[str, tuple[int, int]]:
    """What each plan's program runs per step: (collectives, tuple tensors)
    (`message_counts`)."""
    return {label: message_counts(build_task_graph(module, p)) for label, p in plans.items()}


def _original_message_counts(module: HloModule, xla_plan: Plan, profile) -> tuple[int, int]:
    """What XLA's own program (its fusion, its combined all-reduces: the
    `xla` baseline's plan) runs per step."""
    return message_counts(build_task_graph(module, xla_plan, sends_tuples("xla", profile)))


def learned_collective_costs(cache: PlanCache, profile, module: HloModule) -> CollectiveCosts:
    """What each collective and each tuple tensor cost inside a step on this
    machine (`profile`) with `module`'s device count, fitted to the step times
    that first calls measured here (`step_time_fit.fit_collective_costs`);
    None for a cost they cannot tell (the profile's own then holds)."""
    return fit_collective_costs(cache.step_times(machine_key(profile), module.worker_count()))


def learn_kernel_times(settings: OptimizeSettings, times_s: dict[str, float]) -> bool:
    """Store kernel times measured on this machine (structural hash -> seconds)
    in the plan cache under `settings.cluster`'s profile, for every later
    search there (`find_plan`). False when there is no cache to store them in."""
    if not settings.use_cache or not times_s:
        return False
    profile = load_profile(settings.cluster)
    return PlanCache(settings.cache_dir).add_kernel_times(machine_key(profile), times_s)


def remember_measurement(
    choice: PlanChoice, settings: OptimizeSettings, chosen: str, measured_s: dict[str, float]
) -> None:
    """Store which candidate ran fastest on this machine (`chosen`, or
    'original') and every measured time beside the plan in the cache, so that
    the next first call on this machine runs that candidate without timing the
    others again. The step times also go to the machine's table that later
    searches learn the cost of a collective from (`learned_collective_costs`)."""
    if not settings.use_cache or not choice.cache_key:
        return
    record = replace(choice.candidates, chosen=chosen, measured_s=dict(measured_s))
    cache = PlanCache(settings.cache_dir)
    cache.put_candidates(choice.cache_key, record)
    if record.workers:  # what a collective costs in a step here, for the next searches
        machine = machine_key(load_profile(settings.cluster))
        cache.add_step_times(machine, record.workers, record.step_times())


def measured_alternatives(
    top_plans: tuple[tuple[float, Plan], ...],
    baselines: dict[str, tuple[Plan, float]],
    count: int,
) -> tuple[dict[str, Plan], dict[str, float]]:
    """The plans to measure beside the search's best (`checked_rewrite`'s
    `alternatives`), and every candidate's simulated seconds by label: the
    search's next best (`top_plans`, best first, simulated seconds and plan)
    up to `count` plans in all, labelled 'candidate-2', 'candidate-3', ...; and
    the baseline with the least simulated time (`baselines`: name -> (plan,
    seconds), XLA's own program and the unfused plan left out), labelled
    'baseline:NAME'. The search's best is 'plan'."""
    alternatives: dict[str, Plan] = {}
    simulated: dict[str, float] = {}
    for rank, (seconds, plan) in enumerate(top_plans[:count], start=1):
        label = "plan" if rank == 1 else f"candidate-{rank}"
        if rank > 1:
            alternatives[label] = plan
        simulated[label] = seconds
    others = {name: entry for name, entry in baselines.items() if name not in ("xla", "none")}
    if others:
        name = min(others, key=lambda n: (others[n][1], n))
        alternatives[f"baseline:{name}"] = others[name][0]
        simulated[f"baseline:{name}"] = others[name][1]
    return alternatives, simulated
