"""Tasks inside a `while` body count once per trip: the task graph says how often
each kernel and collective runs, the event simulator multiplies their times, the
ideal bound counts every trip's gradient bytes, and the incremental simulation
stays equal to the full one on a module with a loop."""

from __future__ import annotations

import json

import pytest

from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.comm import all_reduce_s
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import PS_PER_S, simulate, to_ps
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.simulator.incremental_checks import local_changes_match_full_simulation

LOOPED = """HloModule looped

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

body {
  p = (s32[], f32[4096], f32[4096]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  h = f32[4096] get-tuple-element(p), index=1
  acc = f32[4096] get-tuple-element(p), index=2
  one = s32[] constant(1)
  next = s32[] add(i, one)
  t = f32[4096] tanh(h)
  g = f32[4096] multiply(t, h)
  s = f32[4096] sine(g)
  r = f32[4096] all-reduce(s), replica_groups={{0,1}}, to_apply=sum
  acc2 = f32[4096] add(acc, r)
  ROOT out = (s32[], f32[4096], f32[4096]) tuple(next, t, acc2)
}

cond {
  p = (s32[], f32[4096], f32[4096]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(TRIPS)
  ROOT lt = pred[] compare(i, n), direction=LT
}

ENTRY main {
  x = f32[4096] parameter(0)
  zero = s32[] constant(0)
  e = f32[4096] exponential(x)
  init = (s32[], f32[4096], f32[4096]) tuple(zero, e, x)
  loop = (s32[], f32[4096], f32[4096]) while(init), condition=cond, body=body
  h = f32[4096] get-tuple-element(loop), index=1
  acc = f32[4096] get-tuple-element(loop), index=2
  w = f32[4096] multiply(x, x)
  v = f32[4096] cosine(w)
  mw = f32[4096] all-reduce(v), replica_groups={{0,1}}, to_apply=sum
  mv = f32[4096] all-reduce(w), replica_groups={{0,1}}, to_apply=sum
  ROOT result = (f32[4096], f32[4096], f32[4096], f32[4096]) tuple(h, acc, mw, mv)
}
"""


def looped(trips: int):
    return module_from_text(LOOPED.replace("TRIPS", str(trips)))


def test_body_tasks_run_once_per_trip_and_the_condition_once_more():
    module = looped(6)
    graph = build_task_graph(module, Plan.unfused(module))
    runs = {k.name: n for k, n in zip(graph.kernels, graph.kernel_runs, strict=True)}
    assert runs["t"] == runs["g"] == runs["s"] == runs["acc2"] == runs["next"] == 6
    assert runs["lt"] == 7
    assert runs["e"] == runs["w"] == 1
    comm_runs = {
        c[0]: n for c, n in zip(graph.communications, graph.communication_runs, strict=True)
    }
    assert comm_runs == {"r": 6, "mw": 1, "mv": 1}


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "cpu-local"])
def test_the_simulator_counts_every_trip_in_the_times_and_the_ideal_bound(cluster):
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    results = {}
    for trips in (1, 6):
        module = looped(trips)
        graph = build_task_graph(module, Plan.unfused(module))
        result = simulate(graph, profile, cost_model)
        kernel_ps = [to_ps(s * profile.kernel_time_scale) for s in cost_model.kernels_s(graph)]
        expected = sum(ps * n for ps, n in zip(kernel_ps, graph.kernel_runs, strict=True))
        assert result.compute_s == pytest.approx(expected / PS_PER_S)
        # The all-reduce in the body is sent on every trip.
        one_message = to_ps(all_reduce_s(4096 * 4, profile)) / PS_PER_S
        assert result.comm_s == pytest.approx((trips + 2) * one_message)
        gradient_bytes = (trips + 2) * 4096 * 4
        step_s = profile.step_overhead_s
        assert result.ideal_s == pytest.approx(
            max(result.compute_s, all_reduce_s(gradient_bytes, profile)) + step_s
        )
        results[trips] = result
    assert results[6].iteration_s > results[1].iteration_s


def test_a_known_trip_count_in_the_backend_config_sets_the_runs():
    module = looped(2)
    (loop,) = [i for i in module.instructions() if i.opcode == "while"]
    loop.proto.backend_config = json.dumps({"known_trip_count": {"n": "9"}}).encode()
    graph = build_task_graph(module, Plan.unfused(module))
    runs = {k.name: n for k, n in zip(graph.kernels, graph.kernel_runs, strict=True)}
    assert runs["t"] == 9 and runs["lt"] == 10


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "h200-8x8-ib400"])
def test_incremental_evaluation_equals_a_full_simulation_with_a_loop(cluster):
    module = looped(5)
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    for plan in (Plan.unfused(module), greedy_fusion_plan(module)):
        verify_plan(plan, module)
        assert local_changes_match_full_simulation(module, plan, profile, cost_model, seed=3) > 0
