"""The zoo Llama step as published runs train it (`TrainingChoices`): cuDNN's
fused attention as one call each way, MaxText's minimal remat, activations
split by batch; captured after partitioning although XLA:CPU cannot compile
it, and priced by the GPU tables' published attention rates."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import jax.numpy as jnp
import pytest

from disco_xla import capture_jax
from disco_xla.search.baselines import captured_baselines
from disco_xla.search.fusion_source import modelled_fusion
from disco_xla.simulator.cost_models import make_cost_model
from disco_xla.simulator.events import simulate
from disco_xla.simulator.gpu_kernels import MeasuredKernelModel, is_causal
from disco_xla.simulator.kernels import build_task_graph, kernel_for
from disco_xla.simulator.profiles import load_profile
from disco_xla.zoo.llama import TrainingChoices, build_llama_step

PUBLISHED = TrainingChoices("cudnn", "minimal", shard_activations=True)


def _capture(choices: TrainingChoices):
    step, args, _, _ = build_llama_step("tiny", 4, 8, 2, concrete=False, choices=choices)
    return capture_jax(step, *args)


@pytest.fixture(scope="module")
def published():
    return _capture(PUBLISHED)


def test_cudnn_attention_is_one_call_each_way_on_each_devices_batch(published):
    calls = [i for i in published.instructions() if i.opcode == "custom-call"]
    targets = Counter(i.proto.custom_call_target for i in calls)
    # The minimal policy keeps the forward's output: no second forward call.
    assert targets == {"__cudnn$fmhaSoftmax": 1, "__cudnn$fmhaSoftmaxBackward": 1}
    forward = next(i for i in calls if i.proto.custom_call_target == "__cudnn$fmhaSoftmax")
    assert is_causal(forward)
    # Captured after partitioning: the call sees one device's 2 sequences of
    # the global batch of 8, not gathered whole.
    assert forward.operands[0].shape.dims[0] == 2
    assert any(i.opcode == "all-gather" for i in published.instructions())


def test_cudnn_attention_is_for_pricing_only():
    with pytest.raises(ValueError, match="pricing only"):
        build_llama_step("tiny", 4, 8, 2, concrete=True, choices=PUBLISHED)


def test_minimal_remat_computes_less_than_full(published):
    full = _capture(replace(PUBLISHED, remat="full"))
    assert published.total_flops < full.total_flops


def test_the_fused_attention_is_priced_at_the_published_causal_rate(published):
    h100 = load_profile("h100-32x8-ib400")
    model = MeasuredKernelModel(h100)
    rates = h100.measured.attention_flops_per_s
    for call in (i for i in published.instructions() if i.opcode == "custom-call"):
        kind = "backward" if "Backward" in call.proto.custom_call_target else "forward"
        kernel = kernel_for([call])
        expected = kernel.flops / 2 / rates[f"attention-{kind}-causal"]
        assert model.compute_s(kernel) == pytest.approx(expected)


def test_the_published_step_prices_end_to_end(published):
    profile = replace(load_profile("h100-32x8-ib400"), nodes=1, devices_per_node=4)
    cost_model = make_cost_model("auto", profile)
    fusion = modelled_fusion(published, "a fused attention call has no CPU kernel")
    baselines = captured_baselines(published, fusion, profile, cost_model, ("xla-tuned",))
    chosen = baselines["xla-tuned"]
    result = simulate(build_task_graph(published, chosen.plan), profile, cost_model)
    assert cost_model.name == "tables" and 0 < result.compute_s <= result.iteration_s


def test_an_in_place_update_moves_its_update_not_its_buffer():
    import jax

    def update(buffer, row, index):
        return jax.lax.dynamic_update_slice(buffer, row, (index, 0))

    buffer = jax.ShapeDtypeStruct((1024, 1024), jnp.float32)
    row = jax.ShapeDtypeStruct((1, 1024), jnp.float32)
    index = jax.ShapeDtypeStruct((), jnp.int32)
    module = capture_jax(update, buffer, row, index)
    (dus,) = [i for i in module.instructions() if i.opcode == "dynamic-update-slice"]
    kernel = kernel_for([dus])
    # The update and its two s32 start indices are read; the buffer is not.
    assert kernel.bytes_out == 4 * 1024 and kernel.bytes_in == 4 * 1024 + 2 * 4
