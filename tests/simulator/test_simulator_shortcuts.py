"""The simulator's shortcuts give what the plain definitions give: exposed
communication from the union of intervals, the critical path and ready times
worked out on first read, the one-thread scheduler's sorted run order, the
roofline one kernel at a time, and the event-free time when a collective's
result is read by no kernel."""

from __future__ import annotations

import dataclasses
import random

import pytest

from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan, verify_plan
from disco_xla.simulator import cpu_threads, events
from disco_xla.simulator.comm import all_reduce_s
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import PS_PER_S, graph_iteration_ps, simulate, to_ps
from disco_xla.simulator.incremental import PlanState
from disco_xla.simulator.kernels import TaskGraph, build_task_graph
from disco_xla.simulator.profiles import load_profile

SUM = """
sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}
"""

# `big_mean` is a step output that no kernel reads, and the longest transfer.
UNREAD_COLLECTIVE = (
    "HloModule unread_collective\n"
    + SUM
    + """
ENTRY main {
  x = f32[1024] parameter(0)
  w = f32[1024] parameter(1)
  big = f32[4194304] parameter(2)
  grad = f32[1024] multiply(x, w)
  mean = f32[1024] all-reduce(grad), replica_groups={{0,1}}, to_apply=sum
  scaled = f32[4194304] multiply(big, big)
  big_mean = f32[4194304] all-reduce(scaled), replica_groups={{0,1}}, to_apply=sum
  update = f32[1024] subtract(w, mean)
  ROOT out = (f32[1024], f32[4194304]) tuple(update, big_mean)
}
"""
)

# `again` all-reduces `mean`: it has no producing kernel, so by rank it would run
# first, before the collective it reads.
TWICE_REDUCED = (
    "HloModule twice_reduced\n"
    + SUM
    + """
ENTRY main {
  x = f32[1024] parameter(0)
  w = f32[1024] parameter(1)
  grad = f32[1024] multiply(x, w)
  mean = f32[1024] all-reduce(grad), replica_groups={{0,1}}, to_apply=sum
  again = f32[1024] all-reduce(mean), replica_groups={{0,1}}, to_apply=sum
  update = f32[1024] subtract(w, again)
  ROOT out = (f32[1024], f32[1024]) tuple(update, mean)
}
"""
)


@pytest.fixture(scope="module")
def step(captured):
    return HloModule.from_bytes(captured["jax_pmap_step"][0], "step")


def one_bucket_every_other(plan: Plan) -> Plan:
    buckets = list(plan.all_reduce_buckets)
    merged = [sum(buckets[i : i + 2], ()) for i in range(0, len(buckets), 2)]
    return dataclasses.replace(plan, all_reduce_buckets=tuple(merged))


def brute_force_busy_ps(spans_ps) -> tuple[int, int, int, int]:
    """(iteration, compute busy, communication busy, exposed communication) by
    walking every stretch between two event boundaries."""
    boundaries = sorted({t for span in spans_ps for t in span[3:]})
    exposed = 0
    for low, high in zip(boundaries, boundaries[1:], strict=False):
        covering = {
            span[2] == "all-reduce" for span in spans_ps if span[3] <= low and high <= span[4]
        }
        if covering == {True}:
            exposed += high - low
    comm = sum(end - start for _, _, kind, start, end in spans_ps if kind == "all-reduce")
    compute = sum(end - start for _, _, kind, start, end in spans_ps if kind != "all-reduce")
    return max(span[4] for span in spans_ps), compute, comm, exposed


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_busy_times_equal_a_walk_over_every_stretch_of_the_timeline(step, threads):
    for profile in (
        dataclasses.replace(load_profile("cpu-local"), compute_threads=threads),
        dataclasses.replace(load_profile("a100-2x8-100g"), communication_streams=threads),
    ):
        graph = build_task_graph(step, one_bucket_every_other(Plan.unfused(step)))
        result = simulate(graph, profile, RooflineCostModel(profile))
        assert events.busy_ps(result.spans_ps) == brute_force_busy_ps(result.spans_ps)
        iteration, compute, comm, exposed = brute_force_busy_ps(result.spans_ps)
        assert result.iteration_s == iteration / PS_PER_S
        assert result.exposed_comm_s == exposed / PS_PER_S
        assert (result.compute_s, result.comm_s) == (compute / PS_PER_S, comm / PS_PER_S)


def test_busy_times_stay_exact_beyond_what_int64_sums_hold():
    spans = [
        ("a", "compute", "kernel", 0, 3 * 10**18),
        ("m", "comm 0", "all-reduce", 10**18, 7 * 10**18),
        ("b", "compute", "kernel", 5 * 10**18, 6 * 10**18 + 1),
    ]
    assert events.busy_ps(spans) == brute_force_busy_ps(spans)


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "cpu-local"])
def test_the_critical_path_is_a_chain_from_the_start_to_the_last_end(step, cluster):
    # One message per gradient and one thread: each task on the path starts when
    # the one before it on the path ends.
    profile = load_profile(cluster)
    assert profile.compute_threads == 1 or profile.execution == "gpu-streams"
    graph = build_task_graph(step, Plan.unfused(step))
    result = simulate(graph, profile, RooflineCostModel(profile))
    span_of = {span[0]: span for span in result.spans_ps}
    assert len(span_of) == len(result.spans_ps) == graph.task_count  # names are unique
    path = [span_of[name] for name in result.critical_path]
    # The devices start once the host has dispatched the step (no buffers given).
    assert path[0][3] == to_ps(profile.step_overhead_s)
    assert path[-1][4] == to_ps(result.iteration_s)
    for before, after in zip(path, path[1:], strict=False):
        assert before[4] == after[3]
    summary = result.summary()
    assert summary["critical_path"] == list(result.critical_path)
    assert list(summary)[:3] == ["iteration_s", "compute_s", "comm_s"]
    ready = summary["collective_ready_s"]
    assert sorted(ready) == sorted(name for name, _, _ in graph.communications)
    for name, seconds in ready.items():
        assert 0 < seconds <= span_of[name][3] / PS_PER_S


def test_the_one_thread_scheduler_orders_a_collective_after_the_collective_it_reads():
    module = module_from_text(TWICE_REDUCED)
    plan = Plan.unfused(module)
    verify_plan(plan, module)
    graph = build_task_graph(module, plan)
    profile = load_profile("cpu-local")
    cost_model = RooflineCostModel(profile)
    kernel_ps = [to_ps(s) for s in cost_model.kernels_s(graph)]
    comm_ps, copy_ps = events.graph_communication_ps(graph, profile, all_reduce_s)
    one = cpu_threads.run_one_thread(graph, kernel_ps, comm_ps, copy_ps, profile)
    general = cpu_threads.run_threads(graph, kernel_ps, comm_ps, copy_ps, profile)
    assert one == general
    names = [span[0] for span in one[0]]
    assert names.index("mean") < names.index("again") < names.index("update")


def test_the_roofline_one_kernel_at_a_time_equals_its_batched_arrays(step):
    for cluster in ("a100-2x8-100g", "cpu-local", "h200-8x8-ib400"):
        cost_model = RooflineCostModel(load_profile(cluster))
        graph = build_task_graph(step, Plan.unfused(step))
        batched = cost_model.kernels_s(graph)
        assert len(graph.kernels) > 8  # past the one-at-a-time limit
        one_at_a_time = [
            cost_model.kernels_s(TaskGraph([kernel], [], [], []))[0] for kernel in graph.kernels
        ]
        assert one_at_a_time == batched


@pytest.mark.parametrize("cluster", ["a100-2x8-100g", "v100-2x8-25g"])
def test_a_collective_no_kernel_reads_still_ends_the_event_free_time(cluster):
    module = module_from_text(UNREAD_COLLECTIVE)
    plan = Plan.unfused(module)
    verify_plan(plan, module)
    profile = load_profile(cluster)
    cost_model = RooflineCostModel(profile)
    graph = build_task_graph(module, plan)
    result = simulate(graph, profile, cost_model)
    last = max(result.spans_ps, key=lambda span: span[4])
    assert last[0] == "big_mean"  # the case at hand: the unread transfer ends last
    kernel_ps = [to_ps(s) for s in cost_model.kernels_s(graph)]
    assert graph_iteration_ps(graph, profile, kernel_ps, all_reduce_s) / PS_PER_S == (
        result.iteration_s
    )
    assert PlanState(module, plan, profile, cost_model).iteration_ps / PS_PER_S == (
        result.iteration_s
    )


def test_moves_near_the_first_collective_agree_with_full_simulations(step):
    # Changes that end before the timeline first meets communication take the
    # incremental shortcut (a shift by their change in duration); those a little
    # later must not.
    from disco_xla.search.backtracking import greedy_fusion_plan
    from disco_xla.search.moves import Fuse, Split

    profile = load_profile("a100-2x8-100g")
    cost_model = RooflineCostModel(profile)
    plan = greedy_fusion_plan(step)
    state = PlanState(step, plan, profile, cost_model)
    early = [k for k in range(len(state.order)) if state.pos[k] < state.first_point + 20]
    moves = [Split(k) for k in early] + [Fuse(k, u) for k in early for u in sorted(state.succs[k])]
    shortcut = 0
    for move in random.Random(3).sample(moves, min(len(moves), 40)):
        seconds = move.evaluate(state)
        if seconds is None:
            continue
        if isinstance(move, Fuse):
            change = state._fusion(move.first, move.second)
        else:
            change = state._split(move.kernel)
        shortcut += state._child(change).parent_at <= state.first_point
        full = simulate(build_task_graph(step, move.child_plan(state)), profile, cost_model)
        assert seconds == full.iteration_s
    assert shortcut > 0


def test_incremental_times_count_the_step_overhead_and_kernel_scale_as_a_full_run(step):
    from disco_xla.search.backtracking import _bucket_moves, greedy_fusion_plan
    from disco_xla.search.moves import Fuse, Split

    profile = dataclasses.replace(
        load_profile("a100-2x8-100g"), step_overhead_s=3.7e-4, kernel_time_scale=1.3
    )
    cost_model = RooflineCostModel(profile)
    plan = one_bucket_every_other(greedy_fusion_plan(step))
    state = PlanState(step, plan, profile, cost_model)
    full = simulate(build_task_graph(step, plan), profile, cost_model)
    assert state.iteration_ps / PS_PER_S == full.iteration_s
    moves = [Split(k) for k in range(len(state.order))]
    moves += [Fuse(k, u) for k in range(len(state.order)) for u in sorted(state.succs[k])]
    moves += [make() for _, make in _bucket_moves(plan.all_reduce_buckets)]
    checked = 0
    for move in random.Random(4).sample(moves, min(len(moves), 30)):
        seconds = move.evaluate(state)
        if seconds is not None:
            child = build_task_graph(step, move.child_plan(state))
            assert seconds == simulate(child, profile, cost_model).iteration_s
            checked += 1
    assert checked > 0
