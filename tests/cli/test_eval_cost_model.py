"""`disco-xla eval-cost-model` as a user runs it: the GNN's and the roofline's
error figures on a data set, and a missing or broken model refused in one line."""

from __future__ import annotations

import json

import pytest

from disco_xla.costmodel.weights import default_model_directory
from tests.conftest import run_cli
from tests.costmodel.kernel_data import write_demo_dataset

FIGURES = {"mape", "median_ape", "kendall_tau", "level", "mape_at_level"}


@pytest.fixture(scope="module")
def dataset_file(captured, tmp_path_factory) -> str:
    return write_demo_dataset(captured, str(tmp_path_factory.mktemp("kernels") / "demo.npz"))


def test_eval_command_gives_the_gnns_and_the_rooflines_errors(dataset_file):
    model_dir = default_model_directory()  # the shipped CPU weights
    result = run_cli("eval-cost-model", dataset_file, "--model", str(model_dir), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["samples"] > 0
    for name in ("gnn", "roofline"):
        assert set(report[name]) >= FIGURES
        assert report[name]["mape"] >= 0


def test_eval_command_errors_are_one_line_with_exit_code_2(dataset_file, tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("[]")
    for model_dir in (tmp_path / "absent", tmp_path / "broken"):
        result = run_cli("eval-cost-model", dataset_file, "--model", str(model_dir))
        assert result.returncode == 2, (model_dir, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1
