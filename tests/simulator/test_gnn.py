"""The GNN kernel cost model: features, a few training steps, save and load,
unseen opcodes, and the commands' bad-input errors."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.profiling.dataset import from_samples, save_dataset
from disco_xla.profiling.sample_plans import measure_plan, measure_xla_compiled, sample_plans
from disco_xla.profiling.train_cost_model import (
    error_figures,
    evaluate,
    library_kernels,
    measured,
    train,
)
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.gnn import (
    GnnCostModel,
    NetworkConfig,
    batch,
    default_model_directory,
    featurize,
    save_model,
    stack_graphs,
)
from disco_xla.simulator.kernel_features import (
    ATTRIBUTE_NAMES,
    LIBRARY_ATTRIBUTE_NAMES,
    STRUCTURAL_ATTRIBUTE_NAMES,
    KernelGraph,
    kernel_graph,
    node_attributes,
)
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli

FIGURES = {"mape", "median_ape", "kendall_tau", "level", "mape_at_level"}


@pytest.fixture(scope="module")
def step_module(captured) -> HloModule:
    return HloModule.from_bytes(captured["jax_pmap_step"][0])


@pytest.fixture(scope="module")
def dataset(step_module):
    samples = measure_xla_compiled(step_module, "demo.tiny", "demo", repeats=2)
    for kind, plan in sample_plans(step_module, 3, seed=0):
        samples += measure_plan(step_module, plan, kind, "demo.tiny", "demo", repeats=2)
    return from_samples(samples)


@pytest.fixture(scope="module")
def trained(dataset):
    # A small network: these tests check the plumbing, not the accuracy.
    return train(dataset, epochs=3, seed=0, config=NetworkConfig(hidden=16, layers=1))


@pytest.fixture(scope="module")
def dataset_file(dataset, tmp_path_factory):
    path = tmp_path_factory.mktemp("gnn") / "demo.npz"
    save_dataset(dataset, str(path))
    return str(path)


def test_features_have_one_row_per_instruction_and_operand_edge(step_module):
    graph = build_task_graph(step_module, greedy_fusion_plan(step_module))
    kernels = graph.kernels
    graphs = [kernel_graph(k) for k in kernels]
    features = featurize(stack_graphs(graphs))
    assert len(features) == len(kernels)
    assert len(features.nodes) == sum(len(k.instructions) for k in kernels)
    inside_edges = sum(
        sum(1 for o in i.operands if any(o is m for m in k.instructions))
        for k in kernels
        for i in k.instructions
    )
    assert len(features.edges) == inside_edges
    assert np.isfinite(features.nodes).all() and np.isfinite(features.globals).all()


def test_padding_uses_few_power_of_two_sizes(dataset):
    features = featurize(dataset)
    shapes = set()
    for stop in range(1, min(len(features), 200)):
        padded = batch(features, 0, stop)
        sizes = (padded.nodes["x"].shape[0], padded.edges.shape[0], padded.n_node.shape[0])
        assert all(s & (s - 1) == 0 for s in sizes)
        shapes.add(sizes)
    assert len(shapes) <= 12


def test_training_lowers_the_validation_loss(trained):
    _, report = trained
    assert report["steps"] > 0
    assert report["best_validation_loss"] < report["initial_validation_loss"]


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
    with caplog.at_level(logging.WARNING, logger="disco_xla.simulator.gnn"):
        first = model.predict_graphs([strange])
        second = model.predict_graphs([strange, strange])
    assert np.isfinite(first).all() and first[0] > 0
    np.testing.assert_allclose(second, first[0], rtol=1e-5)
    warnings = [r for r in caplog.records if "never-seen-op" in r.getMessage()]
    assert len(warnings) == 1


def test_node_attributes_tell_depthwise_strided_convolutions_and_minor_moving_transposes():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def fn(images, filters, matrix, cube):
        depthwise = lax.conv_general_dilated(
            images,
            filters,
            window_strides=(2, 2),
            padding="SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=8,
        )
        return depthwise, matrix.T, cube.transpose(1, 0, 2), matrix.sum(axis=1)

    args = (
        jnp.zeros((1, 16, 16, 8)),
        jnp.zeros((3, 3, 1, 8)),
        jnp.zeros((32, 64)),
        jnp.zeros((4, 5, 6)),
    )
    lowered = jax.jit(fn).lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    instructions = list(HloModule.from_bytes(lowered).instructions())

    def attributes(opcode, dims=None):
        (instr,) = [
            i
            for i in instructions
            if i.opcode == opcode and (dims is None or tuple(i.shape.dims) == dims)
        ]
        return dict(zip(ATTRIBUTE_NAMES, node_attributes(instr), strict=True))

    conv = attributes("convolution")
    assert (conv["window"], conv["stride"], conv["groups"], conv["minor_dim"]) == (9, 4, 8, 8)
    assert conv["transposes_minor"] == 0
    moves = attributes("transpose", (64, 32))
    assert moves["transposes_minor"] == 1 and moves["minor_dim"] == 32
    keeps = attributes("transpose", (5, 4, 6))
    assert keeps["transposes_minor"] == 0 and keeps["minor_dim"] == 6
    reduce = attributes("reduce")
    assert reduce["fan_in"] == 64 and reduce["window"] == reduce["groups"] == 1


def test_library_attributes_give_the_matrix_product_and_whether_its_layout_is_the_librarys():
    import jax
    import jax.numpy as jnp
    from jax import lax

    def fn(a, b, c, stacked, images, filters, planar):
        nhwc = lax.conv_general_dilated(
            images, filters, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        nchw = lax.conv_general_dilated(
            planar, filters, (1, 1), "SAME", dimension_numbers=("NCHW", "HWIO", "NCHW")
        )
        plain = a @ b  # [16, 32] x [32, 8]
        against_transposed = lax.dot_general(a, c, (((1,), (1,)), ((), ())))  # x [8, 32]
        batched = jnp.einsum("bmk,bkn->bmn", stacked, stacked.transpose(0, 2, 1))
        return nhwc, nchw, plain + against_transposed, batched + 1.0

    args = (
        jnp.zeros((16, 32)),
        jnp.zeros((32, 8)),
        jnp.zeros((8, 32)),
        jnp.zeros((2, 8, 32)),
        jnp.zeros((2, 10, 12, 4)),
        jnp.zeros((3, 3, 4, 6)),
        jnp.zeros((2, 4, 10, 12)),
    )
    lowered = jax.jit(fn).lower(*args).compiler_ir("hlo").as_serialized_hlo_module_proto()
    instructions = list(HloModule.from_bytes(lowered).instructions())

    def library(instr):
        values = dict(zip(ATTRIBUTE_NAMES, node_attributes(instr), strict=True))
        return tuple(values[name] for name in LIBRARY_ATTRIBUTE_NAMES)

    def rhs_contracting(instr):
        return list(instr.proto.dot_dimension_numbers.rhs_contracting_dimensions)

    dots = {
        (tuple(i.shape.dims), *rhs_contracting(i)): library(i)
        for i in instructions
        if i.opcode == "dot"
    }
    convolutions = {
        tuple(i.shape.dims): library(i) for i in instructions if i.opcode == "convolution"
    }
    # rows, columns, contracted, batch; canonical lhs, rhs, result
    assert dots[(16, 8), 0] == (16, 8, 32, 1, 1, 1, 1)
    assert dots[(16, 8), 1] == (16, 8, 32, 1, 1, 0, 1)
    assert dots[(2, 8, 8), 1] == (8, 8, 32, 2, 1, 1, 1)
    assert convolutions[2, 10, 12, 6] == (2 * 10 * 12, 6, 4 * 9, 1, 1, 1, 1)
    assert convolutions[2, 6, 10, 12] == (2 * 10 * 12, 6, 4 * 9, 1, 0, 1, 0)
    others = [library(i) for i in instructions if i.opcode in ("add", "transpose")]
    assert others and all(v == (1,) * len(LIBRARY_ATTRIBUTE_NAMES) for v in others)


def test_feature_set_3_sees_the_library_shape_that_set_2_cannot(step_module):
    kernel = build_task_graph(step_module, greedy_fusion_plan(step_module)).kernels[0]
    plain = kernel_graph(kernel)
    reshaped = plain.attributes.copy()
    reshaped[:, len(STRUCTURAL_ATTRIBUTE_NAMES) :] *= 4
    other = KernelGraph(**{**plain.__dict__, "attributes": reshaped})
    two = [featurize(stack_graphs([g]), feature_set=2).nodes for g in (plain, other)]
    three = [featurize(stack_graphs([g]), feature_set=3).nodes for g in (plain, other)]
    np.testing.assert_array_equal(two[0], two[1])
    assert three[0].shape[1] == two[0].shape[1] + len(LIBRARY_ATTRIBUTE_NAMES)
    assert not np.array_equal(three[0], three[1])


def test_feature_set_2_sees_the_groups_that_set_1_cannot(step_module):
    kernel = build_task_graph(step_module, greedy_fusion_plan(step_module)).kernels[0]
    plain = kernel_graph(kernel)
    grouped = KernelGraph(**{**plain.__dict__, "attributes": plain.attributes * 8})
    one = [featurize(stack_graphs([g]), feature_set=1).nodes for g in (plain, grouped)]
    two = [featurize(stack_graphs([g]), feature_set=2).nodes for g in (plain, grouped)]
    np.testing.assert_array_equal(one[0], one[1])
    assert two[0].shape[1] == one[0].shape[1] + len(STRUCTURAL_ATTRIBUTE_NAMES)
    assert not np.array_equal(two[0], two[1])


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


def test_train_and_eval_commands(dataset_file, tmp_path):
    model_dir = tmp_path / "model"
    trained = run_cli(
        "train-cost-model", dataset_file, "--out", str(model_dir), "--epochs", "1", "--json",
        "--feature-set", "3", timeout_s=300,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["epochs"] == 1
    config = json.loads((model_dir / "config.json").read_text())
    assert config["network"]["feature_set"] == 3
    result = run_cli("eval-cost-model", dataset_file, "--model", str(model_dir), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["samples"] > 0
    for name in ("gnn", "roofline"):
        assert set(report[name]) >= FIGURES
        assert report[name]["mape"] >= 0


def test_eval_command_errors_are_one_line_with_exit_code_2(dataset_file, tmp_path):
    other_schema = tmp_path / "old.npz"
    np.savez(other_schema, schema=np.array("disco-xla-kernels/0"))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("[]")
    cases = [
        ("eval-cost-model", dataset_file, "--model", str(tmp_path / "absent")),
        ("eval-cost-model", dataset_file, "--model", str(tmp_path / "broken")),
        ("train-cost-model", str(other_schema), "--out", str(tmp_path / "m")),
    ]
    for args in cases:
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1


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


MIXED = """HloModule mixed

ENTRY main {
  a = DTYPE[64,64] parameter(0)
  b = DTYPE[64,64] parameter(1)
  d = DTYPE[64,64] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = DTYPE[64,64] tanh(d)
}
"""


def test_bytes_roofline_and_gnn_features_use_each_tensors_real_dtype():
    from disco_xla.hlo.hlo_io import module_from_text
    from disco_xla.plan import Plan
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.kernel_features import DTYPE_VOCABULARY

    found = {}
    for dtype in ("f32", "bf16"):
        module = module_from_text(MIXED.replace("DTYPE", dtype))
        graph = build_task_graph(module, Plan.unfused(module))
        (dot,) = [k for k in graph.kernels if k.name == "d"]
        features = featurize(stack_graphs([kernel_graph(dot)]))
        one_hot = features.nodes[0, : len(DTYPE_VOCABULARY)]
        assert one_hot[DTYPE_VOCABULARY.index(dtype)] == 1.0 and one_hot.sum() == 1.0
        profile = load_profile("a100-2x8-100g")
        found[dtype] = (dot.bytes, dot.element_type, RooflineCostModel(profile).kernels_s(graph))
    assert found["bf16"][0] * 2 == found["f32"][0]
    assert (found["f32"][1], found["bf16"][1]) == ("f32", "bf16")
    # The A100 profile's bf16 peak is above its f32 peak: the bf16 dot is faster.
    assert found["bf16"][2][0] < found["f32"][2][0]


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
