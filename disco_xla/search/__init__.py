"""Search over the plan's dimensions (op-fusion groups, all-reduce and
reduce-scatter buckets, all-gather buckets, all-gathers issued a loop trip
ahead, collectives in chunks), and the baselines.

`optimize(module, cluster=...)` is the Python entry point. `pipeline` is the
one planning path behind every entry point (pricing, baselines, ablations, the
search); `backtracking` holds the search over fusion and buckets, and
`all_gather_buckets`, `prefetch` and `chunking` the sweeps of the other
dimensions after it; `baselines` builds every baseline as a plan (with `baseline_rules`,
`combiners`, `expert_flags` and `windowed_einsum` for what XLA and an expert
do), `xla_flags` the flags closest to a plan, `fusion_source` and
`xla_fusion` map XLA's compiled kernels back onto the captured module,
`ablation` gives what each dimension adds and the realisable plan, and
`summary` what reports print of a comparison.
"""

from __future__ import annotations

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.search.fusion_source import compiled_fusion
from disco_xla.search.pipeline import plan_module, pricing
from disco_xla.settings import DEFAULTS, OptimizeSettings, settings_given


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
    (`runtime.xla_runner.compile_module(module, NO_COMBINER)`). When given, the
    search also starts from every baseline (XLA's fusion mapped onto `module`,
    with each baseline's buckets), so the plan is never slower than any of them,
    and its fusion only splits XLA's groups (what the rewrite can realise);
    without it, from no fusion and a greedy XLA-like fusion."""
    settings = OptimizeSettings(**settings_given(locals()))
    prices = pricing(module, settings, table)
    fusion = compiled_fusion(module, compiled) if compiled is not None else None
    return plan_module(module, settings, prices, fusion).found.plan
