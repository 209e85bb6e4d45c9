"""Collectives that read collectives: with data parallelism over FSDP shards,
each gradient is reduce-scattered over its FSDP group and its block
all-reduced over the data group, with no kernel between the two. A bucket of
those all-reduces waits, through the reduce-scatters it reads, for every kernel
they wait for; the kernels that read it run after all of them, and its
concatenation runs once those are done. On the tiny Llama step, data parallel
over 2 x FSDP over 2, on an H100 profile."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.driver.planning import prepared
from disco_xla.plan import Plan, verify_plan
from disco_xla.search.baselines import legal_buckets
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile


@pytest.fixture(scope="module")
def chained():
    from disco_xla.zoo import capture_model

    module = prepared(capture_model("llama", "jax", 4, mode="sharded", fsdp=2).module)
    scattered = {a.name for a in module.gradient_all_reduces if a.kind == "reduce-scatter"}
    reducing = [
        a.name
        for a in module.gradient_all_reduces
        if a.kind == "all-reduce"
        and any(o.name in scattered for o in module.instruction(a.name).operands)
    ]
    return module, reducing


def test_a_bucket_of_all_reduces_of_blocks_waits_for_what_their_blocks_wait_for(chained):
    module, reducing = chained
    assert len(reducing) >= 2
    gradients = [a.name for a in module.gradient_all_reduces]
    together = legal_buckets(module, [tuple(reducing)])
    alone = tuple((name,) for name in gradients if name not in reducing)
    plan = dataclasses.replace(Plan.unfused(module), all_reduce_buckets=(*alone, *together))
    verify_plan(plan, module)
    graph = build_task_graph(module, plan)
    kernels = len(graph.kernels)
    profile = dataclasses.replace(load_profile("h100-32x8-ib400"), nodes=1)
    result = simulate(graph, profile, make_cost_model("auto", profile))  # no deadlock
    assert result.iteration_s > 0
    for task, (_, _, members) in enumerate(graph.communications):
        if len(members) < 2 or not set(members) <= set(reducing):
            continue
        assert graph.last_producer[task] == -1  # no kernel feeds it directly
        upstream, pending = set(), list(graph.dependencies[kernels + task])
        while pending:
            dep = pending.pop()
            if dep < kernels:
                upstream.add(dep)
            else:
                pending.extend(graph.dependencies[dep])
        assert upstream
        readers = [k for k in range(kernels) if kernels + task in graph.dependencies[k]]
        assert readers and min(readers) > max(upstream)
