"""`disco-xla capture` as a user runs it: a TF step captured in data-parallel
form, and forms and precisions a model was not written for refused."""

from __future__ import annotations

import json

import pytest

from disco_xla.zoo.jax_steps import BF16_MODELS, build_jax_step
from tests.conftest import run_cli


def test_capture_from_the_cli_refuses_a_form_it_was_not_written_for(tmp_path):
    result = run_cli("capture", "--model", "llama", "--mode", "pmap", "-o", str(tmp_path / "x"))
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--mode sharded" in result.stderr


def test_models_without_a_bf16_variant_are_refused_in_one_line(tmp_path):
    assert "resnet50" not in BF16_MODELS
    result = run_cli(
        "capture", "--model", "resnet50", "--precision", "bf16", "-o", str(tmp_path / "x.pb")
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "resnet50" in result.stderr
    with pytest.raises(ValueError, match="batch norm"):
        build_jax_step("resnet50", precision="bf16", concrete=False)


def test_capture_cli_for_tf_writes_a_data_parallel_module(tmp_path):
    path = tmp_path / "bert.hlo.pb"
    result = run_cli(
        "capture",
        "--model",
        "bert_encoder",
        "--framework",
        "tf",
        "--replicas",
        "2",
        "-o",
        str(path),
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "40 gradient all-reduces for 40 parameter tensors" in result.stdout
    summary = json.loads(run_cli("inspect", str(path), "--json").stdout)
    assert summary["gradient_all_reduces"] == 40
