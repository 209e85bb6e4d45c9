"""What reports print of a `pipeline.PlanComparison`: the figures of
`disco-xla optimize --json` (`comparison_summary`) and the human table
(`format_table`)."""

from __future__ import annotations

from disco_xla.plan import DIMENSIONS
from disco_xla.search.pipeline import ROWS, PlanComparison

# The dimensions the table shows as columns (kernels, buckets).
COLUMNS = ("fusion_groups", "all_reduce_buckets")


def comparison_summary(comparison: PlanComparison) -> dict:
    """The figures `disco-xla optimize --json` prints (without file paths)."""
    results = comparison.results
    found = results["found"]
    xla_s = results["xla"].iteration_s
    return {
        "plan_s": found.iteration_s,
        "baselines": {
            name: results[name].iteration_s for name in ROWS if name != "found" and name in results
        },
        "ideal_s": found.ideal_s,
        "speedup_vs_xla": xla_s / found.iteration_s,
        "t_over_ideal": found.t_over_ideal,
        "exposed_comm_s": found.exposed_comm_s,
        "buckets": found.buckets,
        # Each other dimension's count; fusion and all-reduce buckets are the
        # kernels and buckets columns.
        **{
            d.field: len(getattr(comparison.found.plan, d.field))
            for d in DIMENSIONS
            if d.field not in COLUMNS
        },
        "kernels": found.kernels,
        "fusion_source": comparison.fusion.source if comparison.fusion else None,
        "fusion": comparison.fusion.note if comparison.fusion else None,
        "evaluations": comparison.found.evaluations,
        "search_s": comparison.found.search_s,
        # The plan a checking entry point would run (`search.ablation`).
        "realisable_s": comparison.realisable[1] if comparison.realisable else None,
        # The found plan with each dimension as `xla-tuned` has it.
        "without_dimension_s": dict(comparison.without_dimension),
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
    for dimension in DIMENSIONS:  # each dimension's line, where it has one
        line = dimension.describe(comparison.found.plan)
        if line:
            lines.append(f"found plan: {line}")
    lines += _realisable_lines(comparison)
    return "\n".join(lines)


def _realisable_lines(comparison: PlanComparison) -> list[str]:
    """The realisable plan, and the found plan without each dimension."""
    found_s = comparison.results["found"].iteration_s
    lines = []
    if comparison.realisable and comparison.realisable[0] != comparison.found.plan:
        seconds = comparison.realisable[1]
        lines.append(
            f"realisable plan (XLA's fusion, which keeps results): {seconds * 1e3:.3f} ms, "
            f"{seconds / found_s:.3f}x the found plan"
        )
    for dimension, seconds in comparison.without_dimension.items():
        cost = "not a valid plan" if seconds is None else f"{seconds / found_s:.3f}x"
        lines.append(f"found plan with {dimension} as xla-tuned chose: {cost}")
    return lines
