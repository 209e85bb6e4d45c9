"""Learning what a collective and a tuple all-reduce's tensor cost inside a step
from measured step times: the counts, the fit on cases with a known answer, and
the charge in the simulator (full and incremental alike)."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo.graph import HloModule
from disco_xla.plan import Plan
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.simulator.step_time_fit import (
    MESSAGE_COST_GRID_S,
    MIN_MODULE_SCALE,
    CollectiveCosts,
    StepTime,
    fit_collective_costs,
    message_counts,
)
from tests.simulator.incremental_checks import local_changes_match_full_simulation


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def _one_bucket(step: HloModule) -> Plan:
    greedy = greedy_fusion_plan(step)
    names = tuple(a.name for a in step.gradient_all_reduces)
    return Plan(step.name, step.fingerprint, greedy.fusion_groups, (names,))


def test_a_step_counts_each_collective_once_and_a_tuples_tensors_apart(step):
    gradients = len(step.gradient_all_reduces)
    assert gradients >= 3
    one = _one_bucket(step)
    others = len(build_task_graph(step, one).communications) - 1  # e.g. the loss's mean
    assert message_counts(build_task_graph(step, one)) == (others + 1, 0)
    assert message_counts(build_task_graph(step, Plan.unfused(step))) == (others + gradients, 0)
    # The same bucket sent as a tuple all-reduce: one collective, and every
    # tensor after the first counted apart.
    tuple_graph = build_task_graph(step, one, tuple_buckets=True)
    assert message_counts(tuple_graph) == (others + 1, gradients - 1)


def _programs(module: str, scale: float, message_s: float, shapes, tensor_s: float = 0.0):
    return [
        StepTime(module, f"p{i}", n, s, scale * (s + message_s * n + tensor_s * t), t)
        for i, (n, s, t) in enumerate(shape if len(shape) == 3 else (*shape, 0) for shape in shapes)
    ]


def test_the_fit_finds_the_message_cost_that_made_the_times():
    """Two modules measured at different speeds (scale 2 and 0.5), each
    collective costing 1 ms beyond the simulation: the fit finds 1 ms, and
    cannot tell a tuple tensor's cost (no program sends a tuple)."""
    observed = _programs("a", 2.0, 1e-3, [(1, 1e-3), (10, 1.1e-3), (100, 1.5e-3)])
    observed += _programs("b", 0.5, 1e-3, [(2, 5e-3), (40, 6e-3)])
    learned = fit_collective_costs(observed)
    assert learned.message_s == pytest.approx(1e-3) and learned.tuple_element_s is None
    # Times that the simulation explains alone: no message cost.
    assert fit_collective_costs(_programs("a", 3.0, 0.0, [(1, 1e-3), (50, 2e-3)])).message_s == 0
    # Programs that run as many collectives as each other cannot tell.
    same = fit_collective_costs(_programs("a", 2.0, 1e-3, [(5, 1e-3), (5, 2e-3)]))
    assert same.message_s is None and same.tuple_element_s is None
    assert fit_collective_costs([]) == CollectiveCosts(None, None)


def test_the_learned_cost_may_not_model_a_module_far_slower_than_measured():
    """Times exactly proportional to the collectives sent (2 ms each, nothing
    else): every larger cost explains them a little better, and the module's
    scale would absorb the level. The fit stops at the largest cost of its grid
    that keeps the programs modelled at most 3x their measured times."""
    import numpy as np

    shapes = [(1, 1e-3), (10, 1e-3), (100, 1e-3)]
    observed = [StepTime("bert", f"p{i}", n, s, 2e-3 * n) for i, (n, s) in enumerate(shapes)]

    def scale(message_s: float) -> float:
        ratios = [t.measured_s / (t.simulated_s + message_s * t.messages) for t in observed]
        return float(np.exp(np.mean(np.log(ratios))))

    learned = fit_collective_costs(observed).message_s
    assert learned < 1e-2 < MESSAGE_COST_GRID_S[-1]
    following = MESSAGE_COST_GRID_S[MESSAGE_COST_GRID_S.index(learned) + 1]
    assert scale(learned) >= MIN_MODULE_SCALE > scale(following)
    # A module whose simulation alone is already over 3x slow learns no cost.
    slow = [StepTime("slow", f"p{n}", n, 1.0, 1e-2 * n) for n in (1, 10, 100)]
    assert fit_collective_costs(slow).message_s == 0


def test_the_fit_tells_a_tuples_tensors_from_its_collectives():
    """XLA's one tuple all-reduce of 100 tensors beside plans of 100 separate
    all-reduces: in one process the devices meet once per collective (10 ms
    each here) and a tuple's tensors cost little (0.1 ms each). Counting a
    tuple's tensors as collectives could not explain the tuple running fastest;
    the fit finds both costs."""
    shapes = [(2, 0.50, 99), (101, 0.48, 0), (21, 0.49, 0), (6, 0.495, 0)]
    observed = _programs("xception", 1.3, 1e-2, shapes, tensor_s=1e-4)
    observed += _programs("densenet", 0.8, 1e-2, [(2, 0.2, 300), (250, 0.19, 0), (9, 0.2, 0)], 1e-4)
    learned = fit_collective_costs(observed)
    assert learned.message_s == pytest.approx(1e-2)
    assert learned.tuple_element_s == pytest.approx(1e-4)
    # On gloo processes each tensor is a message: the two costs come out alike.
    gloo = _programs("bert", 1.0, 2e-3, [(2, 0.05, 150), (152, 0.04, 0), (5, 0.045, 0)], 2e-3)
    learned = fit_collective_costs(gloo)
    assert learned.message_s == pytest.approx(2e-3, rel=0.26)
    assert learned.tuple_element_s == pytest.approx(2e-3, rel=0.26)


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
    one_messages, _ = message_counts(build_task_graph(step, one))
    assert added_s(one) == pytest.approx(0.05 * one_messages, rel=0.01)
    assert added_s(many) >= 0.05 * (one_messages + len(step.gradient_all_reduces) - 1) * 0.99
    assert local_changes_match_full_simulation(step, many, charged, model, seed=3) > 0
    # A tuple all-reduce is charged once as a collective, and its tensors after
    # the first at the tuple tensor cost.
    tuple_graph = build_task_graph(step, one, tuple_buckets=True)
    collectives, tensors = message_counts(tuple_graph)
    assert tensors >= 2
    dear_tensors = dataclasses.replace(charged, tuple_all_reduce_element_s=0.2)
    plain = dataclasses.replace(profile, tuple_all_reduce_element_s=0.0)
    added = (
        simulate(tuple_graph, dear_tensors, model).iteration_s
        - simulate(tuple_graph, plain, model).iteration_s
    )
    assert added == pytest.approx(0.05 * collectives + 0.2 * tensors, rel=0.01)
