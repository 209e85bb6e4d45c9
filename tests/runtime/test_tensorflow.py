"""Modules captured live from TensorFlow, run back inside TF through call_module."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from disco_xla.capture import capture_tf
from disco_xla.hlo.graph import HloModule
from disco_xla.runtime.tensorflow import CallModuleProgram, ResourceUpdate, resource_updates


def _variable_values(program: CallModuleProgram, concrete_function, first: int) -> list:
    return [
        tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
        for handle, dtype in zip(
            concrete_function.captured_inputs, program.parameter_dtypes[first:], strict=True
        )
    ]


def test_unrewritten_train_step_through_call_module_is_bit_equal(captured):
    raw, step, args = captured["tf_train_step"]
    program = CallModuleProgram(HloModule.from_bytes(raw, "tf_train_step"))
    values = _variable_values(program, step.get_concrete_function(*args), len(args))
    outputs = program(*args, *values)
    expected = tf.nest.flatten(step(*args))
    assert len(outputs) == len(expected) == len(program.result_shapes)
    for got, want in zip(outputs, expected, strict=True):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_array_result_gives_one_output():
    @tf.function(jit_compile=True)
    def scaled(x):
        return tf.tanh(x) * 3.0

    x = tf.constant(np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4))
    program = CallModuleProgram(capture_tf(scaled, x))
    assert not program.result_shapes[0].is_tuple and len(program.result_shapes) == 1
    (output,) = program(x)
    np.testing.assert_array_equal(output.numpy(), scaled(x).numpy())


def test_assigned_variables_are_aliased_outputs_after_the_returned_ones():
    kernel = tf.Variable(tf.ones((2, 2)))
    steps = tf.Variable(0, dtype=tf.int64)
    scale = tf.Variable(0.5)  # read, never assigned

    @tf.function(jit_compile=True)
    def update(x):
        kernel.assign(kernel * scale + x)
        steps.assign_add(1)
        return tf.reduce_sum(kernel)

    x = tf.fill((2, 2), 2.0)
    module = capture_tf(update, x)
    concrete_function = update.get_concrete_function(x)
    program = CallModuleProgram(module)  # TF's modules end in copies: they must convert
    # Parameters: the argument, then the captured variables in `captured_inputs` order.
    handles = list(concrete_function.captured_inputs)
    parameter_of = {
        name: 1 + [h is variable.handle for h in handles].index(True)
        for name, variable in (("kernel", kernel), ("steps", steps), ("scale", scale))
    }
    assert len(program.parameter_shapes) == 1 + len(handles) == 4
    # Results: the returned tensor, then one new value per assigned variable, in
    # parameter order, each aliased to its variable's parameter.
    updates = resource_updates(module)
    assert updates == [
        ResourceUpdate(1 + rank, number)
        for rank, number in enumerate(sorted([parameter_of["kernel"], parameter_of["steps"]]))
    ]
    outputs = program(x, *_variable_values(program, concrete_function, 1))
    total = update(x)  # assigns
    assert outputs[0].numpy() == total.numpy()
    for update_ in updates:
        variable = kernel if update_.parameter_number == parameter_of["kernel"] else steps
        np.testing.assert_array_equal(outputs[update_.output_index].numpy(), variable.numpy())
