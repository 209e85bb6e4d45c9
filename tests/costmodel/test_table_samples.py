"""XLA's GEMM table as GNN samples: each sample is the table point it came from,
a held-out split shares no point, the tables' price of a stored graph is the
`tables` cost model's price of its kernel, and training on the samples lowers
the loss."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from disco_xla.costmodel import training
from disco_xla.costmodel.dataset import KernelSample, from_samples
from disco_xla.costmodel.features import kernel_graph
from disco_xla.costmodel.network import GnnCostModel, NetworkConfig, batch, network
from disco_xla.costmodel.table_samples import (
    gemm_points,
    gemm_table_of,
    held_out_along,
    table_samples,
    tables_seconds,
)
from disco_xla.costmodel.training import train
from disco_xla.simulator.gpu_kernels import MeasuredKernelModel
from disco_xla.simulator.gpu_tables import GemmTable
from disco_xla.simulator.profiles import load_profile

H100_POINTS = gemm_points("sm_90")


def _spread(points, count):
    """`count` points spread over the whole list (both element types, all sizes)."""
    return [points[i] for i in np.linspace(0, len(points) - 1, count).astype(int)]


def test_samples_carry_the_table_points_flops_and_times():
    points = _spread(H100_POINTS, 12)
    assert {p.element_type for p in points} == {"bf16", "f32"}
    assert {p.b for p in points} == {1, 2, 4}
    table = GemmTable("sm_90")
    data = table_samples(points)
    for index, point in enumerate(points):
        graph = data.graph(index)
        assert graph.opcodes == ("dot",)
        assert graph.dtypes == (point.element_type,)
        assert graph.kernel_flops == 2 * point.b * point.m * point.n * point.k
        # The time is the table's own: its FLOPs at the measured rate.
        expected_s = table.seconds(point.b, point.m, point.n, point.k, point.element_type)
        assert data.time_s[index] == pytest.approx(expected_s, rel=1e-12)
        width = 2 if point.element_type == "bf16" else 4
        operands = point.b * (point.m * point.k + point.k * point.n) * width
        assert graph.kernel_bytes_in == operands
        assert graph.kernel_bytes_out == point.b * point.m * point.n * width
    # A device priced from another's table: times divided by its compute scale.
    faster = table_samples(points[:2], compute_scale=2.0)
    assert faster.time_s == pytest.approx(data.time_s[:2] / 2.0)


def test_a_held_out_axis_shares_no_point_and_leaves_a_grid_to_interpolate():
    kept, held = held_out_along(H100_POINTS, "m", (512, 2048))
    assert len(kept) + len(held) == len(H100_POINTS) == 750
    assert {p.key for p in kept}.isdisjoint({p.key for p in held})
    assert {p.m for p in held} == {512, 2048} and {p.m for p in kept} == {256, 1024, 4096}
    # The interpolation without them never reads a held-out point back exactly.
    table = gemm_table_of(kept)
    assert table.axes["bf16xbf16->bf16"][1] == [256, 1024, 4096]
    misses = [abs(table.seconds(p.b, p.m, p.n, p.k, p.element_type) / p.seconds - 1) for p in held]
    assert min(misses) > 0 and np.median(misses) < 0.5
    # The samples' graphs differ on the two sides too (no shape on both).
    kept_hashes = set(table_samples(_spread(kept, 10)).structural_hash.tolist())
    held_hashes = set(table_samples(_spread(held, 10)).structural_hash.tolist())
    assert kept_hashes.isdisjoint(held_hashes)


def test_tables_price_of_a_stored_graph_is_the_tables_cost_models():
    """`tables_seconds` on the stored graphs equals `MeasuredKernelModel` on
    the kernels they came from: dots (on and off the grid), elementwise ops,
    reductions, and a fused group of them."""
    import jax.numpy as jnp

    from disco_xla.capture import capture_jax
    from disco_xla.simulator.kernels import kernel_for

    def step(x, w, v):
        hidden = jnp.tanh(x @ w + 1.0)
        return jnp.sum(hidden @ v * 0.5, axis=1)

    f32 = jnp.float32
    module = capture_jax(
        step,
        jax.ShapeDtypeStruct((1024, 512), f32),
        jax.ShapeDtypeStruct((512, 768), f32),
        jax.ShapeDtypeStruct((768, 64), f32),
    )
    members = [i for i in module.entry.topological_order if i.opcode != "parameter"]
    kernels = [kernel_for([i]) for i in members] + [kernel_for(members)]
    opcodes = {i.opcode for i in members}
    assert {"dot", "tanh", "reduce", "multiply", "add"} <= opcodes
    data = from_samples(
        [
            KernelSample(kernel_graph(k), 1.0, 1, "m", "m", "unfused", "", k.element_type, "")
            for k in kernels
        ]
    )
    profile = load_profile("h200-1x8-nvlink")
    model = MeasuredKernelModel(profile)
    expected = [model.kernel_s(k) for k in kernels]
    assert tables_seconds(data, profile) == pytest.approx(expected, rel=1e-9)


def test_a_short_training_on_table_samples_lowers_the_training_loss(monkeypatch):
    """The standardised log-time's squared error over the samples, with the
    network's initial weights and with the trained ones. 48 samples make one
    step an epoch: early stopping is turned off, so every epoch runs."""
    monkeypatch.setattr(training, "PATIENCE", 10**6)
    data = table_samples(_spread(H100_POINTS, 48))
    config = NetworkConfig(hidden=16, layers=1)
    gnn, report = train(data, epochs=60, seed=0, config=config)
    features = config.featurize(data)
    initial = GnnCostModel(
        network(config).init(jax.random.PRNGKey(0), batch(features, 0, 1)),
        config,
        report["target_log_s_mean"],
        report["target_log_s_std"],
    )

    def loss(model: GnnCostModel) -> float:
        predicted = np.log(model.predict_features(features))
        standardised = (predicted - np.log(data.time_s)) / report["target_log_s_std"]
        return float(np.mean(standardised**2))

    before, after = loss(initial), loss(gnn)
    assert report["steps"] == 60
    assert after < 0.5 * before, (before, after)
