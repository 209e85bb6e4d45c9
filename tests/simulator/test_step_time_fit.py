"""Learning what a collective's message costs inside a step from measured step
times: the count of messages, the fit on a case with a known answer, and the
charge in the simulator (full and incremental alike)."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo_passes.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.simulator.step_time_fit import StepTime, fit_message_cost, messages_per_step
from tests.simulator.incremental_checks import local_changes_match_full_simulation


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def _one_bucket(step: HloModule) -> Plan:
    greedy = greedy_fusion_plan(step)
    names = tuple(a.name for a in step.gradient_all_reduces)
    return Plan(step.name, step.fingerprint, greedy.fusion_groups, (names,))


def test_a_step_sends_a_message_per_collective_and_per_tuple_tensor(step):
    gradients = len(step.gradient_all_reduces)
    assert gradients >= 3
    one = _one_bucket(step)
    others = len(build_task_graph(step, one).communications) - 1  # e.g. the loss's mean
    assert messages_per_step(build_task_graph(step, one)) == others + 1
    assert messages_per_step(build_task_graph(step, Plan.unfused(step))) == others + gradients
    # The same bucket sent as a tuple all-reduce: one message per tensor.
    tuple_graph = build_task_graph(step, one, tuple_buckets=True)
    assert messages_per_step(tuple_graph) == others + gradients


def _programs(module: str, scale: float, message_s: float, shapes) -> list[StepTime]:
    return [
        StepTime(module, f"p{i}", n, s, scale * (s + message_s * n))
        for i, (n, s) in enumerate(shapes)
    ]


def test_the_fit_finds_the_message_cost_that_made_the_times():
    """Two modules measured at different speeds (scale 2 and 0.5), each
    message costing 1 ms beyond the simulation: the fit finds 1 ms."""
    observed = _programs("a", 2.0, 1e-3, [(1, 1e-3), (10, 1.1e-3), (100, 1.5e-3)])
    observed += _programs("b", 0.5, 1e-3, [(2, 5e-3), (40, 6e-3)])
    assert fit_message_cost(observed) == pytest.approx(1e-3)
    # Times that the simulation explains alone: no message cost.
    assert fit_message_cost(_programs("a", 3.0, 0.0, [(1, 1e-3), (50, 2e-3)])) == 0.0
    # Programs that send as many messages as each other cannot tell.
    assert fit_message_cost(_programs("a", 2.0, 1e-3, [(5, 1e-3), (5, 2e-3)])) is None
    assert fit_message_cost([]) is None


def test_the_simulator_charges_each_message(step):
    """The profile's `collective_message_s` lengthens a plan with many
    messages more than one with a single bucket, in the full simulation and in
    the incremental one the search runs."""
    profile = load_profile("cpu-local")
    charged = dataclasses.replace(profile, collective_message_s=0.05)
    model = RooflineCostModel(profile)

    def added_s(plan: Plan) -> float:
        graph = build_task_graph(step, plan)
        return (
            simulate(graph, charged, model).iteration_s
            - simulate(graph, profile, model).iteration_s
        )

    many, one = Plan.unfused(step), _one_bucket(step)
    one_messages = messages_per_step(build_task_graph(step, one))
    assert added_s(one) == pytest.approx(0.05 * one_messages, rel=0.01)
    assert added_s(many) >= 0.05 * (one_messages + len(step.gradient_all_reduces) - 1) * 0.99
    assert local_changes_match_full_simulation(step, many, charged, model, seed=3) > 0
