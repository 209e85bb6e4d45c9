"""Training and evaluation: a few steps lower the validation loss, the kernels
a library runs are scored apart, and the error figures tell a wrong level from a
wrong shape."""

from __future__ import annotations

import numpy as np
import pytest

from disco_xla.costmodel.training import error_figures, evaluate, library_kernels, measured
from disco_xla.simulator.profiles import load_profile


def test_training_lowers_the_validation_loss(trained):
    _, report = trained
    assert report["steps"] > 0
    assert report["best_validation_loss"] < report["initial_validation_loss"]


def test_kernels_holding_a_dot_or_convolution_are_found_and_scored_apart(trained, dataset):
    """The kernels XLA:CPU hands to a library are found from their nodes, and
    evaluation scores them apart from the rest."""
    kernels = measured(dataset)
    library = library_kernels(kernels)
    holds = [
        bool({"dot", "convolution"} & set(kernels.graph(i).opcodes)) for i in range(len(kernels))
    ]
    assert library.tolist() == holds and 1 < library.sum() < len(kernels)
    model, _ = trained
    figures = evaluate(model, dataset, load_profile("cpu-local"))
    assert figures["library_kernels"] == library.sum()
    chosen = kernels.subset(np.flatnonzero(library))
    expected = error_figures(model.predict_features(model.config.featurize(chosen)), chosen.time_s)
    # The same float32 predictions, batched with other kernels or alone: equal to
    # float32 rounding (one clean-clone run differed by 1.4e-6 relative).
    assert figures["gnn_library"] == pytest.approx(expected, rel=1e-5)


def test_error_figures_separate_a_wrong_level_from_a_wrong_shape():
    measured = np.array([1.0, 2.0, 4.0, 8.0])
    # Twice every time: the level is off, the shape is right.
    doubled = error_figures(2 * measured, measured)
    assert doubled["mape"] == pytest.approx(1.0) and doubled["kendall_tau"] == pytest.approx(1.0)
    assert doubled["level"] == pytest.approx(2.0) and doubled["mape_at_level"] == pytest.approx(0.0)
    # Right level, wrong shape: the two middle kernels swapped.
    swapped = error_figures(np.array([1.0, 4.0, 2.0, 8.0]), measured)
    assert swapped["level"] == pytest.approx(1.0)  # the median of the ratios 1, 2, 0.5, 1
    assert swapped["mape_at_level"] == pytest.approx(swapped["mape"]) == pytest.approx(0.375)
    assert swapped["kendall_tau"] < 1.0
