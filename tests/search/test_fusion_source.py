"""Where XLA's own fusion comes from: its compile here, its after-optimizations
dump (the kernels and the all-reduces a GPU job really ran), or the model of
its rules; run through the CLI as a user with a dump runs it."""

from __future__ import annotations

import json

import pytest

from disco_xla.capture import capture_jax
from disco_xla.driver.planning import prepared
from disco_xla.hlo.hlo_io import load_module, save_module
from disco_xla.plan import verify_plan
from disco_xla.runtime.xla_runner import compile_module, compile_separately
from disco_xla.search.fusion_model import fusion_agreement, modelled_xla_fusion
from disco_xla.search.fusion_source import dumped_buckets, xla_fusion_of
from disco_xla.search.xla_fusion import xla_fusion_plan
from disco_xla.zoo.jax_steps import build_jax_step
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def step():
    built = build_jax_step("gpt2_small", "tiny", replicas=2, global_batch=4)
    return prepared(capture_jax(built.fn, *built.args))


def test_a_dump_gives_xla_s_own_all_reduces_in_its_order(step):
    gradients = {a.name for a in step.gradient_all_reduces}
    separate = dumped_buckets(step, compile_separately(step))
    assert separate is not None and all(len(b) == 1 for b in separate)
    assert {b[0] for b in separate} == gradients
    combined = dumped_buckets(step, compile_module(step))  # XLA:CPU's combiner: one
    assert combined is not None and len(combined) == 1 and set(combined[0]) == gradients


def test_the_model_follows_xla_s_rules_and_mostly_agrees_with_xla(step):
    model = modelled_xla_fusion(step)
    verify_plan(model, step)
    by_name = {i.name: i for i in step.instructions()}
    for group in model.fusion_groups:
        members = [by_name[n] for n in group]
        assert sum(m.opcode in ("dot", "convolution") for m in members) <= 1
        for member in members:  # a reduction fuses into no consumer but a reshape
            if member.opcode == "reduce":
                inside = [u for u in member.users if u.name in group]
                assert all(u.opcode in ("reshape", "bitcast", "broadcast") for u in inside)
    xla = xla_fusion_plan(step, compile_separately(step))
    # benchmarks/fusion_model_agreement.py measured 0.633 on this step.
    assert fusion_agreement(step, xla, model)["agreement"] > 0.6
    assert fusion_agreement(step, xla, xla)["agreement"] == 1.0


def test_without_a_compile_the_fusion_is_modelled_and_says_why(step):
    def refuse(module):
        raise RuntimeError("NOT_FOUND: no handler for __cudnn$fmhaSoftmax")

    fusion = xla_fusion_of(step, refuse)
    assert fusion.source == "model" and "__cudnn$fmhaSoftmax" in fusion.note
    assert fusion.plan == modelled_xla_fusion(step)


def test_the_cli_takes_xla_s_dump_as_its_baselines(step, tmp_path):
    before, after = str(tmp_path / "before.hlo.pb"), str(tmp_path / "after.hlo.pb")
    save_module(step, before)
    save_module(compile_module(step), after)
    assert load_module(after).fingerprint != load_module(before).fingerprint
    result = run_cli(
        "simulate", before, "--cluster", "cpu-local", "--plan", "xla", "--xla-dump", after, "--json"
    )
    assert result.returncode == 0, result.stderr[-1500:]
    summary = json.loads(result.stdout)
    assert "from its dump" in summary["plan_note"] and "XLA's 1 all-reduces" in summary["plan_note"]
    output = str(tmp_path / "plan.json")
    result = run_cli(
        "optimize",
        before,
        "--cluster",
        "cpu-local",
        "--xla-dump",
        after,
        "--max-evals",
        "30",
        "-o",
        output,
        "--json",
    )
    assert result.returncode == 0, result.stderr[-1500:]
    assert json.loads(result.stdout)["fusion_source"] == "dump"
