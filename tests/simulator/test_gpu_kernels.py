"""Kernel times on a GPU profile from XLA's measured tables: the dtype rule,
the GEMM price, the boundary price, and the cost model a GPU profile gets."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import yaml

from disco_xla import DiscoInputError
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import save_module
from disco_xla.simulator.cost_models import (
    CrossingChargedCostModel,
    RooflineCostModel,
    boundary_charged,
    make_cost_model,
)
from disco_xla.simulator.gpu_kernels import MeasuredKernelModel, gemm_dimensions
from disco_xla.simulator.gpu_tables import GemmTable, OpCycles
from disco_xla.simulator.kernels import kernel_for
from disco_xla.simulator.profiles import load_profile
from tests.conftest import run_cli

H100 = load_profile("h100-32x8-ib400")


def _module(fn, *args) -> HloModule:
    lowered = jax.jit(fn).lower(*args)
    return HloModule.from_bytes(lowered.compiler_ir("hlo").as_serialized_hlo_module_proto())


def _bf16_dot_with_f32_epilogue(size: int = 512) -> HloModule:
    def step(x, w, bias):
        product = jnp.dot(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
        return jnp.tanh(product.astype(jnp.float32) + bias)

    spec = jax.ShapeDtypeStruct((size, size), jnp.float32)
    return _module(step, spec, spec, spec)


def _entry_work(module: HloModule) -> list:
    skip = ("parameter", "tuple", "constant")
    return [i for i in module.entry.instructions if i.opcode not in skip]


def test_a_fused_kernel_is_priced_at_its_dots_input_type():
    module = _bf16_dot_with_f32_epilogue()
    kernel = kernel_for(_entry_work(module))
    # The kernel's largest value is f32, but what it computes is a bf16 GEMM.
    assert kernel.element_type == "bf16" and kernel.op_class == "dot"
    roofline = RooflineCostModel(H100)
    bf16_rate_s = kernel.flops / (989e12 * roofline.efficiency["dot"])
    assert roofline.kernel_s(kernel) == pytest.approx(
        max(bf16_rate_s, kernel.bytes / (3.35e12 * 0.7)) + H100.kernel_launch_s
    )


def test_a_gemm_kernel_takes_the_tables_time():
    module = _bf16_dot_with_f32_epilogue(4096)
    dot = next(i for i in module.instructions() if i.opcode == "dot")
    assert gemm_dimensions(dot) == (1, 4096, 4096, 4096)
    model = MeasuredKernelModel(H100)
    gemm_s = GemmTable("sm_90").seconds(1, 4096, 4096, 4096, "bf16")
    assert model.kernel_s(kernel_for([dot])) == pytest.approx(gemm_s + H100.kernel_launch_s)
    # The epilogue adds its elementwise ops at XLA's measured cycles per
    # element over every FP32 lane (2 x 1.98 GHz x 132 SMs x 128 lanes), as
    # XLA's own performance model reads them; not an f32 GEMM's time.
    work = _entry_work(module)
    cycles = OpCycles("sm_90")
    epilogue = sum(
        i.shape.elements * cycles.cycles(i.opcode, i.shape.element_type)
        for i in work
        if i.opcode in ("add", "tanh")  # a convert counts no work
    )
    expected = gemm_s + epilogue / (2 * 1.98e9 * 132 * 128) + H100.kernel_launch_s
    assert model.kernel_s(kernel_for(work)) == pytest.approx(expected)


def test_memory_bound_kernels_run_at_the_achieved_bandwidth():
    module = _module(lambda x: x * 2.0 + 1.0, jax.ShapeDtypeStruct((1 << 24,), jnp.float32))
    kernel = kernel_for(_entry_work(module))
    expected = kernel.bytes / 2.97e12 + H100.kernel_launch_s
    assert MeasuredKernelModel(H100).kernel_s(kernel) == pytest.approx(expected)
    h200 = MeasuredKernelModel(load_profile("h200-8x8-ib400"))
    assert h200.kernel_s(kernel) < MeasuredKernelModel(H100).kernel_s(kernel)


def test_a_boundary_pays_the_hbm_traffic_of_what_it_cuts():
    module = _bf16_dot_with_f32_epilogue(1024)
    work = _entry_work(module)
    whole = tuple(i.name for i in work)
    inner = MeasuredKernelModel(H100)
    charged = boundary_charged(inner, H100, [whole])
    assert isinstance(charged, CrossingChargedCostModel)
    # XLA's own group crosses nothing new.
    assert charged.kernel_s(kernel_for(work)) == inner.kernel_s(kernel_for(work))
    # Split after the dot: its f32 result (after the convert) is written and read once.
    cut = next(n for n, i in enumerate(work) if i.opcode == "dot") + 1
    first, second = kernel_for(work[:cut]), kernel_for(work[cut:])
    crossing = sum(i.shape.bytes for i in work[:cut] if any(u in work[cut:] for u in i.users))
    assert crossing > 0
    assert charged.crossing_bytes(first) == charged.crossing_bytes(second) == crossing
    assert charged.kernel_s(second) == pytest.approx(inner.kernel_s(second) + crossing / 2.97e12)


def test_gpu_profiles_get_the_tables_by_default():
    assert make_cost_model("auto", H100).name == "tables"
    assert make_cost_model("auto", load_profile("cpu-local")).name == "roofline"
    assert make_cost_model("auto", load_profile("a100-2x8-100g")).name == "roofline"
    with pytest.raises(DiscoInputError, match="measured GPU figures"):
        make_cost_model("tables", load_profile("a100-2x8-100g"))


def test_a_figure_without_its_source_is_refused(tmp_path):
    data = yaml.safe_load(open(H100.source))
    del data["measured"]["sources"]["memory_bandwidth_bytes_per_s"]
    path = tmp_path / "unsourced.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DiscoInputError, match="memory_bandwidth_bytes_per_s' has no source"):
        load_profile(str(path))
    module = tmp_path / "step.hlo.pb"
    save_module(_bf16_dot_with_f32_epilogue(64), str(module))
    result = run_cli("simulate", str(module), "--cluster", str(path))
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert str(path) in line and "has no source" in line


def test_every_figure_of_the_shipped_gpu_profiles_has_a_source():
    for name in ("h100-32x8-ib400", "h100-32x8-eth100", "h200-1x8-nvlink", "h200-128x8-ib400"):
        profile = load_profile(name)
        for section in (profile.measured, profile.nccl):
            assert section is not None and section.sources
            figures = {k for k, v in vars(section).items() if isinstance(v, (int, float))}
            assert figures - {"compute_scale", "collective_scale", "extra_network_hop_s"} <= set(
                section.sources
            ), name


def test_an_architecture_xlas_tables_lack_is_refused_naming_the_profile(tmp_path):
    data = yaml.safe_load(open(H100.source))
    data["measured"]["tables"] = "sm_99"
    path = tmp_path / "unknown_arch.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DiscoInputError, match="unknown_arch.yaml: bad key 'measured.tables'"):
        make_cost_model("auto", load_profile(str(path)))


def test_b200_gemms_come_from_its_table_and_its_collectives_from_nccls_model(tmp_path):
    from disco_xla.simulator.comm import all_reduce_s
    from disco_xla.simulator.nccl import nccl_s

    data = yaml.safe_load(open(H100.source))
    data["measured"]["tables"] = "sm_100"  # XLA's B200 GEMMs; no B200 collective rows here
    data["measured"]["cycle_tables"] = "sm_90"  # nor B200 op cycles: Hopper's
    path = tmp_path / "b200.yaml"
    path.write_text(yaml.safe_dump(data))
    b200 = load_profile(str(path))
    assert make_cost_model("auto", b200).gemms.arch == "sm_100"
    one_node = b200.__class__(**{**b200.__dict__, "nodes": 1})
    assert all_reduce_s(2**30, one_node) == nccl_s("all-reduce", 2**30, 8, 1, b200.nccl)
