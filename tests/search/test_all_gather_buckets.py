"""All-gather buckets in the search: XLA:GPU's combiner as the GPU baselines
run it, the sweep that gives the found plan its all-gather buckets, the XLA
flag that realises them, and `disco-xla optimize` writing, checking and
reporting a plan with them (and with prefetched all-gathers) on the Llama FSDP
step."""

from __future__ import annotations

import json

from disco_xla.hlo.collectives import collective_bytes
from disco_xla.plan import all_gather_kinds, all_gathers, verify_plan
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.all_gather_buckets import (
    XLA_GPU_ALL_GATHER_COMBINE_BYTES,
    combined_all_gathers,
)
from disco_xla.search.baselines import captured_baselines
from disco_xla.search.fusion_source import compiled_fusion
from disco_xla.search.pipeline import Pricing, plan_module
from disco_xla.search.xla_flags import PIPELINED_ALL_GATHER_FLAG, closest_xla_flags
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli


def test_the_combiner_keeps_each_bucket_under_its_limit_and_of_one_kind(fsdp_step):
    sizes = {i.name: collective_bytes(i) for i in all_gathers(fsdp_step)}
    kinds = all_gather_kinds(fsdp_step)
    limit = 2 * max(sizes.values())
    buckets = combined_all_gathers(fsdp_step, limit)
    assert sorted(n for b in buckets for n in b) == sorted(sizes)
    assert any(len(b) > 1 for b in buckets)
    for bucket in buckets:
        assert len({kinds[n] for n in bucket}) == 1
        assert len(bucket) == 1 or sum(sizes[n] for n in bucket) <= limit
    # A limit below every all-gather combines none: the module's own.
    assert combined_all_gathers(fsdp_step, 1) == ()
    # Larger limits never make more buckets.
    assert len(combined_all_gathers(fsdp_step, 1 << 30)) <= len(buckets)


def _comparison(module, cluster: str):
    profile = load_profile(cluster, module.worker_count())
    cost_model = RooflineCostModel(profile)
    fusion = compiled_fusion(module, compile_module(module, NO_COMBINER))
    settings = OptimizeSettings(cluster=cluster, max_evaluations=150)
    return plan_module(module, settings, Pricing(profile, cost_model), fusion), profile, cost_model


def test_gpu_baselines_combine_all_gathers_as_xla_gpu_does_and_cpu_ones_do_not(fsdp_step):
    gpu = load_profile("a100-2x8-100g", fsdp_step.worker_count())
    compiled = compile_module(fsdp_step, NO_COMBINER)
    baselines = captured_baselines(fsdp_step, compiled, gpu, RooflineCostModel(gpu))
    default = combined_all_gathers(fsdp_step, XLA_GPU_ALL_GATHER_COMBINE_BYTES)
    assert default
    for name in ("xla", "xla-overlap"):
        assert baselines[name].plan.all_gather_buckets == default
        assert "all-gathers combined up to 30 MB" in baselines[name].note
    assert baselines["xla-tuned"].plan.all_gather_buckets
    for name in ("xla-nocombine", "ddp", "none"):
        assert baselines[name].plan.all_gather_buckets == ()
    cpu = load_profile("cpu-local", fsdp_step.worker_count())
    on_cpu = captured_baselines(fsdp_step, compiled, cpu, RooflineCostModel(cpu))
    assert all(b.plan.all_gather_buckets == () for b in on_cpu.values())


def test_the_found_plan_takes_all_gather_buckets_and_is_never_slower_than_a_baseline(fsdp_step):
    comparison, profile, cost_model = _comparison(fsdp_step, "a100-2x8-100g")
    found = comparison.found.plan
    verify_plan(found, fsdp_step)
    assert found.all_gather_buckets
    found_s = comparison.results["found"].iteration_s
    assert found_s == comparison.found.iteration_s
    for name in comparison.baselines:
        assert found_s <= comparison.baseline_plans[name][1], name
    xla_fusion = comparison.baselines["xla-nocombine"].plan
    flags = closest_xla_flags(fsdp_step, found, xla_fusion, profile, cost_model)
    gather_flag = f"--xla_gpu_all_gather_combine_threshold_bytes={flags.thresholds['all-gather']}"
    assert gather_flag in flags.flags.split()
    assert flags.all_gather_buckets == combined_all_gathers(
        fsdp_step, flags.thresholds["all-gather"]
    )
    # The flags' program is a candidate too, as the rewrite runs it (its
    # buckets concatenated). Its own figure is XLA's run of it, whose
    # reduce-scatter creator the rewrite's concatenations hide.
    program = build_task_graph(fsdp_step, flags.plan(fsdp_step, xla_fusion))
    assert found_s <= simulate(program, profile, cost_model).iteration_s
    assert (
        flags.simulated_s
        == simulate(flags.task_graph(fsdp_step, xla_fusion), profile, cost_model).iteration_s
    )


def test_optimize_writes_a_checked_module_with_all_gather_buckets(fsdp_step_file, tmp_path):
    out = tmp_path / "out.hlo.pb"
    args = [fsdp_step_file, "--cluster", "a100-2x8-100g", "--max-evals", "150"]
    args += ["-o", str(out), "--candidates", "1", "--measure-budget-s", "3", "--json"]
    result = run_cli("optimize", *args, timeout_s=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["all_gather_buckets"] > 0
    plan = json.loads((tmp_path / "out.hlo.pb.plan.json").read_text())
    assert len(plan["all_gather_buckets"]) == report["all_gather_buckets"]
    assert report["measured"]["equal"] is True
    assert report["measured"]["candidates"]["plan"]["equal"] is True
    assert out.exists()
    # The plan issues the layer loops' parameter all-gathers a trip ahead too.
    assert report["prefetched_all_gathers"] == len(plan["prefetched_all_gathers"]) > 0
    text = run_cli("optimize", *args[:-1], "--xla-flags", timeout_s=600)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "--xla_gpu_all_gather_combine_threshold_bytes=" in text.stdout
    assert "its all-gathers sent in" in text.stdout
    assert "all-gathers issued a loop trip ahead" in text.stdout
    assert PIPELINED_ALL_GATHER_FLAG in text.stdout
