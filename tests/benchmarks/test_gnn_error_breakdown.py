"""`benchmarks/gnn_error_breakdown.py`: where a held-out model's GNN error lies,
by part, on a synthetic data set whose answer is known."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from disco_xla.costmodel.dataset import KernelSample, from_samples, save_dataset
from disco_xla.costmodel.features import ATTRIBUTE_NAMES, MAX_RANK, KernelGraph
from disco_xla.costmodel.training import measured

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.gnn_error_breakdown import breakdown  # noqa: E402


def _graph(opcode: str, size: int) -> KernelGraph:
    """add -> OPCODE over `size` f32 elements."""
    dims = np.zeros((2, MAX_RANK), np.int64)
    dims[:, 0] = size
    return KernelGraph(
        opcodes=("add", opcode),
        dtypes=("f32", "f32"),
        dims=dims,
        ranks=np.ones(2, np.int64),
        flops=np.full(2, float(size)),
        out_bytes=np.full(2, 4.0 * size),
        in_bytes=np.array([8.0 * size, 0.0]),
        is_output=np.array([False, True]),
        attributes=np.ones((2, len(ATTRIBUTE_NAMES))),
        senders=np.array([0], np.int64),
        receivers=np.array([1], np.int64),
        edge_bytes=np.array([4.0 * size]),
        kernel_flops=2.0 * size,
        kernel_bytes_in=8.0 * size,
        kernel_bytes_out=4.0 * size,
    )


def _samples() -> list[KernelSample]:
    """Per model: 6 elementwise kernels of 1-3 us and 4 kernels with a dot,
    of 10, 25, 30 and 40 us."""
    samples = []
    for model in ("resnet50", "bert_base"):
        kernels = [("exponential", "elementwise", (1 + k % 3) * 1e-6) for k in range(6)]
        kernels += [("dot", "elementwise", t * 1e-6) for t in (10, 25, 30, 40)]
        for number, (opcode, op_class, time_s) in enumerate(kernels):
            samples.append(
                KernelSample(
                    graph=_graph(opcode, 256 * (number + 1)),
                    time_s=time_s,
                    kernel_count=1,
                    module=f"{model}.tiny",
                    model=model,
                    plan_kind="random",
                    structural_hash=f"{model}-{number}",
                    element_type="f32",
                    op_class=op_class,
                )
            )
    return samples


def test_the_error_lies_where_the_predictions_miss():
    data = measured(from_samples(_samples()))
    data = data.subset(np.flatnonzero(data.model == "resnet50"))
    library = np.isin(np.arange(len(data)), [6, 7, 8, 9])
    # Exact on the elementwise kernels, half the time on the dot kernels.
    predicted_s = np.where(library, 0.5 * data.time_s, data.time_s)
    report = breakdown(data, predicted_s, worst=3)
    parts = report["parts"]
    assert report["all"]["kernels"] == 10
    assert report["all"]["mape"] == pytest.approx(0.5 * 4 / 10)
    assert parts["dot or convolution"]["kernels"] == 4
    assert parts["dot or convolution"]["mape"] == pytest.approx(0.5)
    assert parts["dot or convolution"]["level"] == pytest.approx(0.5)
    assert parts["dot or convolution"]["share_of_error"] == pytest.approx(1.0)
    assert parts["other"]["mape"] == 0.0 and parts["other"]["share_of_error"] == 0.0
    # By measured time: the 1-3 us kernels in the first two bins, the dots in the
    # 5-20 us (10 us) and 20+ us (25, 30, 40 us) bins.
    assert parts["measured 0-2 us"]["kernels"] == 2  # 1 us twice
    assert parts["measured 2-5 us"]["kernels"] == 4
    assert "measured 5-20 us" not in parts  # one kernel only: no τ
    share = (25 + 30 + 40) / (10 + 25 + 30 + 40)  # errors are half of each dot's time
    assert parts["measured 20-inf us"]["share_of_error"] == pytest.approx(share)
    assert [miss["measured_us"] for miss in report["worst"]] == pytest.approx([10, 25, 30])
    assert all("dot" in miss["opcodes"] for miss in report["worst"])


def _run(*arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "benchmarks/gnn_error_breakdown.py", *arguments]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_the_command_holds_the_model_out_and_reports_its_kernels(tmp_path):
    path = tmp_path / "synthetic.tiny.npz"
    save_dataset(from_samples(_samples()), str(path))
    result = _run(str(path), "--hold-out", "resnet50", "--epochs", "1", "--max-steps", "1")
    assert result.returncode == 0, result.stderr
    assert "held out: resnet50, 10 kernels" in result.stdout
    assert "| dot or convolution | 4 |" in result.stdout
    result = _run(
        str(path), "--hold-out", "resnet50", "--epochs", "1", "--max-steps", "1", "--json"
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["held_out"] == ["resnet50"] and report["train_models"] == ["bert_base"]
    assert report["all"]["kernels"] == 10
    result = _run(str(path), "--hold-out", "vgg19")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no kernels of ['vgg19']" in result.stderr and "Traceback" not in result.stderr
