"""What `disco-xla optimize -o MODULE` measures beside the search's first choice."""

from __future__ import annotations

import pytest

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.planning import measured_alternatives
from disco_xla.search.backtracking import greedy_fusion_plan


@pytest.fixture(scope="module")
def plans(captured):
    step = HloModule.from_bytes(captured["jax_pmap_step"][0], "step")
    unfused, greedy = Plan.unfused(step), greedy_fusion_plan(step)
    one_bucket = Plan(
        step.name,
        step.fingerprint,
        greedy.fusion_groups,
        (tuple(a.name for a in step.gradient_all_reduces),),
    )
    return unfused, greedy, one_bucket


def test_the_next_best_plans_and_the_best_baseline_are_measured(plans):
    unfused, greedy, one_bucket = plans
    top = ((1.0, greedy), (1.5, one_bucket), (2.0, unfused))
    baselines = {
        "xla": (one_bucket, 0.5),  # XLA's own program: the reference, not a candidate
        "none": (unfused, 0.1),  # no fusion: never measured as a baseline
        "ddp": (one_bucket, 3.0),
        "horovod": (greedy, 2.5),
    }
    alternatives, simulated = measured_alternatives(top, baselines, count=2)
    assert alternatives == {"candidate-2": one_bucket, "baseline:horovod": greedy}
    assert simulated == {"plan": 1.0, "candidate-2": 1.5, "baseline:horovod": 2.5}
    # More candidates than the search kept: all it kept.
    alternatives, _ = measured_alternatives(top, {}, count=10)
    assert list(alternatives) == ["candidate-2", "candidate-3"]


def test_kernel_times_measured_on_a_machine_steer_its_next_search(captured, tmp_path):
    """The plan cache keeps kernel times per machine; the next search on that
    machine trusts them over the cost model (which still prices every kernel
    not measured), so a plan whose kernels were measured slow is replaced."""
    from disco_xla.plan_cache import PlanCache, machine_key
    from disco_xla.planning import find_plan, learn_kernel_times
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    step = HloModule.from_bytes(captured["jax_pmap_step"][0], "step")
    settings = OptimizeSettings(max_evaluations=40, budget_s=1e9, cache_dir=str(tmp_path))
    first = find_plan(step, settings)
    assert not first.from_cache and find_plan(step, settings).from_cache
    # Measured: every kernel of the first plan that fuses several instructions
    # takes a second, far beyond what the roofline gives it.
    fused = [k for k in build_task_graph(step, first.plan).kernels if len(k.instructions) > 1]
    assert fused
    slow = {kernel.structural_hash: 1.0 for kernel in fused}
    assert learn_kernel_times(settings, slow)
    machine = machine_key(load_profile(settings.cluster))
    assert PlanCache(tmp_path).kernel_times(machine) == slow
    learn_kernel_times(settings, {k: 3.0 for k in slow})  # measured again: the mean is kept
    assert PlanCache(tmp_path).kernel_times(machine) == {k: 2.0 for k in slow}
    second = find_plan(step, settings)  # a new search: the measured times are new
    assert not second.from_cache and second.plan != first.plan
    kernels = build_task_graph(step, second.plan).kernels
    assert not {k.structural_hash for k in kernels} & set(slow)
    # On another machine the measurement is not read: the first plan again.
    elsewhere = OptimizeSettings(
        cluster="a100-2x8-100g", max_evaluations=40, budget_s=1e9, cache_dir=str(tmp_path)
    )
    assert (
        find_plan(step, elsewhere).plan
        == find_plan(
            step,
            OptimizeSettings(
                cluster="a100-2x8-100g", max_evaluations=40, budget_s=1e9, use_cache=False
            ),
        ).plan
    )
