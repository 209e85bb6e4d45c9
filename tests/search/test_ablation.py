"""What each plan dimension contributes (leave-one-out against `xla-tuned`) and
the realisable plan (the found plan over XLA's own fusion, which keeps
results), on plans by hand and through the planning pipeline on the tiny Llama
FSDP step priced on an H100 node."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.plan import Plan, verify_plan
from disco_xla.search.ablation import (
    DIMENSIONS,
    departs_from,
    leave_one_out,
    plan_fields_by_dimension,
    realisable_plan,
)

XLA = Plan(
    "m",
    "f",
    fusion_groups=(("a", "b"), ("c",)),
    all_reduce_buckets=(("g1", "g2"),),
    all_gather_buckets=(("w1",), ("w2",)),
)


def test_every_plan_field_but_its_identity_belongs_to_one_dimension():
    owners = plan_fields_by_dimension()
    assert all(owners.values()), [name for name, dim in owners.items() if not dim]
    claimed = [name for names in DIMENSIONS.values() for name in names]
    assert sorted(claimed) == sorted(owners)  # each field once


def test_the_realisable_plan_keeps_xlas_fusion_and_every_other_choice():
    found = dataclasses.replace(
        XLA,
        fusion_groups=(("a",), ("b",), ("c",)),
        all_reduce_buckets=(("g1",), ("g2",)),
        prefetched_all_gathers=("w2",),
    )
    kept = realisable_plan(found, XLA)
    assert kept.fusion_groups == XLA.fusion_groups
    assert kept.all_reduce_buckets == found.all_reduce_buckets
    assert kept.prefetched_all_gathers == ("w2",)
    # The same groups in another order are XLA's fusion: the plan is kept whole.
    reordered = dataclasses.replace(found, fusion_groups=(("c",), ("b", "a")))
    assert realisable_plan(reordered, XLA) is reordered


def test_leave_one_out_prices_each_departing_dimension_alone():
    found = dataclasses.replace(
        XLA, all_reduce_buckets=(("g1",), ("g2",)), chunked_collectives=(("g2", 2),)
    )
    priced = []

    def price(plan: Plan) -> float:
        priced.append(plan)
        return float("inf") if plan.all_reduce_buckets == XLA.all_reduce_buckets else 2.0

    ablated = leave_one_out(found, XLA, price)
    assert ablated == {"all-reduce buckets": None, "chunks": 2.0}
    assert [departs_from(p, found, "all-reduce buckets") for p in priced] == [True, False]
    assert priced[1].chunked_collectives == ()


@pytest.fixture(scope="module")
def comparison(fsdp_step):
    from disco_xla.driver.planning import prepared
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search.fusion_source import compiled_fusion
    from disco_xla.search.pipeline import Pricing, plan_module
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.cost_models import make_cost_model
    from disco_xla.simulator.profiles import load_profile

    profile = dataclasses.replace(load_profile("h100-32x8-ib400"), nodes=1)
    module = prepared(fsdp_step)
    fusion = compiled_fusion(module, compile_module(module, NO_COMBINER))
    settings = OptimizeSettings(cluster="h100-32x8-ib400", max_evaluations=60)
    prices = Pricing(profile, make_cost_model("auto", profile))
    return module, plan_module(module, settings, prices, fusion, ablations=True)


def test_the_realisable_plan_is_valid_keeps_xlas_fusion_and_beats_each_plan_that_does(
    comparison,
):
    module, result = comparison
    plan, seconds = result.realisable
    verify_plan(plan, module)
    xla_fusion = result.baselines["xla-nocombine"].plan
    assert not departs_from(plan, xla_fusion, "fusion")
    assert seconds <= result.results["bucketing-only"].iteration_s
    for name, (other, other_s) in result.baseline_plans.items():
        if name != "xla" and not departs_from(other, xla_fusion, "fusion"):
            assert seconds <= other_s, name
    if not departs_from(result.found.plan, xla_fusion, "fusion"):
        assert seconds <= result.results["found"].iteration_s


def test_the_ablation_names_each_dimension_the_found_plan_changed_against_xla_tuned(
    comparison,
):
    _, result = comparison
    found, tuned = result.found.plan, result.baselines["xla-tuned"].plan
    departed = {d for d in DIMENSIONS if departs_from(found, tuned, d)}
    assert set(result.without_dimension) == departed
    assert departed  # the tiny FSDP step's found plan is not xla-tuned's
    for dimension, seconds in result.without_dimension.items():
        assert seconds is None or seconds > 0, dimension
