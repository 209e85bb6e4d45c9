"""Splitting collectives into chunks in the search, on the Llama FSDP step:
the MLP's gather and reduction take one count, so that they run as one
pipeline, where compute and communication are of one size; the found plan
carries them, and is never slower than a baseline."""

from __future__ import annotations

import dataclasses
import json

from disco_xla.plan import verify_plan
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.baselines import captured_baselines
from disco_xla.search.chunking import best_chunks, chunk_candidates
from disco_xla.search.fusion_source import compiled_fusion
from disco_xla.search.pipeline import Pricing, plan_module
from disco_xla.settings import OptimizeSettings
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli
from tests.hlo.test_chunking import _mlp
from tests.simulator.test_chunks import balanced_profile


def test_the_search_splits_the_mlp_as_one_pipeline_where_that_pays(fsdp_step):
    gather, reduce = _mlp(fsdp_step)
    profile = balanced_profile(fsdp_step)
    cost_model = RooflineCostModel(profile)
    fusion = compiled_fusion(fsdp_step, compile_module(fsdp_step, NO_COMBINER))
    settings = OptimizeSettings(cluster="a100-2x8-100g", max_evaluations=150)
    comparison = plan_module(fsdp_step, settings, Pricing(profile, cost_model), fusion)
    found = comparison.found.plan
    verify_plan(found, fsdp_step)
    counts = dict(found.chunked_collectives)
    assert counts.get(gather.collective.name) == counts.get(reduce.collective.name) > 1
    found_s = comparison.results["found"].iteration_s
    for name in comparison.baselines:
        assert found_s <= comparison.baseline_plans[name][1], name
    # Without its chunks the found plan is slower.
    whole = dataclasses.replace(found, chunked_collectives=())
    assert simulate(build_task_graph(fsdp_step, whole), profile, cost_model).iteration_s > found_s
    # What the search may still split: nothing it split, nothing it prefetched.
    left = {s.collective.name for s in chunk_candidates(fsdp_step, found)}
    assert not left & set(counts) and not left & set(found.prefetched_all_gathers)


def test_no_chunks_where_they_only_add_latency(fsdp_step):
    # On the shipped A100 profile the tiny step's collectives cost their latency:
    # a chunk adds one, and hides nothing.
    profile = load_profile("a100-2x8-100g", fsdp_step.worker_count())
    cost_model = RooflineCostModel(profile)
    compiled = compile_module(fsdp_step, NO_COMBINER)
    baselines = captured_baselines(fsdp_step, compiled, profile, cost_model, ("xla-nocombine",))
    start = baselines["xla-nocombine"].plan
    assert chunk_candidates(fsdp_step, start)

    def price(trial) -> float:
        return simulate(build_task_graph(fsdp_step, trial), profile, cost_model).iteration_s

    best, seconds = best_chunks(fsdp_step, start, price)
    assert best.chunked_collectives == () and seconds == price(start)


BALANCED_YAML = """\
# The A100 profile slowed (peak FLOPs 1e6 times, links at 10 MB/s without latency),
# so that the tiny step's MLP computes about as long as its collectives take.
name: balanced-test
execution: gpu-streams
device:
  name: slowed A100
  peak_flops: {f32: 19.5e+6, bf16: 312.0e+6}
  memory_bandwidth_bytes_per_s: 2039.0e+9
  kernel_launch_s: 0.0
topology: {devices_per_node: 8, nodes: 2}
links:
  intra_node: {bandwidth_bytes_per_s: 1.0e+7, latency_s: 0.0}
  inter_node: {bandwidth_bytes_per_s: 1.0e+7, latency_s: 0.0}
all_reduce: hierarchical
communication_streams: 1
"""


def test_optimize_writes_a_checked_module_whose_mlp_runs_in_chunks(fsdp_step_file, tmp_path):
    cluster = tmp_path / "balanced.yaml"
    cluster.write_text(BALANCED_YAML)
    out = tmp_path / "out.hlo.pb"
    args = [fsdp_step_file, "--cluster", str(cluster), "--max-evals", "150"]
    checked = ["-o", str(out), "--candidates", "1", "--measure-budget-s", "3", "--json"]
    result = run_cli("optimize", *args, *checked, timeout_s=600)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["chunked_collectives"] >= 2
    # The found plan's chunks (with its buckets and prefetches, XLA's fusion:
    # the `buckets` candidate) ran against the original and computed the same.
    # Its enforced fusion may sum in another order, and is then refused; what
    # was written is whichever equal candidate measured fastest here.
    measured = report["measured"]
    # Where the found plan keeps XLA's fusion, its buckets alone are the plan
    # itself, measured once as `plan`.
    candidates = measured["candidates"]
    assert candidates.get("buckets", candidates["plan"])["equal"] is True
    assert "seconds" in measured["candidates"]["plan"]  # rewritten and run, not failed
    assert measured["equal"] is True
    plan = json.loads((tmp_path / "out.hlo.pb.plan.json").read_text())
    if measured["written"] in ("plan", "buckets"):
        assert len(plan["chunked_collectives"]) == report["chunked_collectives"]
    assert out.exists()
    unchecked = ["-o", str(tmp_path / "unchecked.hlo.pb"), "--no-check"]
    text = run_cli("optimize", *args, *unchecked, "--xla-flags", timeout_s=600)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "collectives split into chunks (" in text.stdout
    # The flags stand for the chunks with windowed einsum where that simulates
    # faster for XLA's program, and say that nothing does otherwise.
    windowed = "--xla_gpu_threshold_for_windowed_einsum_mib=" in text.stdout
    assert windowed == ("windowed einsum stands for" in text.stdout)
    assert windowed != ("no flag splits collectives into chunks" in text.stdout)
