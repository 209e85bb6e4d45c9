"""`disco-xla apply` as a user runs it: a plan applied and the result verified,
and a plan for another module refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from disco_xla import load_module, save_module
from disco_xla.plan import Plan
from disco_xla.zoo.tf_steps import build_tf_step, capture_tf_step
from tests.conftest import run_cli


def two_bucket_plan(module) -> Plan:
    plan = Plan.unfused(module)
    names = [n for bucket in plan.all_reduce_buckets for n in bucket]
    middle = len(names) // 2
    return dataclasses.replace(
        plan, all_reduce_buckets=(tuple(names[:middle]), tuple(names[middle:]))
    )


@pytest.fixture(scope="module")
def tf_step_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf") / "bert.hlo.pb"
    save_module(capture_tf_step(build_tf_step("bert_encoder", "tiny", batch=2), replicas=2), path)
    return str(path)


@pytest.mark.parametrize(("source", "devices"), [("jax", 4), ("tf", 2)])
def test_apply_then_verify(module_files, tf_step_file, tmp_path, source, devices):
    original = module_files["jax_pmap_step"] if source == "jax" else tf_step_file
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(two_bucket_plan(load_module(original)).to_json())
    rewritten = tmp_path / "rewritten.hlo.pb"
    applied = run_cli(
        "apply",
        original,
        str(plan_path),
        "-o",
        str(rewritten),
        "--buckets-only",
        "--no-check",
        timeout_s=300,
    )
    assert applied.returncode == 0, applied.stderr[-2000:]
    assert "the plan's buckets alone; not checked" in applied.stdout
    assert len(load_module(rewritten).gradient_all_reduces) == 2
    verified = run_cli(
        "verify",
        original,
        str(rewritten),
        "--devices",
        str(devices),
        "--rounds",
        "3",
        "--json",
        timeout_s=300,
    )
    assert verified.returncode == 0, verified.stderr[-2000:]
    report = json.loads(verified.stdout)
    assert report["equal"] is True and report["tolerance_used"] <= 1.0
    assert report["original_s"] > 0 and report["rewritten_s"] > 0


def test_apply_refuses_a_plan_for_another_module(module_files, tmp_path):
    plan_path = tmp_path / "other.json"
    plan_path.write_text(Plan.unfused(load_module(module_files["jax_shard_map_step"])).to_json())
    result = run_cli(
        "apply", module_files["jax_pmap_step"], str(plan_path), "-o", str(tmp_path / "x.pb")
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "another module" in result.stderr
