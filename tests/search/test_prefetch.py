"""Issuing a loop's all-gathers a trip ahead in the search: MaxText's baseline
pipelines them as XLA's collective pipeliner does, the found plan prefetches
where that simulates faster, the XLA flag that realises it, and `disco-xla
optimize` writing and checking a plan that prefetches (in
`test_all_gather_buckets`), on the Llama FSDP step."""

from __future__ import annotations

import dataclasses

from disco_xla.plan import prefetchable_all_gathers, verify_plan
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.baselines import captured_baselines
from disco_xla.search.prefetch import pipelined_all_gathers, prefetch_choices
from disco_xla.search.xla_flags import PIPELINED_ALL_GATHER_FLAG, closest_xla_flags
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.search.test_all_gather_buckets import _comparison


def test_maxtext_pipelines_the_loops_gathers_and_xla_by_default_does_not(fsdp_step):
    profile = load_profile("h100-32x8-ib400", fsdp_step.worker_count())
    compiled = compile_module(fsdp_step, NO_COMBINER)
    names = ("xla-overlap", "maxtext", "xla-nocombine")
    baselines = captured_baselines(fsdp_step, compiled, profile, RooflineCostModel(profile), names)
    maxtext = baselines["maxtext"]
    assert maxtext.plan.prefetched_all_gathers
    assert maxtext.plan.prefetched_all_gathers == pipelined_all_gathers(fsdp_step, maxtext.plan)
    assert "pipelined a loop trip ahead" in maxtext.note
    verify_plan(maxtext.plan, fsdp_step)
    for name in ("xla-overlap", "xla-nocombine"):
        assert baselines[name].plan.prefetched_all_gathers == ()


def test_the_choices_are_none_all_and_each_loop_alone(fsdp_step):
    plan = captured_baselines(
        fsdp_step,
        compile_module(fsdp_step, NO_COMBINER),
        load_profile("cpu-local", fsdp_step.worker_count()),
        RooflineCostModel(load_profile("cpu-local")),
        ("xla-nocombine",),
    )["xla-nocombine"].plan
    choices = prefetch_choices(fsdp_step, plan)
    every = tuple(prefetchable_all_gathers(fsdp_step))
    assert choices[:2] == [(), every]
    loops = {fsdp_step.instruction(n).computation.name for n in every}
    assert len(loops) == 2 and len(choices) == 4
    assert sorted(n for choice in choices[2:] for n in choice) == sorted(every)


def test_the_found_plan_prefetches_where_that_is_faster_and_the_flags_say_so(fsdp_step):
    comparison, profile, cost_model = _comparison(fsdp_step, "a100-2x8-100g")
    found = comparison.found.plan
    assert found.prefetched_all_gathers
    found_s = comparison.results["found"].iteration_s
    waiting = dataclasses.replace(found, prefetched_all_gathers=())
    assert found_s < simulate(build_task_graph(fsdp_step, waiting), profile, cost_model).iteration_s
    for name in comparison.baselines:
        assert found_s <= comparison.baseline_plans[name][1], name
    xla_fusion = comparison.baselines["xla-nocombine"].plan
    flags = closest_xla_flags(fsdp_step, found, xla_fusion, profile, cost_model)
    assert PIPELINED_ALL_GATHER_FLAG in flags.flags.split()
    program = flags.plan(fsdp_step, xla_fusion)
    assert program.prefetched_all_gathers == pipelined_all_gathers(fsdp_step, program)
    # XLA runs the flags' program: priced as XLA:GPU compiles it.
    graph = flags.task_graph(fsdp_step, xla_fusion)
    assert flags.simulated_s == simulate(graph, profile, cost_model).iteration_s
