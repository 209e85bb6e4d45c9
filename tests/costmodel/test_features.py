"""A kernel's instruction graph and its features: one node per instruction and one
edge per operand inside the kernel, the attributes FLOPs and bytes do not show,
what each feature set sees, and each tensor's real dtype."""

from __future__ import annotations

import numpy as np

from disco_xla.costmodel.features import (
    ATTRIBUTE_NAMES,
    DTYPE_VOCABULARY,
    LIBRARY_ATTRIBUTE_NAMES,
    STRUCTURAL_ATTRIBUTE_NAMES,
    KernelGraph,
    kernel_graph,
    node_attributes,
)
from disco_xla.costmodel.network import featurize, stack_graphs
from disco_xla.hlo.graph import HloModule
from disco_xla.search.backtracking import greedy_fusion_plan
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile


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
