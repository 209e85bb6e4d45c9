"""From a captured module to a checked, rewritten module: what every entry point
(`disco_xla.jit`, `disco_xla.tf_function`, the env hook, the CLI) shares.

`find_plan` reads the plan cache or searches (and fills the cache);
`rewrite` applies the plan and verifies the result compiles to the plan's
all-reduces. Both take one `OptimizeSettings` value.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.plan_cache import PlanCache, cache_key


@dataclass(frozen=True)
class OptimizeSettings:
    """Everything that decides which plan a module gets."""

    cluster: str = "cpu-local"  # a profile name or a YAML path
    budget_s: float = 30.0  # wall-clock search budget
    max_evaluations: int = 300  # plan evaluations; with the seed, what makes plans reproducible
    alpha: float = 1.05
    seed: int = 0
    cost_model: str = "roofline"
    cache_dir: str | None = None  # None: ~/.cache/disco_xla
    use_cache: bool = True
    check_speed: bool = True  # time the rewritten step on first call; keep the faster

    def search_options(self) -> dict:
        """The options that change the search result (the cache key's part)."""
        options = asdict(self)
        for local_only in ("cluster", "cache_dir", "use_cache", "check_speed"):
            options.pop(local_only)
        return options


@dataclass(frozen=True)
class PlanChoice:
    plan: Plan
    from_cache: bool
    seconds: float  # spent finding it (cache lookup or search)


def prepared(module: HloModule) -> HloModule:
    """The module plans are made for: `module` with its `call`s inlined, as XLA
    inlines them before fusion (a copy; `module` is left as it is)."""
    from disco_xla.hlo_passes.inline_calls import inline_calls

    copy = HloModule.from_bytes(module.to_bytes(), module.source, module.file_format)
    inline_calls(copy)
    return copy


def has_cross_device_all_reduces(module: HloModule) -> bool:
    """Whether the module is one we optimise: it reduces gradients across devices."""
    return bool(module.gradient_all_reduces)


def find_plan(module: HloModule, settings: OptimizeSettings) -> PlanChoice:
    """The plan for `module`: from the cache when there, else searched and cached."""
    from disco_xla.search import optimize
    from disco_xla.simulator.profiles import load_profile

    started = time.perf_counter()
    profile = load_profile(settings.cluster)
    cache = PlanCache(settings.cache_dir) if settings.use_cache else None
    key = cache_key(module.fingerprint, profile, settings.search_options())
    if cache is not None:
        plan = cache.get(key)
        if plan is not None and plan.fingerprint == module.fingerprint:
            return PlanChoice(plan, True, time.perf_counter() - started)
    try:  # XLA's own fusion: the search then starts from every baseline too
        from disco_xla.runtime.apply import NO_COMBINER
        from disco_xla.runtime.xla_runner import compile_module

        compiled = compile_module(module, NO_COMBINER)
    except Exception:  # noqa: BLE001 - the search still runs, from its other starts
        compiled = None
    plan = optimize(
        module,
        compiled=compiled,
        cluster=settings.cluster,
        budget_s=settings.budget_s,
        max_evaluations=settings.max_evaluations,
        alpha=settings.alpha,
        seed=settings.seed,
        cost_model=settings.cost_model,
    )
    if cache is not None:
        cache.put(key, plan)
    return PlanChoice(plan, False, time.perf_counter() - started)


def rewrite(module: HloModule, plan: Plan, fusion: bool = True, check: bool = True) -> HloModule:
    """The module rewritten to run `plan` (only its buckets with `fusion=False`),
    verified to compile to its buckets unless `check=False` (then the caller
    compiles it and calls `runtime.apply.check_all_reduces`)."""
    from disco_xla.runtime.apply import apply_plan

    source = f"<plan for {module.name}>"
    return apply_plan(module, plan, plan_source=source, fusion=fusion, check=check)
