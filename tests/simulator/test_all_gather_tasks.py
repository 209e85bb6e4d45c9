"""A plan's all-gather buckets in the simulator: each bucket is one
communication task (in each instance of its computation) that sends its
members' bytes together, and the incremental simulation of a plan with them
gives the full simulation's time exactly."""

from __future__ import annotations

import dataclasses
import random

import pytest

from disco_xla.plan import Plan, all_gathers, verify_plan
from disco_xla.search.all_gather_buckets import combined_all_gathers
from disco_xla.search.backtracking import _bucket_moves, greedy_fusion_plan
from disco_xla.search.moves import Fuse, Split
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import PS_PER_S, simulate
from disco_xla.simulator.incremental import PlanState
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile


@pytest.fixture(scope="module")
def gathered(fsdp_step) -> tuple[Plan, Plan]:
    """(greedy fusion, the same with every kind's all-gathers combined)."""
    plan = greedy_fusion_plan(fsdp_step)
    buckets = combined_all_gathers(fsdp_step, 1 << 30)
    return plan, dataclasses.replace(plan, all_gather_buckets=buckets)


def parameter_buckets(module, plan: Plan) -> Plan:
    """`plan` with the combiner's buckets cut to the all-gathers of parameters
    (no kernel produces what they send), the others alone: buckets that add no
    wait to the kernel order, so the incremental simulation runs them itself."""
    gathers = all_gathers(module)
    position = {instr.name: index for index, instr in enumerate(gathers)}
    sends_parameter = {
        i.name for i in gathers if i.operands[0].opcode in ("parameter", "get-tuple-element")
    }
    parts = []
    for bucket in combined_all_gathers(module, 1 << 30):
        direct = tuple(name for name in bucket if name in sends_parameter)
        parts += ([direct] if direct else []) + [(n,) for n in bucket if n not in direct]
    parts.sort(key=lambda bucket: position[bucket[-1]])
    return dataclasses.replace(plan, all_gather_buckets=tuple(parts))


def test_each_bucket_is_one_task_with_its_members_bytes(fsdp_step, gathered):
    plain, bucketed = (build_task_graph(fsdp_step, p) for p in gathered)
    size_of = {names[0]: size for _, size, names in plain.communications if len(names) == 1}
    buckets = gathered[1].all_gather_buckets
    tasks = {names: size for _, size, names in bucketed.communications}
    for bucket in buckets:
        assert tasks[bucket] == sum(size_of[name] for name in bucket)
    merged = sum(len(bucket) - 1 for bucket in buckets)
    assert merged > 0
    assert len(plain.communications) - len(bucketed.communications) == merged


@pytest.mark.parametrize(
    ("cluster", "buckets"),
    [("a100-2x8-100g", "combined"), ("h200-8x8-ib400", "combined"), ("a100-2x8-100g", "params")],
)
def test_incremental_evaluation_with_all_gather_buckets_equals_a_full_simulation(
    fsdp_step, gathered, cluster, buckets
):
    profile = load_profile(cluster, fsdp_step.worker_count())
    cost_model = RooflineCostModel(profile)
    plan = gathered[1] if buckets == "combined" else parameter_buckets(fsdp_step, gathered[0])
    assert max(map(len, plan.all_gather_buckets)) > 1
    state = PlanState(fsdp_step, plan, profile, cost_model)
    # Buckets whose readers would run before another member's producer order
    # the kernels by themselves: those plans are simulated in full.
    assert state.full_only == (buckets == "combined")
    full = simulate(build_task_graph(fsdp_step, plan), profile, cost_model).iteration_s
    assert state.iteration_ps / PS_PER_S == full
    moves = [Split(k) for k in range(len(state.order))]
    moves += [Fuse(k, u) for k in range(len(state.order)) for u in sorted(state.succs[k])]
    moves += [make() for _, make in _bucket_moves(plan.all_reduce_buckets)]
    random.Random(4).shuffle(moves)
    evaluated = 0
    for move in moves[:400]:
        if evaluated == 20:
            break
        seconds = move.evaluate(state)
        if seconds is None:
            continue
        child = move.child_plan(state)
        assert child.all_gather_buckets == plan.all_gather_buckets  # moves keep them
        verify_plan(child, fsdp_step)
        assert (
            seconds == simulate(build_task_graph(fsdp_step, child), profile, cost_model).iteration_s
        )
        evaluated += 1
    assert evaluated == 20


def test_a_prefetched_gather_is_waited_for_on_its_first_trip_only(fsdp_step):
    from disco_xla.hlo.loops import loop_of_body
    from disco_xla.plan import prefetchable_all_gathers

    names = prefetchable_all_gathers(fsdp_step)
    plan = greedy_fusion_plan(fsdp_step)
    ahead = dataclasses.replace(plan, prefetched_all_gathers=tuple(names))
    graph, before = build_task_graph(fsdp_step, ahead), build_task_graph(fsdp_step, plan)
    first_comm = len(graph.kernels)
    label = {c[0]: n for n, c in enumerate(graph.communications)}
    later = [n for n, c in enumerate(graph.communications) if c[0].endswith(".later_trips")]
    assert len(later) == len(names) == len(graph.communications) - len(before.communications)
    read = {d for deps in graph.dependencies for d in deps}
    for number in later:
        first = label[graph.communications[number][0].removesuffix(".later_trips")]
        trips = loop_of_body(fsdp_step.instruction(graph.communications[number][2][0]).computation)
        assert graph.communication_runs[first] == 1
        assert graph.communication_runs[number] == trips.trips - 1
        assert first_comm + number not in read  # no task waits for the later trips
        assert graph.dependencies[first_comm + number] == graph.dependencies[first_comm + first]
    # On a cluster where the gathers cost, the layers stop waiting for them.
    profile = load_profile("v100-2x8-25g", fsdp_step.worker_count())
    cost_model = RooflineCostModel(profile)
    waited, issued_ahead = (simulate(g, profile, cost_model) for g in (before, graph))
    assert issued_ahead.exposed_comm_s < waited.exposed_comm_s
    assert issued_ahead.iteration_s < waited.iteration_s
    # The incremental state evaluates such a plan in full, to the same time.
    state = PlanState(fsdp_step, ahead, profile, cost_model)
    assert state.full_only
    assert state.iteration_ps == round(issued_ahead.iteration_s * PS_PER_S)
