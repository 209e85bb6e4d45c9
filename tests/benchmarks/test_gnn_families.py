"""`benchmarks/gnn_cost_model.py --by family` on a small synthetic data set of
three families (four models): each family is held out in turn, never trained
on, and reported with its GNN and roofline figures, noise floor and targets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from disco_xla.costmodel import training
from disco_xla.costmodel.dataset import (
    MODEL_FAMILIES,
    KernelSample,
    from_samples,
    model_family,
    save_dataset,
)
from disco_xla.costmodel.features import ATTRIBUTE_NAMES, MAX_RANK, KernelGraph
from disco_xla.costmodel.network import NetworkConfig
from disco_xla.errors import DiscoInputError
from disco_xla.simulator.profiles import load_profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.gnn_cost_model import hold_out_each, measurement_noise  # noqa: E402

# model -> (its family, the opcode that sets its kernels apart)
MODELS = {
    "resnet50": ("residual-conv", "convolution"),
    "keras_ResNet50": ("residual-conv", "convolution"),
    "bert_base": ("encoder-attention", "dot"),
    "keras_MobileNetV2": ("depthwise-conv", "multiply"),
}
KERNELS = 24  # distinct kernels per model, each measured twice


def _graph(opcode: str, size: int) -> KernelGraph:
    """parameter-free chain: add -> OPCODE -> exponential, `size` elements of f32."""
    opcodes = ("add", opcode, "exponential")
    dims = np.zeros((3, MAX_RANK), np.int64)
    dims[:, 0] = size
    flops = np.full(3, float(size))
    out_bytes = np.full(3, 4.0 * size)
    return KernelGraph(
        opcodes=opcodes,
        dtypes=("f32",) * 3,
        dims=dims,
        ranks=np.ones(3, np.int64),
        flops=flops,
        out_bytes=out_bytes,
        in_bytes=np.array([8.0 * size, 0.0, 0.0]),
        is_output=np.array([False, False, True]),
        attributes=np.ones((3, len(ATTRIBUTE_NAMES))),
        senders=np.array([0, 1], np.int64),
        receivers=np.array([1, 2], np.int64),
        edge_bytes=np.array([4.0 * size, 4.0 * size]),
        kernel_flops=float(flops.sum()),
        kernel_bytes_in=8.0 * size,
        kernel_bytes_out=4.0 * size,
    )


def _samples() -> list[KernelSample]:
    rng = np.random.default_rng(0)
    samples = []
    for number, (model, (_, opcode)) in enumerate(MODELS.items()):
        for kernel in range(KERNELS):
            size = int(2 ** rng.uniform(8, 20))
            base_s = 1e-6 + size * (1 + number) * 1e-10
            for repeat in range(2):  # measured twice: the noise floor
                samples.append(
                    KernelSample(
                        graph=_graph(opcode, size),
                        time_s=base_s * (1 + (0.1 if repeat else -0.1)),
                        kernel_count=1,
                        module=f"{model}.tiny",
                        model=model,
                        plan_kind="random",
                        structural_hash=f"{model}-{kernel}",
                        element_type="f32",
                        op_class="elementwise",
                    )
                )
    return samples


@pytest.fixture(scope="module")
def dataset():
    return from_samples(_samples())


@pytest.fixture(scope="module")
def two_family_file(tmp_path_factory):
    """bert_base and resnet50 only: two trainings for the command's test."""
    path = tmp_path_factory.mktemp("families") / "synthetic.tiny.npz"
    samples = [s for s in _samples() if s.model in ("bert_base", "resnet50")]
    save_dataset(from_samples(samples), str(path))
    return str(path)


def test_every_family_is_held_out_once_and_never_trained_on(dataset, monkeypatch):
    trained_on = []  # the models of the kernels each training actually saw
    original = training._training_kernels

    def recording(data, held_out):
        kernels = original(data, held_out)
        trained_on.append(set(kernels.model.tolist()))
        return kernels

    monkeypatch.setattr(training, "_training_kernels", recording)
    rows = hold_out_each(
        dataset,
        load_profile("cpu-local"),
        by="family",
        epochs=1,
        max_steps=1,
        config=NetworkConfig(hidden=8, layers=1),
    )
    families = sorted({family for family, _ in MODELS.values()})
    assert [row["held_out"] for row in rows] == families
    assert len(trained_on) == len(families)
    for row, models in zip(rows, trained_on, strict=True):
        family = row["held_out"]
        held_out = {m for m, (f, _) in MODELS.items() if f == family}
        assert set(row["held_out_models"]) == held_out
        assert models == set(MODELS) - held_out  # all the others, none of the family
        assert {model_family(m) for m in models} == set(families) - {family}
        assert family not in row["train_families"]
        assert row["samples"] == KERNELS * len(held_out)  # distinct kernels, once each
        for name in ("gnn", "roofline"):
            assert set(row[name]) == {"mape", "median_ape", "kendall_tau", "level", "mape_at_level"}
        # The noise floor is the held-out family's own: each kernel ±10% around
        # its median of two.
        assert row["noise"] == measurement_noise(dataset, sorted(held_out))
        assert row["noise"]["repeated_samples"] == 2 * KERNELS * len(held_out)
        assert row["noise"]["mape"] == pytest.approx(0.1 / 1.0, rel=1e-6)
        # Both measurements keep every kernel's order: the ceiling on τ is 1.
        assert row["noise"]["kendall_tau"] == pytest.approx(1.0)
        met = row["targets_met"]
        assert met["mape"] == (row["gnn"]["mape"] <= 0.25)
        assert met["kendall_tau"] == (row["gnn"]["kendall_tau"] >= 0.85)
        assert met["noise"] == (row["gnn"]["mape"] <= 1.5 * row["noise"]["mape"])
        assert row["all_targets_met"] == all(met.values())


def test_a_held_out_family_of_several_models_is_evaluated_on_all_of_them(dataset):
    gnn, report = training.train(
        dataset,
        epochs=1,
        max_steps=1,
        config=NetworkConfig(hidden=8, layers=1),
        hold_out_models=["resnet50", "keras_ResNet50"],
    )
    assert report["held_out_models"] == ["resnet50", "keras_ResNet50"]
    assert report["models"] == ["bert_base", "keras_MobileNetV2"]
    figures = training.evaluate(
        gnn, dataset, load_profile("cpu-local"), only_models=["resnet50", "keras_ResNet50"]
    )
    assert figures["models"] == ["keras_ResNet50", "resnet50"]
    assert figures["samples"] == 2 * KERNELS
    with pytest.raises(DiscoInputError, match="no kernels of this model"):
        training.train(dataset, epochs=1, hold_out_models=["vgg19"])


def test_model_families():
    assert model_family("keras:MobileNetV2") == model_family("keras_MobileNetV2")
    assert model_family("resnet50") == model_family("keras_ResNet50") == "residual-conv"
    assert len(set(MODEL_FAMILIES.values())) >= 10
    with pytest.raises(DiscoInputError, match="no family for this model") as error:
        model_family("alexnet")
    assert "\n" not in str(error.value)


def test_the_collection_script_lists_only_models_with_a_family():
    with open(os.path.join(REPO, "benchmarks", "collect_cost_model_data.sh")) as file:
        script = file.read()
    (default,) = re.findall(r'^DEFAULT_MODELS="([^"]+)"', script, re.MULTILINE)
    names = default.split()
    families = {model_family(name) for name in names}
    assert {"depthwise-conv", "dense-conv", "squeeze-excitation", "grouped-conv"} <= families
    assert any(name.startswith("keras:") for name in names)


def _run(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "benchmarks/gnn_cost_model.py", *arguments]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_command_by_family_writes_every_familys_row(two_family_file, tmp_path):
    out = tmp_path / "families.json"
    result = _run(
        two_family_file, "--by", "family", "--epochs", "1", "--max-steps", "1", "--out", str(out)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written = json.loads(out.read_text())
    rows = written["leave_one_family_out"]
    assert [row["held_out"] for row in rows] == ["encoder-attention", "residual-conv"]
    assert [row["train_models"] for row in rows] == [["resnet50"], ["bert_base"]]
    assert written["by"] == "family" and "all_families_meet_targets" in written
    assert set(rows[0]["noise"]) == {"repeated_samples", "mape", "median_ape", "kendall_tau"}
    assert "| held-out family |" in result.stdout and "| residual-conv |" in result.stdout


def test_a_model_without_a_family_is_one_line_and_exit_code_2(tmp_path):
    samples = [s for s in _samples() if s.model in ("bert_base", "resnet50")]
    renamed = [
        KernelSample(**{**s.__dict__, "model": "alexnet"}) if s.model == "resnet50" else s
        for s in samples
    ]
    path = tmp_path / "unknown.npz"
    save_dataset(from_samples(renamed), str(path))
    result = _run(str(path), "--by", "family")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "gnn_cost_model.py: error: alexnet: no family for this model; add it to "
        "MODEL_FAMILIES in disco_xla/costmodel/dataset.py"
    )
