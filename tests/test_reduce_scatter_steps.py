"""Gradients sent by reduce-scatter (a ZeRO-style step: `psum_scatter` of the
gradients, each device updates its shard, `all_gather` of the new parameters)
are bucketed like all-reduces: one concatenated reduce-scatter that gives each
device its own block of every gradient, simulated as a reduce-scatter, checked
against the plan and equal to the original, through the CLI and `disco_xla.jit`."""

from __future__ import annotations

import dataclasses
import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import disco_xla
from disco_xla import capture_jax, save_module
from disco_xla.plan import Plan, verify_plan
from disco_xla.runtime.apply import apply_plan
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.simulator.comm import collective_s
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli, simulate_plans

DEVICES = 4
# The dimension each parameter's gradient is scattered over: not always the first.
SCATTERED = {"w1": 1, "w2": 0, "w3": 0}


def _loss(params, x):
    hidden = jnp.tanh(x @ params["w1"])
    return jnp.mean((jnp.tanh(hidden @ params["w2"]) @ params["w3"]) ** 2)


@partial(jax.pmap, axis_name="devices")
def zero_step(params, x):
    """Reduce-scatter the gradients, update this device's shard, gather them back."""
    grads = jax.grad(_loss)(params, x)
    index = jax.lax.axis_index("devices")
    new = {}
    for name, grad in grads.items():
        dimension = SCATTERED[name]
        shard = jax.lax.psum_scatter(grad, "devices", scatter_dimension=dimension, tiled=True)
        size = shard.shape[dimension]
        mine = jax.lax.dynamic_slice_in_dim(params[name], index * size, size, dimension)
        updated = mine - 0.1 * shard / DEVICES
        new[name] = jax.lax.all_gather(updated, "devices", axis=dimension, tiled=True)
    return new


def _arguments():
    rng = np.random.default_rng(0)
    shapes = {"w1": (16, 8), "w2": (8, 8), "w3": (8, 4)}
    params = {
        k: jnp.asarray(np.broadcast_to(rng.standard_normal(s), (DEVICES, *s)), jnp.float32)
        for k, s in shapes.items()
    }
    x = jnp.asarray(rng.standard_normal((DEVICES, 4, 16)), jnp.float32)
    return params, x


@pytest.fixture(scope="module")
def module():
    return capture_jax(zero_step, *_arguments())


def one_bucket(module) -> Plan:
    plan = Plan.unfused(module)
    names = tuple(name for bucket in plan.all_reduce_buckets for name in bucket)
    return dataclasses.replace(plan, all_reduce_buckets=(names,))


def test_the_gradient_reduce_scatters_are_found(module):
    gradients = module.gradient_all_reduces
    assert [a.kind for a in gradients] == ["reduce-scatter"] * 3
    # The bytes are the whole gradient's, what the communication model reads.
    assert sorted(a.bytes for a in gradients) == sorted(4 * n for n in (16 * 8, 8 * 8, 8 * 4))


def test_one_bucket_is_one_reduce_scatter_and_bit_equal(module):
    plan = one_bucket(module)
    verify_plan(plan, module)
    rewritten = apply_plan(module, plan, fusion=False)  # checks the compiled collectives
    scatters = [a for a in rewritten.all_reduces if a.kind == "reduce-scatter"]
    assert len(scatters) == 1 and scatters[0].is_gradient
    verdict = verify_rewrite(module, rewritten, DEVICES)
    assert verdict.bit_equal, verdict


def test_a_bucket_never_mixes_reduce_scatters_and_all_reduces():
    def step(params, x):
        grads = jax.grad(_loss)(params, x)
        return {
            "w1": jax.lax.psum_scatter(grads["w1"], "d", scatter_dimension=0, tiled=True),
            "w2": jax.lax.psum(grads["w2"], "d"),
            "w3": jax.lax.psum(grads["w3"], "d"),
        }

    module = capture_jax(jax.pmap(step, axis_name="d"), *_arguments())
    kinds = {a.name: a.kind for a in module.gradient_all_reduces}
    assert sorted(kinds.values()) == ["all-reduce", "all-reduce", "reduce-scatter"]
    with pytest.raises(disco_xla.DiscoInputError, match="bucket"):
        verify_plan(one_bucket(module), module)


def test_the_simulator_sends_the_bucket_as_a_reduce_scatter(module):
    profile = load_profile("a100-2x8-100g")
    graph = build_task_graph(module, one_bucket(module))
    (bucket,) = [n for n, is_bucket in enumerate(graph.is_bucket) if is_bucket]
    assert graph.communication_kind(bucket) == "reduce-scatter"
    size = graph.communications[bucket][1]
    assert size == sum(a.bytes for a in module.gradient_all_reduces)
    result = simulate(graph, profile, RooflineCostModel(profile))
    (span,) = [s for s in result.spans if s[0] == graph.communications[bucket][0]]
    assert span[4] - span[3] == pytest.approx(collective_s("reduce-scatter", size, profile))


def test_every_verb_works_on_the_step(module, tmp_path):
    path = str(tmp_path / "zero.hlo.pb")
    save_module(module, path)
    summary = json.loads(run_cli("inspect", "--json", path).stdout)
    assert summary["reduce_scatters"] == 3 and summary["gradient_all_reduces"] == 3
    simulate_plans(path, "cpu-local", ("none", "xla", "ddp", "mgwfbp"))
    plan_path = tmp_path / "one.plan.json"
    plan_path.write_text(one_bucket(module).to_json())
    out = str(tmp_path / "applied.hlo.pb")
    applied = run_cli("apply", path, str(plan_path), "-o", out)
    assert applied.returncode == 0, applied.stderr
    verified = run_cli("verify", path, out, "--devices", str(DEVICES), "--json")
    assert verified.returncode == 0, verified.stderr
    assert json.loads(verified.stdout)["equal"]


def test_disco_xla_jit_runs_the_step_optimised_and_equal(tmp_path):
    params, x = _arguments()
    optimized = disco_xla.jit(
        zero_step, cache_dir=str(tmp_path), max_evaluations=10, check_speed=False, background=False
    )
    got = optimized(params, x)
    (status,) = optimized.status()
    assert status.startswith("optimized"), status
    expected = zero_step(params, x)
    for name in expected:
        np.testing.assert_allclose(np.asarray(got[name]), np.asarray(expected[name]), rtol=1e-6)


def test_xla_baselines_combine_each_kind_as_xla_does(module):
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search.baselines import captured_baselines

    compiled = compile_module(module, NO_COMBINER)
    found = {}
    for cluster in ("cpu-local", "a100-2x8-100g"):
        profile = load_profile(cluster)
        baselines = captured_baselines(module, compiled, profile, RooflineCostModel(profile))
        found[cluster] = baselines["xla"].plan.all_reduce_buckets
        for baseline in baselines.values():
            verify_plan(baseline.plan, module)
            simulate(baseline.task_graph(), profile, RooflineCostModel(profile))
    # XLA:CPU has no reduce-scatter combiner; XLA:GPU's combines up to 30 MB.
    assert [len(bucket) for bucket in found["cpu-local"]] == [1, 1, 1]
    assert [len(bucket) for bucket in found["a100-2x8-100g"]] == [3]
