"""XLA:GPU's windowed einsum in the expert's baseline and flags: which
collectives a threshold splits, into how many windows, the threshold kept only
where it simulates faster, and the flag that `--xla-flags` prints for it. On
the tiny Llama FSDP step (its MLP activations gathered before their dots),
priced on an H100 node."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo.collectives import collective_bytes
from disco_xla.plan import verify_plan
from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
from disco_xla.search.baselines import captured_baselines
from disco_xla.search.chunking import chunk_candidates
from disco_xla.search.windowed_einsum import (
    MIB,
    WINDOWED_EINSUM_FLAG,
    tuned_windowed_einsum,
    windowed_plan,
    windows,
    with_windowed_einsum,
)
from disco_xla.search.xla_flags import XlaFlags
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.events import simulate
from disco_xla.simulator.profiles import load_profile


@pytest.fixture(scope="module")
def tuned(fsdp_step):
    from disco_xla.driver.planning import prepared

    module = prepared(fsdp_step)
    profile = dataclasses.replace(load_profile("h100-32x8-ib400"), nodes=1)
    cost_model = make_cost_model("auto", profile)
    compiled = compile_module(module, NO_COMBINER)
    baselines = captured_baselines(module, compiled, profile, cost_model, ("xla-tuned",))
    return module, profile, cost_model, baselines["xla-tuned"]


def test_a_window_a_device_or_the_largest_count_that_divides():
    split = type("Split", (), {"allows": lambda self, n: 12 % n == 0})()
    assert windows(split, 4) == 4
    assert windows(split, 8) == 4  # 12 rows: 8 windows do not divide them
    assert windows(split, 3) == 2
    assert windows(split, 1) == 0


def test_a_threshold_splits_exactly_the_collectives_at_or_above_it(tuned):
    module, _, _, baseline = tuned
    plan = dataclasses.replace(baseline.plan, chunked_collectives=())
    candidates = chunk_candidates(module, plan)
    assert candidates  # the MLP's gathered activations
    sizes = sorted(collective_bytes(s.collective) for s in candidates)
    everything = windowed_plan(module, plan, 0)
    verify_plan(everything, module)
    split = dict(everything.chunked_collectives)
    assert set(split) == {s.collective.name for s in candidates}
    assert all(chunks == 4 for chunks in split.values())  # the FSDP group of 4
    assert windowed_plan(module, plan, sizes[-1] + 1) == plan


def test_the_threshold_is_kept_only_where_it_simulates_faster(tuned):
    module, profile, cost_model, baseline = tuned
    plain = dataclasses.replace(
        baseline, plan=dataclasses.replace(baseline.plan, chunked_collectives=())
    )
    chosen = with_windowed_einsum(plain, profile, cost_model)
    chosen_s = simulate(chosen.task_graph(), profile, cost_model).iteration_s
    for threshold in (0, MIB):
        trial = dataclasses.replace(plain, plan=windowed_plan(module, plain.plan, threshold))
        assert chosen_s <= simulate(trial.task_graph(), profile, cost_model).iteration_s
    assert chosen_s <= simulate(plain.task_graph(), profile, cost_model).iteration_s
    assert ("windowed einsum from" in chosen.note) == bool(chosen.plan.chunked_collectives)


def test_the_fastest_threshold_wins_and_a_tie_keeps_it_off(tuned):
    module, _, _, baseline = tuned
    plan = dataclasses.replace(baseline.plan, chunked_collectives=())
    found, mib, seconds = tuned_windowed_einsum(
        module, plan, lambda p: 1.0 - 0.1 * len(p.chunked_collectives)
    )
    assert mib == 0 and found == windowed_plan(module, plan, 0)
    assert seconds == pytest.approx(1.0 - 0.1 * len(found.chunked_collectives))
    same, off, _ = tuned_windowed_einsum(module, plan, lambda p: 1.0)
    assert off is None and same == plan


def test_the_flags_print_the_threshold_and_their_program_splits_from_it(tuned):
    module, _, _, baseline = tuned
    xla_fusion = dataclasses.replace(baseline.plan, chunked_collectives=())
    flags = XlaFlags({}, baseline.plan.all_reduce_buckets, 0.0, windowed_einsum_mib=0)
    assert f"{WINDOWED_EINSUM_FLAG}=0" in flags.flags.split()
    assert flags.plan(module, xla_fusion).chunked_collectives
    off = dataclasses.replace(flags, windowed_einsum_mib=None)
    assert WINDOWED_EINSUM_FLAG not in off.flags
    assert not off.plan(module, xla_fusion).chunked_collectives
