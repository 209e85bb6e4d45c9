"""Sampled plans are legal, and every group of a plan gets a measured time."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from disco_xla.costmodel.dataset import from_samples, load_dataset, save_dataset
from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.plan import EXPENSIVE_OPCODES, Plan, verify_plan
from disco_xla.profiling.sample_plans import (
    measure_plan,
    measure_xla_compiled,
    random_merge_plan,
    sample_plans,
)
from disco_xla.search.backtracking import greedy_fusion_plan


@pytest.fixture(scope="module")
def step_module(captured) -> HloModule:
    return HloModule.from_bytes(captured["jax_pmap_step"][0])


@pytest.fixture(scope="module")
def samples(step_module):
    """XLA's compile and three sampled plans of the demo step, measured."""
    measured = measure_xla_compiled(step_module, "demo.tiny", "demo", repeats=3)
    for kind, plan in sample_plans(step_module, 3, seed=1):
        measured += measure_plan(step_module, plan, kind, "demo.tiny", "demo", repeats=3)
    return measured


def test_sampled_plans_are_legal_and_include_fusions_beyond_the_bases(step_module):
    plans = sample_plans(step_module, 6, seed=0)
    assert [kind for kind, _ in plans[:2]] == ["xla-like", "unfused"]
    for _, plan in plans:
        verify_plan(plan, step_module)
    bases = {frozenset(plans[0][1].fusion_groups), frozenset(plans[1][1].fusion_groups)}
    new_groups = {g for _, p in plans[2:] for g in p.fusion_groups} - set().union(*bases)
    assert new_groups, "random merges made no group the two base plans lack"


@pytest.mark.parametrize("model", ["gpt2_small", "resnet50"])
def test_many_random_merges_never_create_a_cycle(model):
    from disco_xla.zoo import capture_model

    module = capture_model(model, "jax", replicas=4).module
    for seed in range(3):
        for base in (greedy_fusion_plan(module), Plan.unfused(module)):
            plan = random_merge_plan(base, module, 300, random.Random(seed))
            assert len(plan.fusion_groups) < len(base.fusion_groups)
            verify_plan(plan, module, source=f"{model} seed {seed}")


def test_every_group_of_a_plan_gets_a_positive_time(step_module, samples):
    kinds = {s.plan_kind for s in samples}
    assert kinds == {"xla-compiled", "xla-like", "unfused", "random"}
    assert all(s.time_s > 0 for s in samples)
    assert any(s.kernel_count > 0 for s in samples)
    xla_like = [s for s in samples if s.plan_kind == "xla-like"]
    groups = greedy_fusion_plan(step_module).fusion_groups
    assert 0 < len(xla_like) <= len(groups)
    # A fused group is one sample whose graph has all of the group's instructions;
    # groups with a dot or convolution stay out of calls (a call slows them down),
    # so their samples come from XLA's own compile.
    by_name = {i.name: i for i in step_module.instructions()}
    outlined = [g for g in groups if not any(by_name[n].opcode in EXPENSIVE_OPCODES for n in g)]
    assert len(outlined) < len(groups)
    largest = max(xla_like, key=lambda s: s.graph.node_count)
    assert largest.graph.node_count == max(len(g) for g in outlined)
    assert not {"dot", "convolution"} & set(largest.graph.opcodes)
    assert largest.graph.edge_count >= 1


def test_every_sample_keeps_the_speed_reference_taken_around_its_plan(samples, tmp_path):
    references = np.array([s.reference_s for s in samples])
    assert np.all(np.isfinite(references) & (references > 0))
    # One reference per plan measured: XLA's compile and the three sampled plans.
    assert 1 <= len(set(references.tolist())) <= 4
    path = str(tmp_path / "kernels.npz")
    save_dataset(from_samples(samples), path)
    np.testing.assert_array_equal(load_dataset(path).reference_s, references)


def test_speed_normalised_times_follow_the_reference(samples):
    from disco_xla.profiling.speed_reference import reference_seconds, speed_normalised

    reference = reference_seconds("cpu", runs=3)
    assert 0 < reference < 5.0
    # One measured kernel timed twice, once on a machine twice as slow: once
    # normalised, both are at the nominal speed.
    measured = samples[0]
    fast = replace(measured, reference_s=reference)
    slow = replace(measured, time_s=2 * measured.time_s, reference_s=2 * reference)
    normalised = speed_normalised(from_samples([slow, fast]), nominal_s=reference)
    np.testing.assert_allclose(normalised.time_s, [measured.time_s] * 2)
    by_median = speed_normalised(from_samples([slow, fast]))
    np.testing.assert_allclose(by_median.time_s, [1.5 * measured.time_s] * 2)


def test_a_schema_3_data_set_loads_without_a_reference_and_cannot_be_normalised(samples, tmp_path):
    from disco_xla.profiling.speed_reference import speed_normalised

    dataset = from_samples(samples)
    old = tmp_path / "old.npz"
    arrays = {k: getattr(dataset, k) for k in dataset.__dataclass_fields__ if k != "reference_s"}
    np.savez_compressed(old, schema=np.array("disco-xla-kernels/3"), **arrays)
    loaded = load_dataset(str(old))
    np.testing.assert_array_equal(loaded.time_s, dataset.time_s)
    assert np.all(np.isnan(loaded.reference_s))
    with pytest.raises(DiscoInputError, match=r"old\.npz.*no speed reference"):
        speed_normalised(loaded, source=str(old))
