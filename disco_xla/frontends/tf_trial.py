"""The TensorFlow side of a step's trial (`trial.Trial`): each candidate's
rewritten module compiled as a call_module program, run on the step's
parameter values, judged against the original `tf.function`'s outputs and
variable updates, and timed as an optimised step (`optimized_step`).

How a step's variables map onto the module (verified on TF 2.21). The module's
entry parameters are, in parameter-number order, the concrete function's
`inputs`: the flat tensor arguments (after binding defaults; Python values such
as `training=True` are baked in; a variable passed as an argument is a resource
input here), then `captured_inputs` (resource handles of the variables it reads
or writes, in order of first use, and captured eager tensors). A resource
parameter carries the variable's value. The entry result is the function's flat
outputs (`concrete_function.outputs`, that is the non-None leaves of its
structured outputs, in `tf.nest.flatten` order), then one new value per assigned
variable, in parameter order; the module's `input_output_alias` pairs each of
those outputs with the variable's parameter. A function returning one tensor
and assigning nothing has an array result, not a tuple.

The optimised step reads the variables, runs the rewritten module, assigns the
aliased outputs and returns the rest, packed into the original's output
structure, all inside one `tf.function(jit_compile=True)`.

For the first-call check the variables are read first, the rewritten module
runs without assigning anything, then the original runs (and assigns); its
outputs and the variables' new values are compared with the rewritten outputs.

The original runs (with the warning) when the mapping cannot be established:
an argument that XLA needs as a compile-time constant (the module then has
fewer parameters than the function has inputs: `tf.reshape(x, shape_argument)`),
outputs that are not the function's outputs followed by exactly the aliased
variable updates, an alias inside a tuple, or any shape or dtype that differs
between the module and the function.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from disco_xla.driver.checked_rewrite import rewrite
from disco_xla.driver.planning import find_plan, has_cross_device_all_reduces
from disco_xla.driver.trial import Trial
from disco_xla.runtime.output_comparison import compare_outputs
from disco_xla.runtime.tensorflow import (
    CallModuleProgram,
    entry_parameter_shapes,
    entry_result_shapes,
    resource_updates,
    tf_dtype,
)
from disco_xla.runtime.xla_runner import compile_separately

# TensorFlow is optional (the `tf` extra): imported inside the functions that use it.

if TYPE_CHECKING:
    from disco_xla.frontends.tf_api import TfFunction


class MappingError(RuntimeError):
    """The module's parameters or outputs do not line up with the function's."""


@dataclass(frozen=True)
class _Source:
    """Where one entry parameter's value comes from."""

    kind: str  # 'argument' (a flat tensor argument) or 'captured'
    index: int  # into the flat arguments or into `captured_inputs`
    is_variable: bool  # a resource: the parameter is the variable's value


@dataclass(frozen=True)
class StepLayout:
    """How the module's parameters and results relate to a concrete function."""

    sources: tuple[_Source, ...]  # one per entry parameter
    parameter_dtypes: tuple  # tf.DType per entry parameter (a variable's value dtype)
    output_count: int  # the function's flat outputs lead the result
    updates: tuple  # ResourceUpdate per assigned variable, after the outputs


class TfTrial(Trial):
    """The candidates of one signature of a `TfFunction`, run on the values
    its parameters have before the first call (the original, which runs after
    them, assigns the variables), and timed as optimised steps that read and
    assign the variables (their values are saved before the timing and
    assigned back after, so timing trains nothing)."""

    def __init__(
        self,
        function: TfFunction,
        module,
        layout: StepLayout,
        concrete_function,
        flat_arguments: list,
        args: tuple,
        kwargs: dict,
    ):
        settings = function._planning_settings()  # raises where no profile fits
        choice = find_plan(module, settings, compile_separately)
        super().__init__(module, choice, settings)
        self.function, self.layout, self.concrete_function = function, layout, concrete_function
        self.flat_arguments, self.args, self.kwargs = flat_arguments, args, kwargs
        self.steps: dict[str, Any] = {}  # label -> its optimised step, once timed
        self._saved: list = []
        # Read before anything runs (reads are snapshots: later assignments copy).
        self.values = _parameter_values(layout, self.flat_arguments, concrete_function)

    def _rewritten(self, plan, fusion: bool):
        # A step on one device has no all-reduces for JAX's compile to check;
        # the comparison in TF checks the rewritten program itself.
        return rewrite(self.module, plan, fusion, check=has_cross_device_all_reduces(self.module))

    def _compile(self, label: str, module, plan):
        program = CallModuleProgram(module)
        original_parameters = [str(s) for s in entry_parameter_shapes(self.module)]
        if [str(s) for s in program.parameter_shapes] != original_parameters:
            raise MappingError("the rewritten module takes different parameters")
        return program

    def _run(self, label: str, program):
        return [t.numpy() for t in program(*self.values)]

    def _run_original(self):
        result = self.function._original(*self.args, **self.kwargs)
        expected = _original_outputs(
            result, self.layout, self.flat_arguments, self.concrete_function
        )
        return result, expected

    def _compare(self, expected, outputs):
        return compare_outputs(expected, outputs)

    def _timed_calls(self, labels: list[str]):
        layout, flat, concrete = self.layout, self.flat_arguments, self.concrete_function
        self.steps = {
            label: optimized_step(self.programs[label], layout, concrete) for label in labels
        }
        calls = {"original": lambda: self.function._original(*self.args, **self.kwargs)}
        calls.update({label: (lambda step=step: step(*flat)) for label, step in self.steps.items()})
        self._saved = _updated_variable_values(layout, flat, concrete)
        return calls, None

    def _after_timing(self) -> None:
        _assign_variables(self.layout, self.flat_arguments, self.concrete_function, self._saved)

    def _install(self, record, chosen: str) -> None:
        record.run = self.steps.get(chosen) or optimized_step(
            self.programs[chosen], self.layout, self.concrete_function
        )


def step_layout(module, concrete_function, flat_arguments) -> StepLayout:
    """Pair the module's entry parameters and results with `concrete_function`'s
    inputs and outputs (see the module docstring); raises MappingError when they
    do not line up."""
    parameters = entry_parameter_shapes(module)
    inputs = list(concrete_function.inputs)
    captured = list(concrete_function.captured_inputs)
    if len(flat_arguments) + len(captured) != len(inputs):
        raise MappingError(
            f"{len(flat_arguments)} arguments and {len(captured)} captured inputs, "
            f"but the function has {len(inputs)} inputs"
        )
    if len(parameters) != len(inputs):
        raise MappingError(
            f"the module has {len(parameters)} parameters, the function {len(inputs)} inputs "
            "(an argument used as a compile-time constant?)"
        )
    sources = []
    for number, (shape, placeholder) in enumerate(zip(parameters, inputs, strict=True)):
        is_variable = placeholder.dtype.name == "resource"
        if number < len(flat_arguments):
            source = _Source("argument", number, is_variable)
        else:
            source = _Source("captured", number - len(flat_arguments), is_variable)
        if not is_variable and (
            placeholder.dtype != tf_dtype(shape)
            or not placeholder.shape.is_compatible_with(shape.dims)
        ):
            raise MappingError(
                f"parameter {number} is {shape}, the function's input is "
                f"{placeholder.dtype.name}{placeholder.shape}"
            )
        sources.append(source)
    results = entry_result_shapes(module)
    outputs = list(concrete_function.outputs)
    updates = resource_updates(module)
    if [u.output_index for u in updates] != list(range(len(outputs), len(results))):
        raise MappingError(
            f"the module's {len(results)} results are not the function's {len(outputs)} "
            f"outputs followed by its {len(updates)} variable updates"
        )
    for update in updates:
        if not sources[update.parameter_number].is_variable:
            raise MappingError(f"output {update.output_index} updates a non-variable parameter")
    for index, (shape, output) in enumerate(zip(results, outputs, strict=False)):
        if output.dtype != tf_dtype(shape) or not output.shape.is_compatible_with(shape.dims):
            raise MappingError(
                f"result {index} is {shape}, the function's output is "
                f"{output.dtype.name}{output.shape}"
            )
    dtypes = tuple(tf_dtype(shape) for shape in parameters)
    return StepLayout(tuple(sources), dtypes, len(outputs), tuple(updates))


def bound_arguments(function, args: tuple, kwargs: dict) -> inspect.BoundArguments:
    bound = inspect.signature(function.python_function).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def flat_arguments(function, concrete_function, args: tuple, kwargs: dict) -> list:
    """The tensors (and variables) among the arguments, in the order of the
    concrete function's inputs, as TensorFlow's own call path orders them
    (defaults bound first: the concrete function's type does not hold them)."""
    from tensorflow.python.eager.polymorphic_function import function_type_utils

    function_type = concrete_function.function_type
    with_defaults = bound_arguments(function, args, kwargs)
    bound = function_type_utils.canonicalize_function_inputs(
        with_defaults.args, with_defaults.kwargs, function_type
    )
    return list(function_type.unpack_inputs(bound))


def shapes_of(flat_arguments: list) -> tuple:
    return tuple((x.dtype.name, tuple(x.shape)) for x in flat_arguments)


def _handle(source: _Source, flat_arguments: list, captured: list):
    value = flat_arguments[source.index] if source.kind == "argument" else captured[source.index]
    return getattr(value, "handle", value)


def _read_variable(handle, dtype):
    import tensorflow as tf

    return tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)


def _parameter_values(layout: StepLayout, flat_arguments: list, concrete_function) -> list:
    """The module's parameter values now: arguments, captured tensors, and the
    variables' current values (reads are snapshots: later assignments copy)."""
    captured = list(concrete_function.captured_inputs)
    values = []
    for source, dtype in zip(layout.sources, layout.parameter_dtypes, strict=True):
        value = _handle(source, flat_arguments, captured)
        values.append(_read_variable(value, dtype) if source.is_variable else value)
    return values


def optimized_step(program, layout: StepLayout, concrete_function):
    """One `tf.function(jit_compile=True)` taking the flat arguments: read the
    variables, run the rewritten module, assign the updates, return the outputs.
    It compiles on its first call (a second compile of the rewritten module: the
    checked run was the pure program; nesting that compiled function inside a
    non-compiled step measured no saving, as TF compiles it again there)."""
    import tensorflow as tf

    captured = list(concrete_function.captured_inputs)

    def step(*flat_arguments):
        values = []
        for source, dtype in zip(layout.sources, layout.parameter_dtypes, strict=True):
            value = _handle(source, flat_arguments, captured)
            values.append(_read_variable(value, dtype) if source.is_variable else value)
        outputs = program.call(values)
        for update in layout.updates:
            handle = _handle(layout.sources[update.parameter_number], flat_arguments, captured)
            tf.raw_ops.AssignVariableOp(resource=handle, value=outputs[update.output_index])
        return outputs[: layout.output_count]

    return tf.function(step, autograph=False, jit_compile=True)


def _updated_variable_values(layout: StepLayout, flat_arguments, concrete_function) -> list:
    """The current values of the variables the step assigns (snapshots)."""
    captured = list(concrete_function.captured_inputs)
    values = []
    for update in layout.updates:
        handle = _handle(layout.sources[update.parameter_number], flat_arguments, captured)
        values.append(_read_variable(handle, layout.parameter_dtypes[update.parameter_number]))
    return values


def _assign_variables(layout: StepLayout, flat_arguments, concrete_function, values) -> None:
    """Give the variables the step assigns the `values` read earlier."""
    import tensorflow as tf

    captured = list(concrete_function.captured_inputs)
    for update, value in zip(layout.updates, values, strict=True):
        handle = _handle(layout.sources[update.parameter_number], flat_arguments, captured)
        tf.raw_ops.AssignVariableOp(resource=handle, value=value)


def _original_outputs(result, layout: StepLayout, flat_arguments, concrete_function) -> list:
    """What to compare with the module's results: the original's flat outputs,
    then the new values of the variables it assigned."""
    import tensorflow as tf

    outputs = [t for t in tf.nest.flatten(result, expand_composites=True) if t is not None]
    if len(outputs) != layout.output_count:
        raise MappingError(f"the original returned {len(outputs)} tensors")
    outputs += _updated_variable_values(layout, flat_arguments, concrete_function)
    return [t.numpy() for t in outputs]


def pack_outputs(concrete_function, flat_outputs: list) -> Any:
    """The flat outputs in the original's output structure (None leaves kept)."""
    import tensorflow as tf

    structure = concrete_function.structured_outputs
    if structure is None:
        return None
    leaves = tf.nest.flatten(structure, expand_composites=True)
    flat_outputs = iter(flat_outputs)
    filled = [None if leaf is None else next(flat_outputs) for leaf in leaves]
    return tf.nest.pack_sequence_as(structure, filled, expand_composites=True)
