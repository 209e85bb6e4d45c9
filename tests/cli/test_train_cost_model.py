"""`disco-xla train-cost-model` as a user runs it: a model directory written with
the feature set asked for, and a data set of another schema refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from disco_xla.costmodel.network import GnnCostModel
from tests.conftest import run_cli
from tests.costmodel.kernel_data import write_demo_dataset


@pytest.fixture(scope="module")
def dataset_file(captured, tmp_path_factory) -> str:
    return write_demo_dataset(captured, str(tmp_path_factory.mktemp("kernels") / "demo.npz"))


def test_train_command_writes_a_model_that_loads(dataset_file, tmp_path):
    model_dir = tmp_path / "model"
    trained = run_cli(
        "train-cost-model", dataset_file, "--out", str(model_dir), "--epochs", "1", "--json",
        "--feature-set", "3", timeout_s=300,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["epochs"] == 1
    config = json.loads((model_dir / "config.json").read_text())
    assert config["network"]["feature_set"] == 3
    assert GnnCostModel.load(model_dir).config.feature_set == 3


def test_train_command_refuses_a_data_set_of_another_schema_in_one_line(tmp_path):
    other_schema = tmp_path / "old.npz"
    np.savez(other_schema, schema=np.array("disco-xla-kernels/0"))
    result = run_cli("train-cost-model", str(other_schema), "--out", str(tmp_path / "m"))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
