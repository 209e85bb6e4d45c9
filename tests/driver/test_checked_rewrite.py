"""`checked_rewrite`: the rewrite behind `disco-xla optimize -o` and `apply`,
which never writes a slower or different program (run as a user runs them, on a
tiny conv net with a depthwise convolution)."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from disco_xla import load_module
from disco_xla.plan import Plan
from tests.conftest import run_cli

DEVICES = 4


def depthwise_conv_step():
    """A pmap'd SGD step of conv 3x3 -> depthwise conv 3x3 -> relu -> mean ->
    dense, one pmean per gradient: (fn, args)."""
    rng = np.random.default_rng(0)
    params = {
        "conv": rng.standard_normal((3, 3, 4, 8)).astype(np.float32) * 0.2,
        "depthwise": rng.standard_normal((3, 3, 1, 8)).astype(np.float32) * 0.2,
        "dense": rng.standard_normal((8, 3)).astype(np.float32) * 0.2,
    }
    numbers = ("NHWC", "HWIO", "NHWC")

    def loss_fn(params, images, labels):
        x = jax.lax.conv_general_dilated(
            images, params["conv"], (1, 1), "SAME", dimension_numbers=numbers
        )
        x = jax.lax.conv_general_dilated(
            x,
            params["depthwise"],
            (1, 1),
            "SAME",
            dimension_numbers=numbers,
            feature_group_count=8,
        )
        logits = jnp.mean(jax.nn.relu(x), axis=(1, 2)) @ params["dense"]
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(logits) * labels, axis=-1))

    def step(params, images, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
        grads = jax.tree_util.tree_map(lambda g: jax.lax.pmean(g, "data"), grads)
        updated = jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, params, grads)
        return updated, jax.lax.pmean(loss, "data")

    replicated = jax.tree_util.tree_map(lambda x: np.stack([x] * DEVICES), params)
    images = rng.standard_normal((DEVICES, 2, 8, 8, 4)).astype(np.float32)
    labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, (DEVICES, 2))]
    fn = jax.pmap(step, axis_name="data", devices=jax.devices()[:DEVICES])
    return fn, (replicated, images, labels)


@pytest.fixture(scope="module")
def conv_step_file(tmp_path_factory):
    fn, args = depthwise_conv_step()
    path = tmp_path_factory.mktemp("conv") / "depthwise.hlo.pb"
    path.write_bytes(fn.lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto())
    return str(path)


def _apply(module_file: str, plan: Plan, tmp_path, *options: str) -> tuple[dict, str]:
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(plan.to_json())
    output = str(tmp_path / "written.hlo.pb")
    result = run_cli("apply", module_file, str(plan_path), "-o", output, *options, timeout_s=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout) if "--json" in options else result.stdout, output


def _assert_the_rule_holds(report: dict) -> None:
    """What was written is equal and faster than the original (or is the
    original), and no candidate that was not written was equal and faster."""
    measured = report["measured"]
    original_s, written = measured["original_s"], report["written"]
    candidates = measured["candidates"]
    if written != "original":
        assert candidates[written]["equal"] and candidates[written]["seconds"] < original_s
        assert measured["written_s"] == candidates[written]["seconds"]
    best_s = measured["written_s"]
    for label, entry in candidates.items():
        if label != written and "error" not in entry and entry["equal"]:
            assert entry["seconds"] >= min(best_s, original_s)


def test_xla_fusion_through_the_rewrite_is_the_unchanged_program(conv_step_file, tmp_path):
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search.xla_fusion import xla_fusion_plan

    module = load_module(conv_step_file)
    own = xla_fusion_plan(module, compile_module(module, NO_COMBINER))
    assert any(i.opcode == "convolution" for i in module.instructions())
    report, _ = _apply(conv_step_file, own, tmp_path, "--json")
    plan = report["measured"]["candidates"]["plan"]
    # XLA's own fusion and one all-reduce per gradient: bit-equal to XLA's program.
    assert plan["equal"] and plan["max_rel_diff"] == 0.0
    assert "buckets" not in report["measured"]["candidates"]  # the same program
    _assert_the_rule_holds(report)


def test_apply_never_writes_a_slower_or_different_program(conv_step_file, tmp_path):
    module = load_module(conv_step_file)
    unfused = Plan.unfused(module)  # every op its own kernel: hundreds of boundaries
    gradients = [name for bucket in unfused.all_reduce_buckets for name in bucket]
    plan = dataclasses.replace(unfused, all_reduce_buckets=(tuple(gradients),))
    report, written_path = _apply(conv_step_file, plan, tmp_path, "--json")
    assert set(report["measured"]["candidates"]) == {"plan", "buckets"}
    _assert_the_rule_holds(report)
    verified = run_cli(
        "verify",
        conv_step_file,
        written_path,
        "--devices",
        str(DEVICES),
        "--json",
        timeout_s=300,
    )
    assert verified.returncode == 0 and json.loads(verified.stdout)["equal"]
    # Without --json: one line that says what was written and why.
    stdout, _ = _apply(conv_step_file, plan, tmp_path)
    (line,) = stdout.splitlines()
    assert line.startswith("wrote ") and "speed" in line


def test_no_check_and_buckets_only(conv_step_file, tmp_path):
    plan = Plan.unfused(load_module(conv_step_file))
    report, written_path = _apply(conv_step_file, plan, tmp_path, "--no-check", "--json")
    assert report == {"written": "plan", "measured": None}
    assert any(i.opcode == "call" for i in load_module(written_path).instructions())
    report, _ = _apply(conv_step_file, plan, tmp_path, "--buckets-only", "--json")
    assert set(report["measured"]["candidates"]) == {"buckets"}
    _assert_the_rule_holds(report)


def test_bad_rounds_give_one_line_and_exit_2(conv_step_file, tmp_path):
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(Plan.unfused(load_module(conv_step_file)).to_json())
    result = run_cli(
        "apply", conv_step_file, str(plan_path), "-o", str(tmp_path / "x.pb"), "--rounds", "0"
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "--rounds" in result.stderr and conv_step_file in result.stderr


# A module that XLA compiles but cannot run on this machine's CPU devices.
UNRUNNABLE = """
HloModule unrunnable, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  x = f32[4]{0} parameter(0)
  y = f32[4]{0} custom-call(x), custom_call_target="no_such_target_anywhere"
  ROOT r = f32[4]{0} all-reduce(y), replica_groups={}, to_apply=add
}
"""


def test_a_module_that_cannot_run_here_is_written_unmeasured_and_says_so(tmp_path):
    module_path = tmp_path / "unrunnable.txt"
    module_path.write_text(UNRUNNABLE)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(Plan.unfused(load_module(str(module_path))).to_json())
    output = tmp_path / "x.pb"
    result = run_cli("apply", str(module_path), str(plan_path), "-o", str(output))
    assert result.returncode == 0, result.stderr[-1500:]
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith(f"wrote {output}: ") and "not measured" in line
    assert "no_such_target_anywhere" in line  # why: XLA has no handler for it here
    written = load_module(str(output))
    (call,) = [i for i in written.instructions() if i.opcode == "custom-call"]
    assert call.proto.custom_call_target == "no_such_target_anywhere"


# Two gradients that compute the same value: XLA's CSE sends one all-reduce for
# both (as for the offset gradients of a resnet block's last batch norm and of
# its shortcut's batch norm).
EQUAL_GRADIENTS = """
HloModule equal_gradients, replica_count=2

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[256] parameter(0)
  w1 = f32[256] parameter(1)
  w2 = f32[256] parameter(2)
  w3 = f32[256] parameter(3)
  forward = f32[256] tanh(x)
  grad1 = f32[256] multiply(forward, w1)
  grad2 = f32[256] exponential(forward)
  grad3 = f32[256] exponential(forward)
  mean1 = f32[256] all-reduce(grad1), replica_groups={{0,1}}, to_apply=sum
  mean2 = f32[256] all-reduce(grad2), replica_groups={{0,1}}, to_apply=sum
  mean3 = f32[256] all-reduce(grad3), replica_groups={{0,1}}, to_apply=sum
  update1 = f32[256] subtract(w1, mean1)
  update2 = f32[256] subtract(w2, mean2)
  update3 = f32[256] subtract(w3, mean3)
  ROOT out = (f32[256], f32[256], f32[256]) tuple(update1, update2, update3)
}
"""


def test_a_bucket_that_takes_one_of_two_equal_gradients_still_rewrites(tmp_path):
    from disco_xla.errors import RewriteError
    from disco_xla.runtime.apply import apply_plan
    from disco_xla.runtime.collective_census import check_all_reduces
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module

    module_path = tmp_path / "equal.txt"
    module_path.write_text(EQUAL_GRADIENTS)
    module = load_module(str(module_path))
    assert len(compile_module(module, NO_COMBINER).all_reduces) == 2  # XLA merged two
    # The bucket takes one of the equal pair; the other is then sent on its own.
    plan = dataclasses.replace(
        Plan.unfused(module), all_reduce_buckets=(("mean1", "mean2"), ("mean3",))
    )
    rewritten = apply_plan(module, plan, fusion=False)
    compiled = compile_module(rewritten, NO_COMBINER)
    sizes = [compiled.instruction(a.name).shape.elements for a in compiled.all_reduces]
    assert sorted(sizes) == [256, 512]
    # The check still refuses a program without the plan's bucket.
    with pytest.raises(RewriteError, match="the plan asks for"):
        check_all_reduces(module, plan, compile_module(module, NO_COMBINER))
    # As a user applies it: written, equal to the original, or the original kept.
    report, _ = _apply(str(module_path), plan, tmp_path, "--buckets-only", "--json")
    assert "error" not in report["measured"]["candidates"]["buckets"]
    assert report["measured"]["candidates"]["buckets"]["equal"]
    _assert_the_rule_holds(report)
