"""The expert's whole XLA as the baseline: `xla-tuned` with O1's pipelining
(kept where it simulates faster) and a threshold sweep finer than powers of
two; `maxtext` with every flag of MaxText's scripts, naming those the simulator
cannot model; both simulated as XLA:GPU compiles their programs (its
reduce-scatter creator before its combiners); and the `--xla-flags` printout
speaking the same set."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo.xla_gpu_patterns import scattering_all_reduces
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.baselines import captured_baselines, gradient_kinds
from disco_xla.search.combiners import MB, threshold_buckets, threshold_sweep, tuned_buckets
from disco_xla.search.expert_flags import (
    MAXTEXT_A3_FLAGS,
    NOT_MODELLED,
    combiner_kinds,
    refined_thresholds,
    unmodelled_note,
)
from disco_xla.search.xla_flags import (
    DOUBLE_BUFFERING_FLAG,
    PIPELINED_FLAGS,
    XlaFlags,
    closest_xla_flags,
)
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile

THREE = [("x", 20 * MB), ("y", 20 * MB), ("z", 20 * MB)]


def test_the_finer_sweep_steps_a_quarter_octave_between_the_best_and_its_neighbours():
    tried = [16 * MB, 30 * MB, 32 * MB, 64 * MB]
    finer = refined_thresholds(32 * MB, tried)
    assert finer and all(32 * MB < t < 64 * MB or 30 * MB < t < 32 * MB for t in finer)
    assert [round(b / a, 3) for a, b in zip([32 * MB, *finer], finer, strict=False)] == [
        round(2**0.25, 3)
    ] * len(finer)


def test_the_tuned_sweep_finds_a_threshold_no_power_of_two_gives():
    def price(buckets) -> float:  # two buckets best, then the fewest
        return abs(len(buckets) - 2) + 0.1 * len(buckets)

    assert all(len(threshold_buckets(THREE, t)) != 2 for t in threshold_sweep(60 * MB))
    buckets, thresholds = tuned_buckets(THREE, {}, price)
    assert len(buckets) == 2
    assert thresholds["all-reduce"] not in threshold_sweep(60 * MB)


def test_maxtext_flags_are_listed_one_by_one_and_the_unmodelled_named():
    flags = [flag.split("=")[0] for flag, _, _ in MAXTEXT_A3_FLAGS]
    assert len(flags) == len(set(flags)) == 15
    named = unmodelled_note()
    for flag, how, _ in MAXTEXT_A3_FLAGS:
        assert (flag.split("=")[0] in named) == (how == NOT_MODELLED)


def test_flags_print_the_pipelining_they_choose():
    plain = XlaFlags({"all-reduce": 64 * MB}, (), 0.0)
    assert DOUBLE_BUFFERING_FLAG not in plain.flags
    sunk = dataclasses.replace(plain, pipelined_kinds=frozenset({"reduce-scatter"}))
    assert PIPELINED_FLAGS["reduce-scatter"] in sunk.flags.split()
    assert PIPELINED_FLAGS["all-reduce"] not in sunk.flags
    assert DOUBLE_BUFFERING_FLAG in sunk.flags.split()


@pytest.fixture(scope="module")
def expert(fsdp_step):
    profile = dataclasses.replace(load_profile("h100-32x8-ib400"), nodes=1)  # an 8-GPU node
    cost_model = make_cost_model("auto", profile)
    compiled = compile_module(fsdp_step, NO_COMBINER)
    names = ("xla-overlap", "xla-tuned", "maxtext", "xla-nocombine")
    return profile, cost_model, captured_baselines(fsdp_step, compiled, profile, cost_model, names)


def test_xla_runs_its_baselines_with_the_creator_before_its_combiners(fsdp_step, expert):
    _, _, baselines = expert
    kinds = combiner_kinds(fsdp_step, gradient_kinds(fsdp_step))
    scattering = scattering_all_reduces(fsdp_step)
    gradients = scattering & set(kinds)
    assert gradients and all(kinds[name] == "reduce-scatter" for name in gradients)
    for name in ("xla-overlap", "xla-tuned", "maxtext", "xla-nocombine"):
        run = baselines[name].xla_run
        assert run is not None and run.buckets_by_xla, name
        graph = baselines[name].task_graph()
        for task, (_, _, members) in enumerate(graph.communications):
            if set(members) <= scattering:
                assert graph.communication_kind(task) == "reduce-scatter", (name, members)
    # XLA's combiners never mix a created reduce-scatter with an all-reduce.
    for bucket in baselines["xla-tuned"].plan.all_reduce_buckets:
        assert len({kinds[name] for name in bucket}) == 1


def test_maxtext_pipelines_and_xla_tuned_only_where_faster(fsdp_step, expert):
    profile, cost_model, baselines = expert
    maxtext, tuned = baselines["maxtext"], baselines["xla-tuned"]
    assert maxtext.xla_run.pipelined == {"reduce-scatter", "all-reduce"}
    assert "flags not modelled: --xla_gpu_enable_triton_gemm" in maxtext.note
    tuned_s = simulate(tuned.task_graph(), profile, cost_model).iteration_s
    for kinds in ((), ("reduce-scatter",), ("all-reduce",), ("reduce-scatter", "all-reduce")):
        other = dataclasses.replace(
            tuned, xla_run=dataclasses.replace(tuned.xla_run, pipelined=frozenset(kinds))
        )
        assert tuned_s <= simulate(other.task_graph(), profile, cost_model).iteration_s
    assert ("pipelined a loop trip on" in tuned.note) == bool(tuned.xla_run.pipelined)


def test_the_closest_flags_are_priced_as_xla_runs_them(fsdp_step, expert):
    profile, cost_model, baselines = expert
    xla_fusion = baselines["xla-nocombine"].plan
    flags = closest_xla_flags(
        fsdp_step, baselines["xla-tuned"].plan, xla_fusion, profile, cost_model
    )
    graph = flags.task_graph(fsdp_step, xla_fusion)
    assert flags.simulated_s == simulate(graph, profile, cost_model).iteration_s
    tuned_s = simulate(baselines["xla-tuned"].task_graph(), profile, cost_model).iteration_s
    assert flags.simulated_s <= tuned_s * 1.001
    for kind in flags.pipelined_kinds:
        assert PIPELINED_FLAGS[kind] in flags.flags.split()


def test_the_found_plan_runs_under_the_experts_flags_and_is_no_slower_than_a_baseline(
    fsdp_step, expert
):
    from disco_xla.driver.planning import prepared
    from disco_xla.search.fusion_source import compiled_fusion
    from disco_xla.search.pipeline import Pricing, plan_module
    from disco_xla.settings import OptimizeSettings

    profile, cost_model, _ = expert
    module = prepared(fsdp_step)  # its pairs made reduce-scatters
    fusion = compiled_fusion(module, compile_module(module, NO_COMBINER))
    settings = OptimizeSettings(cluster="h100-32x8-ib400", max_evaluations=100)
    comparison = plan_module(module, settings, Pricing(profile, cost_model), fusion)
    found = comparison.results["found"].iteration_s
    assert found == comparison.found.iteration_s
    for name in comparison.baselines:
        assert found <= comparison.results[name].iteration_s, name
    tuned = comparison.baselines["xla-tuned"]
    if tuned.xla_run.pipelined:  # XLA pipelines the rewritten program's loops too
        plain = simulate(build_task_graph(module, comparison.found.plan), profile, cost_model)
        assert found <= plain.iteration_s
