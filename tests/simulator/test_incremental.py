"""Incremental re-simulation gives exactly the full simulation's time, and the task
graph runs a computation called from several places once per call."""

from __future__ import annotations

import dataclasses
import random

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.backtracking import _bucket_moves, greedy_fusion_plan
from disco_xla.search.moves import Fuse, Split
from disco_xla.simulator.comm import all_reduce_s
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import PS_PER_S, graph_iteration_ps, simulate, to_ps
from disco_xla.simulator.incremental import PlanState
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def random_bucketing(plan: Plan, rng: random.Random) -> Plan:
    merged: list[list[str]] = []
    for bucket in plan.all_reduce_buckets:
        if merged and rng.random() < 0.5:
            merged[-1] += bucket
        else:
            merged.append(list(bucket))
    return dataclasses.replace(plan, all_reduce_buckets=tuple(map(tuple, merged)))


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "v100-2x8-25g"])
def test_the_event_free_streams_time_equals_the_full_simulation(step, cluster):
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    rng = random.Random(0)
    for start in (Plan.unfused(step), greedy_fusion_plan(step)):
        for _ in range(4):
            graph = build_task_graph(step, random_bucketing(start, rng))
            kernel_ps = [to_ps(s) for s in cost_model.kernels_s(graph)]
            fast = graph_iteration_ps(graph, profile, kernel_ps, all_reduce_s) / PS_PER_S
            assert fast == simulate(graph, profile, cost_model).iteration_s


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "h200-8x8-ib400", "cpu-local"])
def test_incremental_evaluation_equals_a_full_simulation_on_random_local_changes(step, cluster):
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    plan = random_bucketing(greedy_fusion_plan(step), random.Random(1))
    state = PlanState(step, plan, profile, cost_model)
    full = simulate(build_task_graph(step, plan), profile, cost_model).iteration_s
    assert state.iteration_ps / PS_PER_S == full
    moves = [Split(k) for k in range(len(state.order))]
    moves += [Fuse(k, user) for k in range(len(state.order)) for user in sorted(state.succs[k])]
    moves += [make() for _, make in _bucket_moves(plan.all_reduce_buckets)]
    random.Random(2).shuffle(moves)
    checked = {"Fuse": 0, "Split": 0, "Rebucket": 0}
    for move in moves[: 90 if cluster != "cpu-local" else 30]:
        seconds = move.evaluate(state)
        child = move.child_plan(state)
        if seconds is None:
            continue
        verify_plan(child, step)  # an evaluated change is a legal plan
        assert seconds == simulate(build_task_graph(step, child), profile, cost_model).iteration_s
        checked[type(move).__name__] += 1
    assert all(count > 0 for count in checked.values()), checked


def test_fusions_refused_incrementally_are_refused_by_the_verifier_too(step):
    profile = load_profile("a100-2x8-100g")
    state = PlanState(step, greedy_fusion_plan(step), profile, RooflineCostModel(profile))
    refused = 0
    for kernel in range(len(state.order)):
        for user in sorted(state.succs[kernel]):
            if state.legal_fuse(kernel, user):
                verify_plan(state.fused_plan(kernel, user), step)
            elif abs(state.pos[kernel] - state.pos[user]) <= 64:
                refused += 1
                with pytest.raises(DiscoInputError):
                    verify_plan(state.fused_plan(kernel, user), step)
    assert refused > 0


CALLED_TWICE = """HloModule called_twice

activation {
  p = f32[256] parameter(0)
  ROOT t = f32[256] tanh(p)
}

ENTRY main {
  x = f32[256] parameter(0)
  a = f32[256] call(x), to_apply=activation
  b = f32[256] multiply(a, a)
  c = f32[256] call(b), to_apply=activation
  ROOT d = f32[256] add(c, x)
}
"""


def test_a_computation_called_twice_runs_once_per_call():
    module = module_from_text(CALLED_TWICE)
    plan = Plan.unfused(module)
    verify_plan(plan, module)
    graph = build_task_graph(module, plan)
    names = [k.name for k in graph.kernels]
    assert sorted(names) == ["b", "d", "t@a", "t@c"]
    # t@a -> b -> t@c -> d: a chain, not a cycle through the shared body.
    assert names == ["t@a", "b", "t@c", "d"]
    position = {name: n for n, name in enumerate(names)}
    assert graph.dependencies[position["b"]] == [position["t@a"]]
    assert graph.dependencies[position["t@c"]] == [position["b"]]
    profile = load_profile("a100-2x8-100g")
    result = simulate(graph, profile, RooflineCostModel(profile))
    kernel_s = RooflineCostModel(profile).kernels_s(graph)
    assert result.iteration_s == pytest.approx(sum(kernel_s))


# grad2 is computed from the all-reduced grad1 (as in a step that normalises one
# gradient by another's mean): no bucket may hold both, nor put grad2 first.
DEPENDENT_GRADIENTS = """HloModule dependent

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[256] parameter(0)
  w1 = f32[256] parameter(1)
  w2 = f32[256] parameter(2)
  w3 = f32[256] parameter(3)
  grad1 = f32[256] multiply(x, w1)
  mean1 = f32[256] all-reduce(grad1), replica_groups={{0,1}}, to_apply=sum
  grad2 = f32[256] multiply(mean1, w2)
  mean2 = f32[256] all-reduce(grad2), replica_groups={{0,1}}, to_apply=sum
  grad3 = f32[256] tanh(x)
  mean3 = f32[256] all-reduce(grad3), replica_groups={{0,1}}, to_apply=sum
  ROOT out = (f32[256], f32[256], f32[256]) tuple(mean1, mean2, mean3)
}
"""


@pytest.mark.parametrize("cluster", ["cpu-local", "a100-2x8-100g"])
def test_bucket_moves_that_break_a_gradient_dependency_are_refused(cluster):
    from disco_xla.plan import gradient_dependencies

    module = module_from_text(DEPENDENT_GRADIENTS)
    assert gradient_dependencies(module) == {"mean2": frozenset({"mean1"})}
    profile = load_profile(cluster)
    state = PlanState(module, Plan.unfused(module), profile, RooflineCostModel(profile))
    for buckets, legal in [
        ((("mean1",), ("mean2",), ("mean3",)), True),
        ((("mean1", "mean3"), ("mean2",)), True),
        ((("mean1", "mean2"), ("mean3",)), False),  # a bucket waiting on itself
        ((("mean2",), ("mean1",), ("mean3",)), False),  # waits on a later bucket
    ]:
        plan = dataclasses.replace(Plan.unfused(module), all_reduce_buckets=buckets)
        if legal:
            verify_plan(plan, module)
            assert state.evaluate_buckets(buckets) is not None
        else:
            with pytest.raises(DiscoInputError):
                verify_plan(plan, module)
            assert state.evaluate_buckets(buckets) is None
