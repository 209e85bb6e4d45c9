"""The backtracking search: legal, deterministic, never worse than where it
starts, and reachable through `disco-xla optimize`."""

from __future__ import annotations

import pytest

from disco_xla import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.backtracking import greedy_fusion_plan, search
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def test_greedy_fusion_is_legal_and_fuses(step):
    plan = greedy_fusion_plan(step)
    verify_plan(plan, step)
    assert len(plan.fusion_groups) < len(Plan.unfused(step).fusion_groups) / 2


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "cpu-local"])
def test_search_is_legal_deterministic_and_no_worse_than_its_start(step, cluster):
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    starts = [Plan.unfused(step), greedy_fusion_plan(step)]
    first = search(step, profile, cost_model, starts, OptimizeSettings(max_evaluations=120, seed=3))
    again = search(step, profile, cost_model, starts, OptimizeSettings(max_evaluations=120, seed=3))
    assert first.plan == again.plan and first.iteration_s == again.iteration_s
    verify_plan(first.plan, step)
    assert first.evaluations == 120
    assert first.iteration_s <= first.start_s
    start_times = [
        simulate(build_task_graph(step, plan), profile, cost_model).iteration_s for plan in starts
    ]
    assert first.start_s == min(start_times)
    assert (
        first.iteration_s
        == simulate(build_task_graph(step, first.plan), profile, cost_model).iteration_s
    )
    assert first.iteration_s < first.start_s  # on this step the moves do find better plans


def test_a_budget_of_zero_is_refused(step):
    profile = load_profile("cpu-local")
    with pytest.raises(DiscoInputError, match="budget"):
        search(
            step,
            profile,
            RooflineCostModel(profile),
            [Plan.unfused(step)],
            OptimizeSettings(budget_s=0),
        )


def test_the_search_keeps_its_best_distinct_plans_best_first(step):
    profile = load_profile("cpu-local")
    cost_model = RooflineCostModel(profile)
    starts = [Plan.unfused(step), greedy_fusion_plan(step)]
    result = search(
        step, profile, cost_model, starts, OptimizeSettings(max_evaluations=60, seed=3), keep=5
    )
    seconds = [s for s, _ in result.top_plans]
    assert len(result.top_plans) == 5 and seconds == sorted(seconds)
    assert result.top_plans[0] == (result.iteration_s, result.plan)
    assert len({p.to_json() for _, p in result.top_plans}) == 5
    for simulated_s, plan in result.top_plans:
        verify_plan(plan, step)
        graph = build_task_graph(step, plan)
        assert simulate(graph, profile, cost_model).iteration_s == pytest.approx(simulated_s)
    # Keeping more changes nothing in the search itself.
    sixty = OptimizeSettings(max_evaluations=60, seed=3)
    assert search(step, profile, cost_model, starts, sixty).plan == result.plan


def test_python_api_returns_a_legal_plan_and_matches_the_search(step):
    import disco_xla

    plan = disco_xla.optimize(step, cluster="a100-2x8-100g", max_evaluations=80, seed=5)
    assert isinstance(plan, disco_xla.Plan)
    verify_plan(plan, step)
    profile = load_profile("a100-2x8-100g")
    direct = search(
        step,
        profile,
        RooflineCostModel(profile),
        [Plan.unfused(step), greedy_fusion_plan(step)],
        OptimizeSettings(max_evaluations=80, seed=5),
    )
    assert plan == direct.plan
    with pytest.raises(DiscoInputError, match="unknown cost model"):
        disco_xla.optimize(step, cluster="cpu-local", cost_model="no-such-model")


def test_plans_only_split_xla_groups_and_pay_for_each_boundary(step):
    """With XLA's own fusion known, the search's plans are refinements of it (the
    rewrite can add kernel boundaries, not take XLA's away), and a profile's
    boundary cost is charged to each departing group, so a high one keeps
    XLA's groups."""
    import dataclasses

    from disco_xla.plan import departing_groups
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search import optimize
    from disco_xla.search.xla_fusion import xla_fusion_plan
    from disco_xla.simulator.cost_models import boundary_charged

    compiled = compile_module(step, NO_COMBINER)
    own = xla_fusion_plan(step, compiled).fusion_groups
    group_of = {name: number for number, group in enumerate(own) for name in group}
    profile = load_profile("cpu-local")
    roofline = RooflineCostModel(profile)
    # Unfused starts refine XLA's groups; greedy fusion does not, and is skipped.
    two_hundred = OptimizeSettings(max_evaluations=200)
    starts = [Plan.unfused(step), greedy_fusion_plan(step)]
    found = search(step, profile, roofline, starts, two_hundred, within_groups=own)
    assert all(len({group_of[n] for n in group}) == 1 for group in found.plan.fusion_groups)
    free = search(step, profile, roofline, starts, two_hundred)
    assert any(len({group_of[n] for n in group}) > 1 for group in free.plan.fusion_groups)

    # The charge: exactly fusion_boundary_s for each departing group.
    costly = dataclasses.replace(profile, fusion_boundary_s=1e-3)
    charged = boundary_charged(RooflineCostModel(costly), costly, own)
    unfused = Plan.unfused(step)
    departing = departing_groups(step, unfused, own)
    plain = simulate(build_task_graph(step, unfused), costly, roofline)
    with_charge = simulate(build_task_graph(step, unfused), costly, charged)
    # A kernel time like any other: the profile's kernel_time_scale applies.
    expected_s = 1e-3 * len(departing) * costly.kernel_time_scale
    assert with_charge.compute_s - plain.compute_s == pytest.approx(expected_s)
    assert boundary_charged(roofline, profile, own) is roofline  # 0: nothing charged
    kept = search(
        step,
        costly,
        charged,
        [unfused, xla_fusion_plan(step, compiled)],
        two_hundred,
        within_groups=own,
    )
    assert departing_groups(step, kept.plan, own) == []
    plan = optimize(step, "cpu-local", max_evaluations=200, compiled=compiled)
    assert all(len({group_of[n] for n in group}) == 1 for group in plan.fusion_groups)
