"""A task graph as XLA:GPU runs the program: its reduce-scatter creator prices
the partitioner's all-reduce + dynamic-slice pairs as reduce-scatters (a bucket
only where XLA's combiner made it), and its collective pipeliner runs all but
one trip of a sunk loop collective beside the next trips, waited for by no
kernel. On the tiny Llama FSDP step, on an H100 profile."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.xla_gpu_patterns import scattering_all_reduces, sinkable_collectives
from disco_xla.plan import Plan, verify_plan
from disco_xla.simulator.comm import collective_s
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.simulator.xla_gpu_run import PIPELINED_KINDS, XlaGpuRun, as_xla_gpu_runs


@pytest.fixture(scope="module")
def priced(fsdp_step):
    profile = dataclasses.replace(load_profile("h100-32x8-ib400"), nodes=1)  # one 8-GPU node
    return profile, make_cost_model("auto", profile)


def _tasks_of(graph, names: set[str]) -> list[int]:
    return [t for t, (_, _, members) in enumerate(graph.communications) if set(members) & names]


def test_the_creator_sends_each_pair_as_a_reduce_scatter(fsdp_step, priced):
    profile, cost_model = priced
    plan = Plan.unfused(fsdp_step)
    graph = build_task_graph(fsdp_step, plan)
    scattering = scattering_all_reduces(fsdp_step)
    tasks = _tasks_of(graph, scattering)
    assert tasks and all(graph.communication_kind(t) == "all-reduce" for t in tasks)
    run = as_xla_gpu_runs(graph, fsdp_step, XlaGpuRun())
    assert all(run.communication_kind(t) == "reduce-scatter" for t in tasks)
    others = [t for t in range(len(graph.communications)) if t not in tasks]
    assert [run.communication_kind(t) for t in others] == [
        graph.communication_kind(t) for t in others
    ]
    # Inside a node a reduce-scatter of the same buffer costs less than its
    # all-reduce (XLA's measured table: about half).
    for task in tasks:
        size = graph.communications[task][1]
        scatter = collective_s("reduce-scatter", size, profile)
        assert 0 < scatter < collective_s("all-reduce", size, profile)
    assert simulate(run, profile, cost_model).comm_s < simulate(graph, profile, cost_model).comm_s


def test_a_concatenated_bucket_stays_an_all_reduce_unless_xla_combined_it(fsdp_step):
    gradients = [a.name for a in fsdp_step.gradient_all_reduces]
    scattering = [name for name in gradients if name in scattering_all_reduces(fsdp_step)]
    plan = None
    for first, second in zip(scattering, scattering[1:], strict=False):  # the first legal pair
        pair = (first, second)
        rest = tuple((name,) for name in gradients if name not in pair)
        trial = dataclasses.replace(Plan.unfused(fsdp_step), all_reduce_buckets=(pair, *rest))
        try:
            verify_plan(trial, fsdp_step)
        except DiscoInputError:
            continue
        plan = trial
        break
    assert plan is not None
    graph = build_task_graph(fsdp_step, plan)
    (task,) = [t for t, (_, _, members) in enumerate(graph.communications) if members == pair]
    ours = as_xla_gpu_runs(graph, fsdp_step, XlaGpuRun(buckets_by_xla=False))
    xlas = as_xla_gpu_runs(graph, fsdp_step, XlaGpuRun(buckets_by_xla=True))
    assert ours.communication_kind(task) == "all-reduce"
    assert xlas.communication_kind(task) == "reduce-scatter"


def test_pipelining_runs_all_but_one_trip_beside_the_next_trips(fsdp_step, priced):
    profile, cost_model = priced
    graph = build_task_graph(fsdp_step, Plan.unfused(fsdp_step))
    plain = as_xla_gpu_runs(graph, fsdp_step, XlaGpuRun())
    sunk = as_xla_gpu_runs(graph, fsdp_step, XlaGpuRun(pipelined=frozenset(PIPELINED_KINDS)))
    tasks = _tasks_of(graph, set(sinkable_collectives(fsdp_step)))
    assert tasks
    added = len(sunk.communications) - len(plain.communications)
    assert added == len(tasks)
    kernels = len(graph.kernels)
    # The plan's buckets still come first (the streams issue them in plan
    # order), the split-off trips of a bucket among them.
    flags = sunk.is_bucket
    assert flags == sorted(flags, reverse=True)
    by_name = {name: n for n, (name, _, _) in enumerate(sunk.communications)}
    readers = {d for deps in sunk.dependencies for d in deps}
    for task in tasks:
        name = plain.communications[task][0]
        whole, copy = by_name[name], by_name[f"{name}.sunk_trips"]
        assert kernels + copy not in readers, "no task waits for the sunk trips"
        runs = plain.communication_runs[task]
        assert sunk.communication_runs[whole] + sunk.communication_runs[copy] == runs
        assert sunk.communication_runs[whole] < runs
        assert sunk.is_bucket[copy] == plain.is_bucket[task]
        kernel_deps = [d for d in sunk.dependencies[kernels + copy] if d < kernels]
        assert kernel_deps == [d for d in plain.dependencies[kernels + task] if d < kernels]

    # The same bytes are sent; the step is no slower.
    def sent(graph) -> int:
        pairs = zip(graph.communications, graph.communication_runs, strict=True)
        return sum(size * runs for (_, size, _), runs in pairs)

    assert sent(sunk) == sent(plain)
    assert (
        simulate(sunk, profile, cost_model).iteration_s
        <= simulate(plain, profile, cost_model).iteration_s
    )
