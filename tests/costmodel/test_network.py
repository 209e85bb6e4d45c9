"""The GNN: batches padded to few shapes, every kernel of a task graph predicted
and cached, and an opcode never seen in training predicted all the same."""

from __future__ import annotations

import logging

import numpy as np

from disco_xla.costmodel.features import ATTRIBUTE_NAMES, KernelGraph
from disco_xla.costmodel.network import batch, featurize
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.kernels import build_task_graph


def test_padding_uses_few_power_of_two_sizes(dataset):
    features = featurize(dataset)
    shapes = set()
    for stop in range(1, min(len(features), 200)):
        padded = batch(features, 0, stop)
        sizes = (padded.nodes["x"].shape[0], padded.edges.shape[0], padded.n_node.shape[0])
        assert all(s & (s - 1) == 0 for s in sizes)
        shapes.add(sizes)
    assert len(shapes) <= 12


def test_the_model_predicts_every_kernel_of_a_task_graph_and_caches_them(trained, step_module):
    model, _ = trained
    graph = build_task_graph(step_module, greedy_fusion_plan(step_module))
    times = model.kernels_s(graph)
    assert len(times) == len(graph.kernels)
    assert all(np.isfinite(t) and t > 0 for t in times)
    distinct = {k.structural_hash for k in graph.kernels}
    assert len(model.cache) == len(distinct)
    assert model.kernel_s(graph.kernels[0]) == times[0]
    assert len(model.cache) == len(distinct)


def test_an_unseen_opcode_still_predicts_and_warns_once(trained, caplog):
    model, _ = trained
    strange = KernelGraph(
        opcodes=("never-seen-op", "add"),
        dtypes=("f32", "f32"),
        dims=np.array([[64, 64, 0, 0, 0, 0], [64, 64, 0, 0, 0, 0]]),
        ranks=np.array([2, 2]),
        flops=np.array([0.0, 4096.0]),
        out_bytes=np.array([16384.0, 16384.0]),
        in_bytes=np.array([16384.0, 0.0]),
        is_output=np.array([False, True]),
        attributes=np.ones((2, len(ATTRIBUTE_NAMES))),
        senders=np.array([0]),
        receivers=np.array([1]),
        edge_bytes=np.array([16384.0]),
        kernel_flops=4096.0,
        kernel_bytes_in=16384.0,
        kernel_bytes_out=16384.0,
    )
    with caplog.at_level(logging.WARNING, logger="disco_xla.costmodel.network"):
        first = model.predict_graphs([strange])
        second = model.predict_graphs([strange, strange])
    assert np.isfinite(first).all() and first[0] > 0
    np.testing.assert_allclose(second, first[0], rtol=1e-5)
    warnings = [r for r in caplog.records if "never-seen-op" in r.getMessage()]
    assert len(warnings) == 1
