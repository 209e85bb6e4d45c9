"""The GNN's weights: saved and loaded back, those of older versions read, missing
or corrupt ones refused as bad input, and the shipped ones chosen by the
cluster's device."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from disco_xla.costmodel.network import GnnCostModel, NetworkConfig, featurize
from disco_xla.costmodel.training import evaluate, train
from disco_xla.costmodel.weights import default_model_directory, save_model
from disco_xla.errors import DiscoInputError
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli

FIGURES = {"mape", "median_ape", "kendall_tau", "level", "mape_at_level"}


def test_a_saved_model_loads_and_predicts_the_same(trained, dataset, tmp_path):
    model, report = trained
    save_model(str(tmp_path), model.params, model.config, model.target_mean, model.target_std, {})
    again = GnnCostModel.load(tmp_path)
    features = featurize(dataset)
    np.testing.assert_allclose(
        again.predict_features(features), model.predict_features(features), rtol=1e-5
    )
    figures = evaluate(again, dataset, load_profile("cpu-local"))
    assert set(figures["gnn"]) == set(figures["roofline"]) == FIGURES


def test_weights_written_before_feature_sets_load_as_set_1(dataset, tmp_path):
    model, _ = train(
        dataset, epochs=1, seed=0, config=NetworkConfig(hidden=8, layers=1, feature_set=1)
    )
    save_model(str(tmp_path), model.params, model.config, model.target_mean, model.target_std, {})
    config = json.loads((tmp_path / "config.json").read_text())
    del config["network"]["feature_set"]  # as the weights of an older version
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = GnnCostModel.load(tmp_path)
    assert again.config.feature_set == 1
    features = featurize(dataset, feature_set=1)
    np.testing.assert_allclose(
        again.predict_features(features), model.predict_features(features), rtol=1e-5
    )
    config["network"]["feature_set"] = 7
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(DiscoInputError, match="feature set 7"):
        GnnCostModel.load(tmp_path)


def test_a_missing_or_corrupt_model_directory_is_bad_input(tmp_path):
    with pytest.raises(DiscoInputError, match="not a GNN cost model"):
        GnnCostModel.load(tmp_path / "absent")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DiscoInputError, match="corrupt"):
        GnnCostModel.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"schema": "disco-xla-gnn/0"}))
    with pytest.raises(DiscoInputError, match="schema"):
        GnnCostModel.load(tmp_path)
    with pytest.raises(DiscoInputError):
        make_cost_model("gnn", load_profile("cpu-local"), gnn_model=str(tmp_path))


def test_simulate_uses_the_shipped_weights(module_files):
    result = run_cli(
        "simulate", module_files["jax_pmap_step"], "--cluster", "cpu-local",
        "--cost-model", "gnn", "--plan", "none", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["cost_model"] == "gnn"
    assert summary["compute_s"] > 0


@pytest.mark.parametrize(
    "cluster, weights",
    [("cpu-local", "cpu"), ("h200-1x8-nvlink", "h200"), ("v100-2x8-25g", "cpu")],
)
def test_the_gnn_defaults_to_the_weights_of_the_clusters_device(
    module_files, cluster, weights, caplog
):
    """An H200 profile predicts with the weights trained on H200 kernels; a device
    with no weights of its own falls back to the CPU's, with a warning on a GPU."""
    shipped = json.loads((default_model_directory(weights) / "config.json").read_text())
    with caplog.at_level(logging.WARNING, logger="disco_xla.simulator.cost_models"):
        model = make_cost_model("gnn", load_profile(cluster))
    assert model.target_mean == pytest.approx(shipped["target_log_s_mean"])
    warned = [r.getMessage() for r in caplog.records if "no GNN weights" in r.getMessage()]
    assert len(warned) == (cluster == "v100-2x8-25g")
    result = run_cli(
        "simulate", module_files["jax_pmap_step"], "--cluster", cluster,
        "--cost-model", "gnn", "--plan", "none", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["compute_s"] > 0
