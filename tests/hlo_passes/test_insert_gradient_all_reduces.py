"""The insert-gradient-all-reduces pass makes a single-device step data-parallel."""

from __future__ import annotations

import numpy as np
import pytest

from disco_xla import DiscoInputError
from disco_xla.hlo.gradients import GRADIENT_MARK
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo_passes.insert_gradient_all_reduces import InsertGradientAllReduces
from disco_xla.runtime.xla_runner import ReplicatedProgram, random_arguments
from tests.conftest import _tf_train_step

VARIABLES = 4  # two Dense layers: kernel and bias each


@pytest.fixture()
def tf_step_module(captured):
    return HloModule.from_bytes(captured["tf_train_step"][0], "tf_step")


def test_one_marked_all_reduce_per_gradient_output(tf_step_module):
    assert InsertGradientAllReduces([1, 2, 3, 4], replicas=2, gradient_names=list("abcd")).run(
        tf_step_module
    )
    reduces = tf_step_module.gradient_all_reduces
    assert len(reduces) == VARIABLES
    marks = sorted(i.op_name for i in tf_step_module.instructions() if i.opcode == "all-reduce")
    assert marks == [f"{GRADIENT_MARK}/{name}" for name in "abcd"]


def test_replicas_apply_the_mean_gradient(tf_step_module):
    original = HloModule.from_bytes(tf_step_module.to_bytes(), "original")
    InsertGradientAllReduces(list(range(1, 1 + VARIABLES)), replicas=2).run(tf_step_module)
    single = ReplicatedProgram(original, replicas=1)
    double = ReplicatedProgram(tf_step_module, replicas=2)
    first = random_arguments(single.parameters, seed=0)
    second = random_arguments(single.parameters, seed=1)[:2] + first[2:]  # other data
    local = [single.run([first])[0], single.run([second])[0]]
    together = double.run([first, second])
    for index in range(1, 1 + VARIABLES):
        mean = (local[0][index] + local[1][index]) / 2
        np.testing.assert_allclose(together[0][index], mean, rtol=1e-6, atol=1e-7)
        assert np.array_equal(together[0][index], together[1][index])
        # Without the pass the two replicas' gradients differ.
        assert not np.array_equal(local[0][index], local[1][index])
    for index in range(1 + VARIABLES, 1 + 2 * VARIABLES):  # the updated variables
        assert np.array_equal(together[0][index], together[1][index])


def test_no_gradients_means_no_change_and_bad_outputs_are_refused(tf_step_module):
    before = tf_step_module.to_bytes()
    assert not InsertGradientAllReduces([], replicas=2).run(tf_step_module)
    assert tf_step_module.to_bytes() == before
    with pytest.raises(DiscoInputError, match="output 99 does not exist"):
        InsertGradientAllReduces([99], replicas=2).run(tf_step_module)


def test_conftest_step_has_the_expected_outputs():
    fn, args, variables = _tf_train_step()
    assert variables == VARIABLES


# A step whose weight gradient is computed from its bias gradient, as batch norm
# computes its input gradient from its beta gradient.
REUSED_GRADIENT = """HloModule reused

sum {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = f32[] add(a, b)
}

ENTRY main {
  x = f32[8] parameter(0)
  w = f32[8] parameter(1)
  y = f32[8] multiply(x, w)
  dy = f32[8] tanh(y)
  zero = f32[] constant(0)
  grad_bias = f32[] reduce(dy, zero), dimensions={0}, to_apply=sum
  spread = f32[8] broadcast(grad_bias), dimensions={}
  centred = f32[8] subtract(dy, spread)
  grad_w = f32[8] multiply(centred, x)
  ROOT out = (f32[], f32[8]) tuple(grad_bias, grad_w)
}
"""


def test_backward_code_reads_the_local_gradient_as_under_horovod():
    from disco_xla.hlo.hlo_io import module_from_text
    from disco_xla.plan import gradient_dependencies

    module = module_from_text(REUSED_GRADIENT)
    original = HloModule.from_bytes(module.to_bytes(), "original")
    InsertGradientAllReduces([0, 1], replicas=2).run(module)
    # The weight gradient's all-reduce does not wait for the bias gradient's.
    assert len(module.gradient_all_reduces) == 2 and gradient_dependencies(module) == {}
    single = ReplicatedProgram(original, replicas=1)
    double = ReplicatedProgram(module, replicas=2)
    first = random_arguments(single.parameters, seed=0)
    second = [random_arguments(single.parameters, seed=1)[0], first[1]]  # other data
    local = [single.run([first])[0], single.run([second])[0]]
    together = double.run([first, second])
    for index in range(2):  # each replica applies the mean of the local gradients
        mean = (local[0][index] + local[1][index]) / 2
        np.testing.assert_allclose(together[0][index], mean, rtol=1e-6, atol=1e-7)


# A step whose one output is a weight gradient, computed through a reshape.
ONE_GRADIENT = """HloModule one_gradient

ENTRY main {
  x = f32[8] parameter(0)
  w = f32[8] parameter(1)
  product = f32[8] multiply(x, w)
  grad_w = f32[2,4] reshape(product)
  ROOT out = (f32[2,4]) tuple(grad_w)
}
"""


def test_the_output_reads_the_mean_of_the_all_reduced_producer():
    from disco_xla.hlo.hlo_io import module_from_text

    module = module_from_text(ONE_GRADIENT, "one_gradient")
    before = module.to_bytes()
    assert not InsertGradientAllReduces([], replicas=2).run(module)
    assert module.to_bytes() == before
    assert InsertGradientAllReduces([0], replicas=2, gradient_names=["w"]).run(module)
    (output,) = module.entry.root.operands
    assert output.opcode == "reshape"  # the view, now of the mean
    mean = output.operands[0]
    assert mean.opcode == "divide" and mean.op_name == f"{GRADIENT_MARK}/w/mean"
    reduced, count = mean.operands
    assert reduced.opcode == "all-reduce" and reduced.op_name == f"{GRADIENT_MARK}/w"
    assert reduced.operands[0].name == "product"
    assert count.opcode == "broadcast" and count.operands[0].proto.literal.f32s == [2.0]
    (gradient,) = module.gradient_all_reduces
    assert gradient.name == reduced.name and gradient.group_size == 2
