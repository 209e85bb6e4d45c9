"""`benchmarks/kernel_reproducibility.py`: a second collection of the same
kernels scored as a model of the first, per family, on synthetic collections
with a known answer."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest

from disco_xla.costmodel.dataset import from_samples, save_dataset
from tests.benchmarks.test_gnn_families import REPO, _samples

sys.path.insert(0, REPO)

from benchmarks.kernel_reproducibility import reproducibility  # noqa: E402


def _second_collection(samples):
    """The residual-conv family's kernels all twice as slow (a machine drift,
    the order kept); the encoder-attention family's two slowest kernels
    swapped in time (a change of order); the rest as before."""
    bert = sorted(
        {s.structural_hash: s.time_s for s in samples if s.model == "bert_base"}.items(),
        key=lambda item: item[1],
    )
    (slow_key, slow_s), (slowest_key, slowest_s) = bert[-2], bert[-1]
    swapped = {slow_key: slowest_s / slow_s, slowest_key: slow_s / slowest_s}
    second = []
    for s in samples:
        factor = 2.0 if s.model in ("resnet50", "keras_ResNet50") else 1.0
        factor *= swapped.get(s.structural_hash, 1.0)
        second.append(dataclasses.replace(s, time_s=s.time_s * factor))
    return second


def test_a_drift_is_a_level_and_a_change_of_order_lowers_tau(tmp_path):
    samples = _samples()
    rows = {
        r["family"]: r
        for r in reproducibility(from_samples(samples), from_samples(_second_collection(samples)))
    }
    residual, encoder, depthwise = (
        rows["residual-conv"],
        rows["encoder-attention"],
        rows["depthwise-conv"],
    )
    assert residual["level"] == pytest.approx(2.0)
    assert residual["mape"] == pytest.approx(1.0) and residual["mape_at_level"] == pytest.approx(
        0.0
    )
    assert residual["kendall_tau"] == pytest.approx(1.0)
    assert encoder["level"] == pytest.approx(1.0) and 0.8 < encoder["kendall_tau"] < 1.0
    assert encoder["mape"] > 0
    assert depthwise["mape"] == pytest.approx(0.0) and depthwise["kendall_tau"] == pytest.approx(
        1.0
    )
    assert rows["all"]["kernels"] == sum(r["kernels"] for f, r in rows.items() if f != "all")


def test_the_command_prints_the_table_and_refuses_a_bad_file(tmp_path):
    samples = _samples()
    first, second = tmp_path / "first.tiny.npz", tmp_path / "second.tiny.npz"
    save_dataset(from_samples(samples), str(first))
    save_dataset(from_samples(_second_collection(samples)), str(second))
    script = os.path.join(REPO, "benchmarks", "kernel_reproducibility.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}

    def run(*args):
        return subprocess.run(
            [sys.executable, script, *args], capture_output=True, text=True, env=env, timeout=300
        )

    result = run("--first", str(first), "--second", str(second))
    assert result.returncode == 0, result.stderr
    assert "| residual-conv | 48 | 100.0% |" in result.stdout
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a data set")
    result = run("--first", str(bad), "--second", str(second))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "bad.npz" in result.stderr


def test_speed_normalised_takes_out_a_drift_the_reference_saw(tmp_path):
    """The residual family's drift came with a reference twice as slow: once
    normalised it is gone, and the swapped encoder kernels still show. Data sets
    without references are refused in one line."""
    samples = [dataclasses.replace(s, reference_s=0.01) for s in _samples()]
    second = [
        dataclasses.replace(
            s, reference_s=0.02 if s.model in ("resnet50", "keras_ResNet50") else 0.01
        )
        for s in _second_collection(samples)
    ]
    first_path, second_path = tmp_path / "first.tiny.npz", tmp_path / "second.tiny.npz"
    save_dataset(from_samples(samples), str(first_path))
    save_dataset(from_samples(second), str(second_path))
    script = os.path.join(REPO, "benchmarks", "kernel_reproducibility.py")

    def run(*args):
        return subprocess.run(
            [sys.executable, script, "--json", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"},
            timeout=300,
        )

    import json

    plain = run("--first", str(first_path), "--second", str(second_path))
    normalised = run("--first", str(first_path), "--second", str(second_path), "--speed-normalised")
    assert plain.returncode == 0 and normalised.returncode == 0, plain.stderr + normalised.stderr
    before = {r["family"]: r for r in json.loads(plain.stdout)}
    after = {r["family"]: r for r in json.loads(normalised.stdout)}
    assert before["residual-conv"]["level"] == pytest.approx(2.0)
    assert after["residual-conv"]["level"] == pytest.approx(1.0)
    assert after["residual-conv"]["mape"] == pytest.approx(0.0)
    assert after["encoder-attention"]["kendall_tau"] == pytest.approx(
        before["encoder-attention"]["kendall_tau"]
    )
    no_reference = tmp_path / "old.tiny.npz"
    save_dataset(from_samples(_samples()), str(no_reference))
    refused = run("--first", str(no_reference), "--second", str(second_path), "--speed-normalised")
    assert refused.returncode == 2
    assert len(refused.stderr.strip().splitlines()) == 1 and "no speed reference" in refused.stderr
