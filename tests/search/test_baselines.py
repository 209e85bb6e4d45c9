"""The baselines' bucketing rules, and every baseline simulated through the CLI."""

from __future__ import annotations

import pytest

from disco_xla.search.baseline_rules import BUCKET_RULES, bucket_rules
from disco_xla.search.baselines import BASELINES
from disco_xla.search.combiners import (
    MB,
    cycle_buckets,
    kind_threshold_buckets,
    mgwfbp_buckets,
    threshold_buckets,
    threshold_sweep,
    tuned_buckets,
    unit_buckets,
    xla_cpu_buckets,
)
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli, simulate_plans

GRADIENTS = [("a", 600_000), ("b", 600_000), ("c", 10 * MB), ("d", 20 * MB), ("e", 30 * MB)]


def test_every_baseline_has_one_rule_and_an_unknown_name_is_refused():
    assert set(BUCKET_RULES) == {*BASELINES, "maxtext"}
    profile = load_profile("h100-32x8-ib400")
    with pytest.raises(ValueError, match="unknown baseline 'nccl-magic'"):
        bucket_rules("nccl-magic", GRADIENTS, {}, profile)
    # On the CPU, XLA's baselines are its one combined all-reduce.
    cpu = load_profile("cpu-local")
    for name in ("xla", "xla-overlap"):
        buckets, note = bucket_rules(name, GRADIENTS, {}, cpu)
        assert buckets == (tuple(g for g, _ in GRADIENTS),) and "XLA:CPU" in note


def test_ddp_packs_up_to_25_mb_after_a_first_bucket_of_1_mb():
    buckets = threshold_buckets(GRADIENTS, 25 * MB, first_bytes=1 * MB)
    assert buckets == (("a",), ("b", "c"), ("d",), ("e",))


def test_xla_gpu_combiner_packs_up_to_30_mb():
    assert threshold_buckets(GRADIENTS, 30 * MB) == (("a", "b", "c"), ("d",), ("e",))


def test_fsdp_units_close_once_they_hold_their_size():
    assert unit_buckets(GRADIENTS, 11 * MB) == (("a", "b", "c"), ("d",), ("e",))
    assert unit_buckets(GRADIENTS, 100 * MB) == (("a", "b", "c", "d", "e"),)


def test_xla_cpu_combines_all_reduces_only():
    kinds = {"a": "reduce-scatter", "c": "reduce-scatter"}
    assert xla_cpu_buckets(GRADIENTS, kinds) == (("a",), ("c",), ("b", "d", "e"))


def test_the_expert_sweep_tries_powers_of_two_from_16_mb_to_the_total():
    assert threshold_sweep(100 * MB) == [16 * MB, 30 * MB, 32 * MB, 64 * MB, 128 * MB]
    assert threshold_sweep(1 * MB) == [16 * MB, 30 * MB]


def test_each_kind_has_its_own_combiner_and_threshold():
    kinds = {"b": "reduce-scatter", "d": "reduce-scatter"}
    thresholds = {"all-reduce": 64 * MB, "reduce-scatter": 1 * MB}
    # all-reduces a, c, e together; reduce-scatters b, d apart; by last member's readiness
    assert kind_threshold_buckets(GRADIENTS, kinds, thresholds) == (
        ("b",), ("d",), ("a", "c", "e"),
    )  # fmt: skip


def test_the_tuned_thresholds_are_the_ones_the_price_finds_fastest():
    def price(buckets) -> float:  # a stand-in for the simulator: 2 buckets are best
        return abs(len(buckets) - 2)

    buckets, thresholds = tuned_buckets(GRADIENTS, {}, price)
    assert len(buckets) == 2 and price(buckets) == 0
    assert buckets == threshold_buckets(GRADIENTS, thresholds["all-reduce"])
    # XLA's default (30 MB) gives 3 buckets here; the sweep moved off it.
    assert len(threshold_buckets(GRADIENTS, 30 * MB)) == 3
    assert thresholds["all-reduce"] != 30 * MB


def test_horovod_sends_what_became_ready_in_each_cycle():
    ready = {"a": 0.2e-3, "b": 0.9e-3, "c": 1.5e-3, "d": 3.1e-3, "e": 3.2e-3}
    assert cycle_buckets(GRADIENTS, ready, 1e-3, 128 * MB) == (("a", "b"), ("c",), ("d", "e"))
    # A small buffer splits a cycle's gradients.
    assert cycle_buckets(GRADIENTS, ready, 1e-3, 25 * MB) == (("a", "b"), ("c",), ("d",), ("e",))


def test_horovod_after_the_compute_sees_every_gradient_in_one_cycle():
    profile = load_profile("horovod-local")
    assert profile.collectives_after_compute and not profile.overlap
    ready = {"a": 0.2e-3, "b": 0.9e-3, "c": 1.5e-3, "d": 3.1e-3, "e": 3.2e-3}
    buckets, note = bucket_rules("horovod-legacy", GRADIENTS, ready, profile)
    assert buckets == threshold_buckets(GRADIENTS, 64 * MB) == (("a", "b", "c", "d", "e"),)
    assert "every gradient in one cycle" in note
    # Where collectives run as gradients become ready, the cycles split them.
    in_step = load_profile("cpu-local")
    assert not in_step.collectives_after_compute
    assert bucket_rules("horovod", GRADIENTS, ready, in_step)[0] == (
        ("a", "b"), ("c",), ("d", "e"),
    )  # fmt: skip


def test_mgwfbp_merges_when_waiting_costs_less_than_a_start_up():
    gradients = [("a", 1000), ("b", 1000), ("c", 1000)]

    def comm(size: int) -> float:
        return 1e-3 + size * 1e-9

    # b is ready 0.5 ms after a: less than alpha (1 ms), so it joins a's bucket;
    # c is ready 5 ms later, after that bucket is long done: a bucket of its own.
    ready = {"a": 0.0, "b": 0.5e-3, "c": 5.5e-3}
    assert mgwfbp_buckets(gradients, ready, comm, alpha_s=1e-3) == (("a", "b"), ("c",))
    # With a negligible alpha every gradient goes alone.
    assert mgwfbp_buckets(gradients, ready, comm, alpha_s=1e-9) == (("a",), ("b",), ("c",))


@pytest.mark.parametrize("cluster", ["cpu-local", "a100-2x8-100g"])
def test_every_baseline_simulates_on_a_captured_step(module_files, cluster):
    # One run simulates every baseline (XLA compiles the module once for all).
    results = simulate_plans(module_files["jax_pmap_step"], cluster, BASELINES)
    assert results["none"]["buckets"] == 4
    assert results["xla-nocombine"]["buckets"] == 4
    # XLA's fusion leaves fewer kernels than no fusion at all.
    assert results["xla"]["kernels"] < results["none"]["kernels"]
    if cluster == "cpu-local":
        assert "combined all-reduce" in results["xla"]["plan_note"]
        assert results["xla"]["collectives"] == 1  # the loss mean is combined too
        assert results["xla-tuned"]["buckets"] == results["xla"]["buckets"]
    else:
        assert "30 MB" in results["xla"]["plan_note"]
        # The sweep starts from XLA's default threshold: never slower than it.
        assert "swept thresholds" in results["xla-tuned"]["plan_note"]
        assert results["xla-tuned"]["iteration_s"] <= results["xla-overlap"]["iteration_s"]
    for plan, summary in results.items():
        assert summary["iteration_s"] > 0 and summary["plan"] == plan


def test_a_rule_bucket_is_cut_before_a_gradient_computed_from_a_reduced_one():
    from disco_xla.hlo.hlo_io import module_from_text
    from disco_xla.plan import Plan, verify_plan
    from disco_xla.search.baselines import legal_buckets, with_buckets
    from tests.simulator.test_incremental import DEPENDENT_GRADIENTS

    module = module_from_text(DEPENDENT_GRADIENTS)
    cut = legal_buckets(module, (("mean1", "mean2", "mean3"),))
    assert cut == (("mean1",), ("mean2", "mean3"))
    verify_plan(with_buckets(Plan.unfused(module), cut), module)


def test_maxtext_thresholds_exist_for_h100_nodes_of_8_at_the_published_scales():
    from disco_xla.search.baselines import MAXTEXT_A3_LLAMA2_7B, baseline_names, maxtext_thresholds

    at_32 = maxtext_thresholds(load_profile("h100-32x8-ib400"))
    assert at_32 == {"all-reduce": 1024 * MB, "all-gather": 128 * MB, "reduce-scatter": 128 * MB}
    assert maxtext_thresholds(load_profile("h100-32x8-eth100")) == at_32  # the scale's values
    assert maxtext_thresholds(load_profile("h100-128x8-ib400")) == MAXTEXT_A3_LLAMA2_7B[128]
    for other in ("h200-32x8-ib400", "a100-2x8-100g", "cpu-local"):  # no MaxText A3 script
        profile = load_profile(other)
        assert maxtext_thresholds(profile) is None
        assert baseline_names(profile) == BASELINES
    names = baseline_names(load_profile("h100-32x8-ib400"))
    assert names[names.index("xla-tuned") + 1] == "maxtext"
    # Its buckets are XLA's combiners at those thresholds, kind by kind.
    kinds = {"a": "all-reduce", "b": "reduce-scatter", "c": "all-reduce", "d": "all-reduce"}
    sizes = [("a", 600 * MB), ("b", 100 * MB), ("c", 300 * MB), ("d", 200 * MB)]
    buckets, note = bucket_rules("maxtext", sizes, {}, load_profile("h100-32x8-ib400"), kinds)
    assert buckets == (("b",), ("a", "c"), ("d",))
    assert "MaxText's A3 thresholds for 32 VMs" in note


def test_the_maxtext_baseline_through_the_cli_and_its_one_line_refusal(module_files):
    path = module_files["jax_pmap_step"]
    results = simulate_plans(path, "h100-32x8-ib400", ["xla-overlap", "maxtext"])
    assert "MaxText's A3 thresholds for 32 VMs" in results["maxtext"]["plan_note"]
    assert results["maxtext"]["kernels"] == results["xla-overlap"]["kernels"]
    refused = run_cli("simulate", path, "--cluster", "h200-32x8-ib400", "--plan", "maxtext")
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "h200-32x8-ib400" in refused.stderr and "MaxText" in refused.stderr
