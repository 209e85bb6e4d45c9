"""Library calls (custom calls that compute, as a GPU job's cuBLAS, cuDNN and
Transformer Engine calls), on a bf16 module with no host handler for any of
them: each is a kernel of its own, priced from its operands and its target,
and `inspect` says how."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disco_xla.errors import DiscoInputError
from disco_xla.hlo.custom_calls import is_library_call, is_marker, library_call_kind
from disco_xla.hlo.hlo_io import load_module
from disco_xla.plan import Plan, compute_instructions, verify_plan
from disco_xla.search.fusion_model import modelled_xla_fusion
from tests.conftest import run_cli

CUSTOM_CALLS = Path(__file__).parents[1] / "data" / "hlo_corpus" / "gpu_custom_calls.hlo.txt"


@pytest.fixture(scope="module")
def module():
    return load_module(CUSTOM_CALLS)


def test_each_target_is_priced_by_its_kind(module):
    by_name = {i.name: i for i in module.instructions()}
    gemm, fmha, backward = by_name["q.gemm"], by_name["fmha"], by_name["fmha.bwd"]
    assert library_call_kind(gemm) == "gemm"
    rows, contracted = gemm.operands[0].shape.dims  # x: [256, 128], contracting its last
    columns = gemm.operands[1].shape.dims[1]
    assert gemm.flops == 2 * rows * columns * contracted
    # The weight gradient contracts the batch (dimension 0, from the backend config).
    weight_gradient = by_name["dwq.gemm"]
    assert weight_gradient.flops == 2 * 128 * 128 * rows
    batch, length, heads, size = fmha.operands[0].shape.dims
    assert library_call_kind(fmha) == "attention-forward"
    assert fmha.flops == 4 * batch * heads * length * length * size
    assert library_call_kind(backward) == "attention-backward"
    assert backward.flops == fmha.flops * 5 // 2
    assert library_call_kind(by_name["te"]) == "attention-forward"
    assert library_call_kind(by_name["te.bwd"]) == "attention-backward"
    assert is_marker("xla.sdy.GlobalToLocalShape") and is_marker("Sharding")
    assert not is_marker("te_fused_attn_forward_ffi")


def test_a_library_call_is_a_kernel_that_fuses_with_nothing(module):
    calls = [i for i in module.instructions() if is_library_call(i)]
    compute = {i.name for i in compute_instructions(module)}
    assert len(calls) == 10 and all(c.name in compute for c in calls)
    for plan in (Plan.unfused(module), modelled_xla_fusion(module)):
        verify_plan(plan, module)
        group_of = {name: group for group in plan.fusion_groups for name in group}
        assert all(group_of[c.name] == (c.name,) for c in calls)
    gemm = calls[0]
    user = gemm.users[0]  # its get-tuple-element: plumbing, not compute
    consumer = next(u for u in user.users if u.name in compute)
    joined = [
        g for g in Plan.unfused(module).fusion_groups if g[0] not in (gemm.name, consumer.name)
    ]
    joined.append((gemm.name, consumer.name))
    with pytest.raises(DiscoInputError, match="library call"):
        verify_plan(Plan(module.name, module.fingerprint, tuple(joined), ()), module)


def test_inspect_lists_each_target_and_how_it_is_costed():
    result = run_cli("inspect", str(CUSTOM_CALLS), "--json")
    assert result.returncode == 0, result.stderr
    calls = json.loads(result.stdout)["library_calls"]
    assert calls["__cublas$gemm"]["calls"] == 6
    assert calls["__cudnn$fmhaSoftmax"]["kind"] == "attention-forward"
    assert "2*M*N*K" in calls["__cublas$gemm"]["costed_as"]
    text = run_cli("inspect", str(CUSTOM_CALLS)).stdout
    assert "library call  te_fused_attn_forward_ffi x1" in text
