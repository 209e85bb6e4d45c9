"""From a captured module to a checked, rewritten module: what every entry point
(`disco_xla.jit`, `disco_xla.tf_function`, the env hook, the CLI) shares.

`find_plan` reads the plan cache or searches (and fills the cache);
`rewrite` applies the plan and verifies the result compiles to the plan's
all-reduces. Both take one `OptimizeSettings` value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.plan_cache import (
    CandidateRecord,
    PlanCache,
    cache_key,
    machine_key,
    times_digest,
)
from disco_xla.settings import OptimizeSettings

if TYPE_CHECKING:
    from disco_xla.simulator.step_time_fit import CollectiveCosts


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
    inlines them before fusion (a copy; `module` is left as it is)."""
    from disco_xla.hlo_passes.inline_calls import InlineCalls

    copy = HloModule.from_bytes(module.to_bytes(), module.source, module.file_format)
    InlineCalls().run(copy)
    return copy


def has_cross_device_all_reduces(module: HloModule) -> bool:
    """Whether the module is one we optimise: it reduces gradients across devices."""
    return bool(module.gradient_all_reduces)


def find_plan(module: HloModule, settings: OptimizeSettings) -> PlanChoice:
    """The plan for `module`, and the candidates to measure beside it
    (`measured_alternatives`): from the cache when there, else searched and
    cached. The search reads the kernel times measured on this machine
    (`learn_kernel_times`) first, the settings' cost model for other kernels,
    and prices each collective and each tuple tensor at what the step times
    measured on this machine before imply (`learned_collective_costs`). A
    cached plan found with costs far from today's is searched again."""
    from disco_xla.search import optimize_with_candidates
    from disco_xla.simulator.profiles import load_profile

    started = time.perf_counter()
    profile = load_profile(settings.cluster)
    cache = PlanCache(settings.cache_dir) if settings.use_cache else None
    # Kernel times measured on this machine before: the search trusts them over
    # any cost model, and a new measurement makes a new search.
    measured_s = cache.kernel_times(machine_key(profile)) if cache is not None else {}
    learned = learned_collective_costs(cache, profile, module) if cache is not None else None
    priced = profile.for_workers(module.worker_count())  # as measured at the module's count
    charged = learned.applied_to(priced) if learned is not None else priced
    message_s, tuple_element_s = charged.collective_message_s, charged.tuple_all_reduce_element_s
    options = settings.search_options()
    if measured_s:
        options["measured_kernels"] = times_digest(measured_s)
    key = cache_key(module.fingerprint, profile, options)
    if cache is not None:
        plan = cache.get(key)
        if plan is not None and plan.fingerprint == module.fingerprint:
            record = cache.get_candidates(key) or CandidateRecord({"plan": plan})
            # Searched again once what a collective costs here has moved far
            # from what the plan was found with (the first measured run teaches it).
            if not (
                _moved_far(record.message_s, message_s)
                or _moved_far(record.tuple_element_s, tuple_element_s)
            ):
                return PlanChoice(plan, True, time.perf_counter() - started, record, key)
    try:  # XLA's own fusion: the search then starts from every baseline too
        from disco_xla.runtime.apply import NO_COMBINER
        from disco_xla.runtime.xla_runner import compile_module

        compiled = compile_module(module, NO_COMBINER)
    except Exception:  # noqa: BLE001 - the search still runs, from its other starts
        compiled = None
    found, baselines = optimize_with_candidates(
        module,
        compiled=compiled,
        cluster=settings.cluster,
        budget_s=settings.budget_s,
        max_evaluations=settings.max_evaluations,
        alpha=settings.alpha,
        seed=settings.seed,
        cost_model=settings.cost_model,
        keep=settings.candidates,
        measured_s=measured_s,
        learned=learned,
    )
    top_plans = found.top_plans or ((found.iteration_s, found.plan),)
    alternatives, simulated = measured_alternatives(top_plans, baselines, settings.candidates)
    plans = {"plan": found.plan, **alternatives}
    counts = _message_counts(module, plans)
    if "xla" in baselines:  # XLA's own program: what the first call times the others against
        counts["original"] = _original_message_counts(module, baselines["xla"][0], priced)
        simulated["original"] = baselines["xla"][1]
    record = CandidateRecord(
        plans,
        simulated,
        messages={label: collectives for label, (collectives, _) in counts.items()},
        message_s=message_s,
        workers=module.worker_count(),
        tuple_tensors={label: tensors for label, (_, tensors) in counts.items()},
        tuple_element_s=tuple_element_s,
    )
    if cache is not None:
        cache.put(key, found.plan)
        cache.put_candidates(key, record)
    return PlanChoice(found.plan, False, time.perf_counter() - started, record, key)


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
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.step_time_fit import message_counts

    return {label: message_counts(build_task_graph(module, p)) for label, p in plans.items()}


def _original_message_counts(module: HloModule, xla_plan: Plan, profile) -> tuple[int, int]:
    """What XLA's own program (its fusion, its combined all-reduces: the
    `xla` baseline's plan) runs per step."""
    from disco_xla.search.baselines import sends_tuples
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.step_time_fit import message_counts

    return message_counts(build_task_graph(module, xla_plan, sends_tuples("xla", profile)))


def learned_collective_costs(cache: PlanCache, profile, module: HloModule) -> CollectiveCosts:
    """What each collective and each tuple tensor cost inside a step on this
    machine (`profile`) with `module`'s device count, fitted to the step times
    that first calls measured here (`step_time_fit.fit_collective_costs`);
    None for a cost they cannot tell (the profile's own then holds)."""
    from disco_xla.simulator.step_time_fit import fit_collective_costs

    return fit_collective_costs(cache.step_times(machine_key(profile), module.worker_count()))


def learn_kernel_times(settings: OptimizeSettings, times_s: dict[str, float]) -> bool:
    """Store kernel times measured on this machine (structural hash -> seconds)
    in the plan cache under `settings.cluster`'s profile, for every later
    search there (`find_plan`). False when there is no cache to store them in."""
    from disco_xla.simulator.profiles import load_profile

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
    from dataclasses import replace

    from disco_xla.simulator.profiles import load_profile

    if not settings.use_cache or not choice.cache_key:
        return
    record = replace(choice.candidates, chosen=chosen, measured_s=dict(measured_s))
    cache = PlanCache(settings.cache_dir)
    cache.put_candidates(choice.cache_key, record)
    if record.workers:  # what a collective costs in a step here, for the next searches
        machine = machine_key(load_profile(settings.cluster))
        cache.add_step_times(machine, record.workers, record.step_times())


# XLA's own groups of the modules seen last, by fingerprint: every candidate of
# one module is rewritten against the same compile.
_OWN_GROUPS: dict[str, tuple[tuple[str, ...], ...] | None] = {}
_OWN_GROUPS_KEPT = 8


def xla_own_groups(module: HloModule) -> tuple[tuple[str, ...], ...] | None:
    """The fusion groups XLA forms by itself on `module` (its compiled kernels
    mapped back onto it; combiner off, as every baseline), or None when the
    module does not compile here."""
    from disco_xla.runtime.apply import NO_COMBINER
    from disco_xla.runtime.xla_runner import compile_module
    from disco_xla.search.xla_fusion import xla_fusion_plan

    if module.fingerprint in _OWN_GROUPS:
        return _OWN_GROUPS[module.fingerprint]
    try:
        groups = xla_fusion_plan(module, compile_module(module, NO_COMBINER)).fusion_groups
    except Exception:  # noqa: BLE001 - then every departing group is outlined
        groups = None
    if len(_OWN_GROUPS) >= _OWN_GROUPS_KEPT:
        _OWN_GROUPS.pop(next(iter(_OWN_GROUPS)))
    _OWN_GROUPS[module.fingerprint] = groups
    return groups


def rewrite(
    module: HloModule,
    plan: Plan,
    fusion: bool = True,
    check: bool = True,
    source: str | None = None,
) -> HloModule:
    """The module rewritten to run `plan` (only its buckets with `fusion=False`),
    verified to compile to its buckets unless `check=False` (then the caller
    compiles it and calls `runtime.apply.check_all_reduces`). Only the groups
    that depart from XLA's own fusion get a boundary."""
    from disco_xla.runtime.apply import apply_plan

    source = source or f"<plan for {module.name}>"
    left_to_xla = xla_own_groups(module) if fusion else None
    return apply_plan(
        module, plan, plan_source=source, fusion=fusion, check=check, left_to_xla=left_to_xla
    )


# A module that needs more devices than this is not run here to check it.
MAX_CHECK_DEVICES = 16


@dataclass(frozen=True)
class CheckedRewrite:
    """What a safe rewrite wrote, and the measurements that chose it."""

    module: HloModule  # the program to write
    written: (
        str  # 'plan', 'buckets' (the plan's buckets alone), an alternative's label, or 'original'
    )
    why: str  # one line: why this one
    original_s: float | None  # median step times, paired (None when not measured)
    written_s: float | None
    equal: bool | None  # the written program's outputs against the original's
    # label -> {'seconds', 'equal', 'max_rel_diff'} (and 'simulated_s' where
    # known), {'error'}, or {'same_as': the label of the same program}
    candidates: dict
    plan: Plan | None = None  # the plan written (whole, or its buckets); None: the original

    def measured(self) -> dict | None:
        """The `measured` object of the CLI's JSON (None when not checked)."""
        if self.original_s is None:
            return None
        return {
            "original_s": self.original_s,
            "written_s": self.written_s,
            "equal": self.equal,
            "written": self.written,
            "candidates": self.candidates,
        }


def checked_rewrite(
    module: HloModule,
    plan: Plan,
    source: str,
    buckets_only: bool = False,
    check: bool = True,
    rounds: int = 5,
    alternatives: dict[str, Plan] | None = None,
    simulated_s: dict[str, float] | None = None,
    budget_s: float | None = None,
) -> CheckedRewrite:
    """The best program for `plan` that is never slower than `module` nor
    computes differently: the plan (fusion boundaries and buckets), its buckets
    alone, or one of the `alternatives` (label -> plan: the search's next best
    plans, the best baseline; each rewritten whole, or its buckets alone with
    `buckets_only`), else `module` unchanged. Each candidate is run against the
    original on the same random inputs on this machine's CPU devices, timed in
    paired rotating rounds (their wall time capped by `budget_s`); the fastest
    one that is equal and faster than the original is written (timed against
    XLA's own program of `module`, all-reduce combiner on). The report gives each
    candidate's measured time, and its simulated time from `simulated_s` (by
    label) where known. `check=False` writes the plan (or its buckets)
    unmeasured, for a module meant for another machine. Raises DiscoInputError
    when the module cannot be checked here, or the plan does not fit it."""
    from disco_xla.errors import DiscoInputError
    from disco_xla.runtime.apply import time_candidates
    from disco_xla.runtime.xla_runner import devices_needed

    kinds = ("buckets",) if buckets_only else ("plan", "buckets")
    if not check:
        return _unchecked_rewrite(module, plan, kinds[0], source)
    devices = devices_needed(module)
    if devices > MAX_CHECK_DEVICES:
        raise DiscoInputError(
            module.source,
            f"the module runs on {devices} devices; this machine checks rewrites on at most "
            f"{MAX_CHECK_DEVICES} (pass --no-check to write the plan unchecked)",
        )
    wanted = {kind: (plan, kind == "plan") for kind in kinds}
    for label, other in (alternatives or {}).items():
        wanted[label] = (other, not buckets_only)
    candidates, report = _distinct_rewrites(module, wanted, kinds, source)
    # Against XLA's own program (combiner on): what the user would run otherwise.
    try:
        original_s, results = time_candidates(
            module, candidates, devices, rounds, 0, (), budget_s=budget_s
        )
    except Exception as error:  # noqa: BLE001 - XLA's errors: the module does not run here
        message = " ".join(str(error).split())[:300]
        raise DiscoInputError(
            module.source,
            f"cannot run the module here to check the rewrite ({type(error).__name__}: "
            f"{message}); pass --no-check to write the plan unchecked",
        ) from None
    _add_results(report, results, simulated_s or {})
    passing = [
        kind
        for kind in results
        if results[kind].outputs.equal and results[kind].seconds < original_s
    ]
    if passing:
        best = min(passing, key=lambda kind: results[kind].seconds)
        why = f"{original_s / results[best].seconds:.2f}x the original's speed, outputs equal"
        if best != kinds[0]:
            why += f"; the {kinds[0]} was {_refusal(report[kinds[0]], original_s)}"
        return CheckedRewrite(
            candidates[best],
            best,
            why,
            original_s,
            results[best].seconds,
            True,
            report,
            wanted[best][0],
        )
    refusals = "; ".join(f"the {kind} {_refusal(report[kind], original_s)}" for kind in report)
    return CheckedRewrite(module, "original", refusals, original_s, original_s, True, report)


def _unchecked_rewrite(module: HloModule, plan: Plan, kind: str, source: str) -> CheckedRewrite:
    """The plan (or its buckets alone, `kind`) written without running it."""
    from disco_xla.errors import DiscoInputError
    from disco_xla.runtime.apply import RewriteError

    try:
        written = rewrite(module, plan, fusion=kind == "plan", source=source)
    except RewriteError as error:
        raise DiscoInputError(source, str(error)) from None
    return CheckedRewrite(written, kind, "not checked (--no-check)", None, None, None, {}, plan)


def _add_results(report: dict[str, dict], results: dict, simulated_s: dict[str, float]) -> None:
    """Each measured candidate's entry in the report, and the simulated
    seconds of every candidate that has an entry."""
    for kind, result in results.items():
        report[kind] = {
            "seconds": result.seconds,
            "equal": result.outputs.equal,
            "max_rel_diff": result.outputs.max_rel_diff,
        }
    for label, seconds in simulated_s.items():
        if label in report:
            report[label]["simulated_s"] = seconds


def _distinct_rewrites(
    module: HloModule, wanted: dict[str, tuple[Plan, bool]], kinds: tuple[str, ...], source: str
) -> tuple[dict[str, HloModule], dict[str, dict]]:
    """Each wanted candidate (label -> (plan, fusion)) rewritten, leaving out
    those that make the same program as one before them; and the report's
    entries of those that failed ({'error'}) or were left out ({'same_as'};
    not for the plan's own `kinds`, which the report describes otherwise)."""
    from disco_xla.runtime.apply import RewriteError

    candidates: dict[str, HloModule] = {}
    report: dict[str, dict] = {}
    for label, (each, fusion) in wanted.items():
        try:
            candidate = rewrite(module, each, fusion=fusion, source=source)
        except RewriteError as error:
            report[label] = {"error": str(error)}
            continue
        same = [c for c, m in candidates.items() if m.fingerprint == candidate.fingerprint]
        if same and label not in kinds:
            report[label] = {"same_as": same[0]}
        if same:
            continue  # e.g. no fusion departure: the plan is its buckets
        candidates[label] = candidate
    return candidates, report


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


def _refusal(entry: dict, original_s: float) -> str:
    """Why a measured candidate was not written, in a few words."""
    if "error" in entry:
        return f"failed ({entry['error']})"
    if "same_as" in entry:
        return f"the same program as the {entry['same_as']}"
    if not entry["equal"]:
        return f"computed differently (max relative difference {entry['max_rel_diff']:.2g})"
    if entry["seconds"] >= original_s:
        return f"slower ({original_s / entry['seconds']:.2f}x the original's speed)"
    return "slower than the program written"
