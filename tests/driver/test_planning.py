"""`planning`: the plan from the cache or the search, and what `disco-xla
optimize -o MODULE` measures beside the search's first choice."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.driver.planning import measured_alternatives
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
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
    from disco_xla.driver.plan_cache import PlanCache, machine_key
    from disco_xla.driver.planning import find_plan, learn_kernel_times
    from disco_xla.runtime.xla_runner import compile_separately
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    step = HloModule.from_bytes(captured["jax_pmap_step"][0], "step")
    settings = OptimizeSettings(max_evaluations=40, budget_s=1e9, cache_dir=str(tmp_path))
    first = find_plan(step, settings, compile_separately)
    assert not first.from_cache and find_plan(step, settings, compile_separately).from_cache
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
    second = find_plan(
        step, settings, compile_separately
    )  # a new search: the measured times are new
    assert not second.from_cache and second.plan != first.plan
    kernels = build_task_graph(step, second.plan).kernels
    assert not {k.structural_hash for k in kernels} & set(slow)
    # On another machine the measurement is not read: the first plan again.
    elsewhere = OptimizeSettings(
        cluster="a100-2x8-100g", max_evaluations=40, budget_s=1e9, cache_dir=str(tmp_path)
    )
    assert (
        find_plan(step, elsewhere, compile_separately).plan
        == find_plan(
            step,
            OptimizeSettings(
                cluster="a100-2x8-100g", max_evaluations=40, budget_s=1e9, use_cache=False
            ),
            compile_separately,
        ).plan
    )


SLOW_NETWORK = """
name: slow-network
execution: gpu-streams
device:
  name: a device whose network is slow beside its compute
  peak_flops: {f32: 1.0e+9}
  memory_bandwidth_bytes_per_s: 1.0e+9
  kernel_launch_s: 1.0e-6
topology: {devices_per_node: 4, nodes: 1}
links:
  intra_node: {bandwidth_bytes_per_s: 1.0e+6, latency_s: 0.0}
  inter_node: {bandwidth_bytes_per_s: 1.0e+6, latency_s: 0.0}
all_reduce: ring
"""


def test_step_times_measured_on_a_machine_price_its_collectives_in_the_next_search(
    captured, tmp_path
):
    """First calls store the step times they measured; the next search on that
    machine, for a step on as many devices, fits what each collective's message
    costs there and plans with it: with messages measured dear, the plan sends
    fewer of them. Other device counts do not read them."""
    from disco_xla.driver.plan_cache import PlanCache, machine_key
    from disco_xla.driver.planning import find_plan, learned_collective_costs
    from disco_xla.runtime.xla_runner import compile_separately
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile
    from disco_xla.simulator.step_time_fit import StepTime, message_counts

    def learned_message_s(cache, profile, step):
        return learned_collective_costs(cache, profile, step).message_s

    def messages_per_step(graph):
        return message_counts(graph)[0]

    step = HloModule.from_bytes(captured["jax_pmap_step"][0], "step")
    # A network slow beside the compute, with no latency: sending each gradient
    # as soon as it is ready pays, so the first plan sends one message each.
    (tmp_path / "slow.yaml").write_text(SLOW_NETWORK)
    settings = OptimizeSettings(
        cluster=str(tmp_path / "slow.yaml"),
        max_evaluations=60,
        budget_s=1e9,
        cache_dir=str(tmp_path),
    )
    first = find_plan(step, settings, compile_separately)
    assert first.candidates.message_s == 0.0
    assert first.candidates.messages["plan"] == messages_per_step(
        build_task_graph(step, first.plan)
    )
    workers = first.candidates.workers
    counts = step.device_counts()
    assert workers == counts["num_replicas"] * counts["num_partitions"] >= 2
    # Another module measured on this machine: each message cost it 20 ms more
    # than simulated (its programs sent 1, 10 and 40).
    profile = load_profile(settings.cluster)
    cache = PlanCache(tmp_path)
    measured = [StepTime("other", f"p{n}", n, 0.010, 1.5 * (0.010 + 0.02 * n)) for n in (1, 10, 40)]
    assert cache.add_step_times(machine_key(profile), workers, measured)
    assert learned_message_s(cache, profile, step) == pytest.approx(0.02, rel=0.13)
    second = find_plan(step, settings, compile_separately)
    assert not second.from_cache and second.cache_key == first.cache_key
    assert second.candidates.message_s == learned_message_s(cache, profile, step)
    sent = [messages_per_step(build_task_graph(step, c.plan)) for c in (first, second)]
    assert sent[0] > 2 and sent[1] < sent[0], sent
    assert find_plan(
        step, settings, compile_separately
    ).from_cache  # learned once: the plan stays cached
    # A little more learned (within 2x) keeps it cached too.
    closer = [StepTime("near", f"p{n}", n, 0.010, 1.5 * (0.010 + 0.03 * n)) for n in (1, 10, 40)]
    assert cache.add_step_times(machine_key(profile), workers, closer)
    learned = learned_message_s(cache, profile, step)
    assert learned != second.candidates.message_s
    assert find_plan(step, settings, compile_separately).from_cache
    # Times measured with another device count are not this step's.
    dearer = [
        dataclasses.replace(t, module="third", measured_s=t.measured_s * t.messages)
        for t in measured
    ]
    assert cache.add_step_times(machine_key(profile), workers * 2, dearer)
    assert learned_message_s(cache, profile, step) == learned
