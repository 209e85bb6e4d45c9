"""`disco_xla.tf_function`: `tf.function(jit_compile=True)` for a training step,
running the module that disco-xla's plan rewrites, through TF's call_module op.

On the first call with a given input signature (the concrete function that
TensorFlow itself picks for the arguments, and the arguments' shapes: a trace
with unknown dimensions serves several), the step's HLO is captured, a plan is
read from the plan cache or searched, the module is rewritten, and the rewritten
program runs once beside the original on the same inputs (then its buckets
alone, if the plan's program does not agree). If the outputs agree
(the rule of `runtime.apply.compare_outputs`: bit-equal, or within 1e-6 of the
output scales), later calls with that signature run the rewritten program;
otherwise, or if anything at all fails on our side, the original runs, with one
`DiscoFallbackWarning` (a Python `warnings` warning) that says why. The first
call returns the original's result, so training never depends on an unchecked
program. Called inside another `tf.function`'s trace, the original runs.

With `check_speed` (the default), the plan's candidates are built as well (its
buckets alone, the search's next best plans, the best baseline: the plan
cache's `CandidateRecord`), every one that computes the same as the original is
timed against it, all called as the user calls them (after one untimed call
each that compiles the optimised step; `TIMING_ROUNDS` rotating rounds), and
the fastest runs; the original is kept, without a warning, if it is as fast or
faster here (`wrapped_step.slower_status`: the status says
"original: faster here ..."). The timed calls assign the step's variables like
any call: their values are saved before and assigned back after, so timing
trains nothing. The choice and the times go into the plan cache; a later first
call there (another process, or another wrapper) that finds a recorded choice
builds and checks that candidate alone (`wrapped_step.candidate_order`) and
times it beside the original only, as `disco_xla.jit` does; if the cache
records the original as faster, the original runs, nothing is rewritten. The
candidates report (`measurements()`) marks such a choice 'from_cache'.

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

import functools
import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from disco_xla.settings import DEFAULTS, OptimizeSettings
from disco_xla.timing import rotating_median_seconds
from disco_xla.wrapped_step import (
    TIMING_ROUNDS,
    DiscoFallbackWarning,
    WrappedStep,
    cached_label,
    candidate_order,
    fastest_label,
    one_line,
    slower_status,
)

__all__ = ["DiscoFallbackWarning", "TfFunction", "tf_function"]


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


@dataclass
class _Signature:
    status: str  # 'optimized' or 'original: <reason>'
    step: Any = None  # the optimised tf.function, when status is 'optimized'
    plan: Any = None
    comparison: Any = None
    timing: tuple[float, float] | None = None  # (original, optimised) median seconds per step
    candidates: dict[str, dict] = field(default_factory=dict)  # see WrappedStep.measurements


class TfFunction(WrappedStep):
    """A TF training step that runs disco-xla's rewritten program when it can and
    the original `tf.function` otherwise. Call it like the original; other
    attributes are the original's. `status()` says what each input signature
    runs; `last_used` says what the latest call ran ('optimized' or 'original')."""

    def __init__(self, function: Any, settings: OptimizeSettings):
        super().__init__(function, settings)
        self.last_used = ""

    def comparisons(self) -> list:
        """The first-call comparison (`OutputComparison`) of each checked signature."""
        return [s.comparison for s in self._by_signature.values() if s.comparison is not None]

    def timings(self) -> list[tuple[float, float]]:
        """(original, optimised) median seconds per step, as the first-call speed
        check measured them, for each signature it timed."""
        return [s.timing for s in self._by_signature.values() if s.timing is not None]

    def program_hlo(self, *args: Any, **kwargs: Any) -> str:
        """The HLO text, before XLA optimises it, of the program that a call with
        these arguments runs now: the optimised step's, or else the original's."""
        concrete_function = self._original.get_concrete_function(*args, **kwargs)
        flat_arguments = _flat_arguments(self._original, concrete_function, args, kwargs)
        signature = self._by_signature.get((concrete_function, _shapes(flat_arguments)))
        if signature is None or signature.step is None:
            bound = _bind(self._original, args, kwargs)
            return self._original.experimental_get_compiler_ir(*bound.args, **bound.kwargs)(
                stage="hlo"
            )
        return signature.step.experimental_get_compiler_ir(*flat_arguments)(stage="hlo")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        self.last_used = "original"
        if tf.inside_function():  # inside an outer trace: TF inlines the original
            return self._original(*args, **kwargs)
        try:
            concrete_function = self._original.get_concrete_function(*args, **kwargs)
        except Exception:  # noqa: BLE001 - let the original raise its own error
            return self._original(*args, **kwargs)
        try:
            flat_arguments = _flat_arguments(self._original, concrete_function, args, kwargs)
            # A trace with unknown dimensions serves several shapes; a module has one.
            key = (concrete_function, _shapes(flat_arguments))
        except Exception as error:  # noqa: BLE001 - never break training
            if (concrete_function, None) not in self._by_signature:
                status = f"original: could not flatten the arguments: {one_line(error)}"
                self._by_signature[(concrete_function, None)] = _Signature(status)
                _warn(self, status, depth=1)
            return self._original(*args, **kwargs)
        signature = self._by_signature.get(key)
        if signature is None:
            signature, result = self._first_call(concrete_function, flat_arguments, args, kwargs)
            self._by_signature[key] = signature
            return result
        if signature.step is None:
            return self._original(*args, **kwargs)
        try:
            flat_outputs = signature.step(*flat_arguments)
        except Exception as error:  # noqa: BLE001 - never break training
            signature.step = None
            signature.status = f"original: the rewritten program failed: {one_line(error)}"
            _warn(self, signature.status, depth=1)
            return self._original(*args, **kwargs)
        self.last_used = "optimized"
        return _pack_outputs(concrete_function, flat_outputs)

    def _first_call(
        self, concrete_function, flat_arguments: list, args: tuple, kwargs: dict
    ) -> tuple[_Signature, Any]:
        """Build the candidates, run the original, keep the candidates that
        compute the same, and with `check_speed` time them (`_TfCandidates`)."""
        signature = _Signature("original")
        reason, candidates, result = "", None, None
        try:
            module = self._capture(args, kwargs)
            layout = step_layout(module, concrete_function, flat_arguments)
            candidates = _TfCandidates(self, module, layout, concrete_function, flat_arguments)
            signature.plan = candidates.choice.plan
            if candidates.reuses_original:
                signature.status = candidates.cached_original_status()
                signature.candidates = candidates.report(signature)
                return signature, self._original(*args, **kwargs)
            result, equal = candidates.first_agreeing(args, kwargs)
        except Exception as error:  # noqa: BLE001 - never break training
            reason, equal = one_line(error), []
        if result is None:
            result = self._original(*args, **kwargs)
        if candidates is not None and not reason and not equal:
            reason = candidates.why()
        if equal:
            try:
                chosen = (
                    candidates.fastest(equal, args, kwargs)
                    if self._settings.check_speed
                    else equal[0]
                )
                candidates.finish(signature, chosen)
            except Exception as error:  # noqa: BLE001 - never break training
                signature.step = None
                reason = "the speed check failed: " + one_line(error)
        if candidates is not None:
            signature.candidates = candidates.report(signature)
        if reason:
            signature.status = "original: " + reason
            _warn(self, signature.status)
        return signature, result

    def _capture(self, args, kwargs):
        """The step's module for these arguments. Defaults are bound first:
        `experimental_get_compiler_ir` does not apply them itself (TF 2.21)."""
        from disco_xla.hlo_passes.graph import HloModule

        bound = _bind(self._original, args, kwargs)
        data = self._original.experimental_get_compiler_ir(*bound.args, **bound.kwargs)(
            stage="hlo_serialized"
        )
        return HloModule.from_bytes(data, f"<tf:{self.__name__}>", "memory")


class _TfCandidates:
    """The candidate programs of one first call: the plan, its buckets alone,
    and with `check_speed` the search's next best plans and the best baseline,
    each rewritten, compiled as a call_module program, run on the step's
    parameter values, compared with the original and timed beside it."""

    def __init__(self, function: TfFunction, module, layout, concrete_function, flat_arguments):
        from disco_xla.planning import find_plan

        self.function, self.module, self.layout = function, module, layout
        self.concrete_function, self.flat_arguments = concrete_function, flat_arguments
        self.choice = find_plan(module, function._settings)
        measuring = function._settings.check_speed
        # A choice measured on this machine before (the plan cache's record):
        # that candidate alone is tried, or none when the original was faster.
        self.reuses_original = measuring and self.choice.candidates.chosen == "original"
        self.order = {} if self.reuses_original else candidate_order(self.choice, measuring)
        self.from_cache = cached_label(self.choice, self.order)
        self.programs: dict[str, Any] = {}
        self.outputs: dict[str, list] = {}
        self.fingerprints: dict[str, str] = {}
        self.same_as: dict[str, str] = {}
        self.comparisons: dict[str, Any] = {}
        self.measured_s: dict[str, float] = {}
        self.steps: dict[str, Any] = {}  # label -> its optimised step, once timed
        self.chosen = "original"
        self.problems: list[str] = []

    def first_agreeing(self, args: tuple, kwargs: dict) -> tuple[Any, list[str]]:
        """Run the candidates (all at once when they are to be timed, else one
        after the other until one agrees) and the original; returns the
        original's result and the labels that computed the same, in order."""
        from disco_xla.runtime.apply import compare_outputs

        all_at_once = self.function._settings.check_speed
        labels = list(self.order)
        batches = [labels] if all_at_once else [[label] for label in labels]
        values = _parameter_values(self.layout, self.flat_arguments, self.concrete_function)
        result, expected = None, None
        for batch in batches:
            for label in batch:
                self._build_and_run(label, values)
            if result is None:
                result = self.function._original(*args, **kwargs)
                expected = _original_outputs(
                    result, self.layout, self.flat_arguments, self.concrete_function
                )
            equal = []
            for label in batch:
                if label not in self.outputs:
                    continue
                try:
                    self.comparisons[label] = compare_outputs(expected, self.outputs[label])
                except Exception as error:  # noqa: BLE001
                    self.problems.append("could not compare the outputs: " + one_line(error))
                    continue
                if self.comparisons[label].equal:
                    equal.append(label)
                else:
                    self.problems.append(
                        "the rewritten program's outputs differ from the original's (max "
                        f"relative difference {self.comparisons[label].max_rel_diff:.3g})"
                    )
            if equal:
                return result, equal
        return result, []

    def _build_and_run(self, label: str, values: list) -> None:
        from disco_xla.planning import has_cross_device_all_reduces, rewrite
        from disco_xla.runtime.tensorflow import CallModuleProgram, entry_parameter_shapes

        plan, fusion = self.order[label]
        try:
            # A step on one device has no all-reduces for JAX's compile to check;
            # the comparison in TF checks the rewritten program itself.
            rewritten = rewrite(
                self.module, plan, fusion, check=has_cross_device_all_reduces(self.module)
            )
            for other, fingerprint in self.fingerprints.items():
                if fingerprint == rewritten.fingerprint:
                    self.same_as[label] = other
                    return
            self.fingerprints[label] = rewritten.fingerprint
            program = CallModuleProgram(rewritten)
            original_parameters = [str(s) for s in entry_parameter_shapes(self.module)]
            if [str(s) for s in program.parameter_shapes] != original_parameters:
                raise MappingError("the rewritten module takes different parameters")
            self.outputs[label] = [t.numpy() for t in program(*values)]
            self.programs[label] = program
        except Exception as error:  # noqa: BLE001
            self.problems.append(
                f"{label}: {one_line(error)}" if label != "plan" else one_line(error)
            )

    def fastest(self, labels: list[str], args: tuple, kwargs: dict) -> str:
        """Time the original and each of `labels`' optimised steps, called as
        the user calls them, in rotating rounds (after one untimed call each,
        which compiles); the variables the steps assign get their values back
        afterwards. Returns the fastest label, or 'original' when none is
        strictly faster (`slower_status`)."""
        layout, flat, concrete = self.layout, self.flat_arguments, self.concrete_function
        steps = {label: _optimized_step(self.programs[label], layout, concrete) for label in labels}
        calls = {"original": lambda: self.function._original(*args, **kwargs)}
        calls.update({label: (lambda step=step: step(*flat)) for label, step in steps.items()})
        saved = _updated_variable_values(layout, flat, concrete)
        try:
            for call in calls.values():
                call()  # compiles; not timed
            self.measured_s = rotating_median_seconds(calls, TIMING_ROUNDS)
        finally:
            _assign_variables(layout, flat, concrete, saved)
        self.steps = steps
        return fastest_label(self.measured_s, labels)

    def finish(self, signature: _Signature, chosen: str) -> None:
        """Fill `signature` with the chosen program (or the original's status),
        and store the measured choice in the plan cache."""
        from disco_xla.planning import remember_measurement

        self.chosen = chosen
        if self.measured_s:
            remember_measurement(self.choice, self.function._settings, chosen, self.measured_s)
        if chosen == "original":
            best = min(self.measured_s.keys() - {"original"}, key=self.measured_s.get)
            signature.status = slower_status(
                self.measured_s["original"], self.measured_s[best], self._status_of(best)
            )
            signature.comparison = self.comparisons[best]
            signature.timing = (self.measured_s["original"], self.measured_s[best])
            return
        signature.status = self._status_of(chosen)
        signature.comparison = self.comparisons[chosen]
        signature.plan = self.order[chosen][0]
        signature.step = self.steps.get(chosen) or _optimized_step(
            self.programs[chosen], self.layout, self.concrete_function
        )
        if chosen in self.measured_s:
            signature.timing = (self.measured_s["original"], self.measured_s[chosen])

    def _status_of(self, label: str) -> str:
        if label == "plan":
            return "optimized"
        if label == "buckets":
            # Timed and the plan not refused (it may not have been tried: a
            # cached measurement chose the buckets alone).
            plan_refused = "plan" in self.comparisons and not self.comparisons["plan"].equal
            won_on_time = not plan_refused and "buckets" in self.measured_s
            why = "measured fastest" if won_on_time else "the plan's fusion changed results"
            return f"optimized (buckets only: {why})"
        return f"optimized ({label}, measured fastest)"

    def report(self, signature: _Signature) -> dict[str, dict]:
        """`measurements()`' entry for this signature."""
        simulated = self.choice.candidates.simulated_s
        entries: dict[str, dict] = {}
        for label in self.order:
            entry: dict = {}
            if label in simulated:
                entry["simulated_s"] = simulated[label]
            if label in self.same_as:
                entry["same_as"] = self.same_as[label]
            elif label in self.comparisons:
                entry["equal"] = self.comparisons[label].equal
            elif label not in self.programs:
                continue
            if label in self.measured_s:
                entry["measured_s"] = self.measured_s[label]
            entry["chosen"] = label == self.chosen and signature.step is not None
            if label == self.from_cache:
                entry["from_cache"] = True
            entries[label] = entry
        entries["original"] = {"chosen": signature.step is None}
        if "original" in simulated:  # XLA's own program, as the simulator sees it
            entries["original"]["simulated_s"] = simulated["original"]
        if "original" in self.measured_s:
            entries["original"]["measured_s"] = self.measured_s["original"]
        if self.reuses_original:
            entries["original"]["from_cache"] = True
        return entries

    def cached_original_status(self) -> str:
        """The status when the plan cache records that the original ran faster
        on this machine than every candidate: with the times measured then."""
        measured = self.choice.candidates.measured_s
        others = {label: t for label, t in measured.items() if label != "original"}
        status = None
        if "original" in measured and others:
            best = min(others, key=others.get)
            status = slower_status(measured["original"], others[best], f"optimized ({best})")
        if status is None:
            return "original: faster here (measured before, from the plan cache)"
        return status.removesuffix(")") + ", from the plan cache)"

    def why(self) -> str:
        return "; ".join(dict.fromkeys(self.problems)) or "no program agreed with the original"


def step_layout(module, concrete_function, flat_arguments) -> StepLayout:
    """Pair the module's entry parameters and results with `concrete_function`'s
    inputs and outputs (see the module docstring); raises MappingError when they
    do not line up."""
    from disco_xla.runtime.tensorflow import (
        entry_parameter_shapes,
        entry_result_shapes,
        resource_updates,
        tf_dtype,
    )

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


def _bind(function, args: tuple, kwargs: dict) -> inspect.BoundArguments:
    bound = inspect.signature(function.python_function).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


def _flat_arguments(function, concrete_function, args: tuple, kwargs: dict) -> list:
    """The tensors (and variables) among the arguments, in the order of the
    concrete function's inputs, as TensorFlow's own call path orders them
    (defaults bound first: the concrete function's type does not hold them)."""
    from tensorflow.python.eager.polymorphic_function import function_type_utils

    function_type = concrete_function.function_type
    with_defaults = _bind(function, args, kwargs)
    bound = function_type_utils.canonicalize_function_inputs(
        with_defaults.args, with_defaults.kwargs, function_type
    )
    return list(function_type.unpack_inputs(bound))


def _shapes(flat_arguments: list) -> tuple:
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


def _optimized_step(program, layout: StepLayout, concrete_function):
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


def _pack_outputs(concrete_function, flat_outputs: list) -> Any:
    """The flat outputs in the original's output structure (None leaves kept)."""
    import tensorflow as tf

    structure = concrete_function.structured_outputs
    if structure is None:
        return None
    leaves = tf.nest.flatten(structure, expand_composites=True)
    flat_outputs = iter(flat_outputs)
    filled = [None if leaf is None else next(flat_outputs) for leaf in leaves]
    return tf.nest.pack_sequence_as(structure, filled, expand_composites=True)


def _warn(function: TfFunction, why: str, depth: int = 2) -> None:
    """Warn, pointing at the user's call: `depth` of our frames lie between
    this function and it."""
    function._warn("tf_function", why, stacklevel=depth + 2)


def tf_function(
    fn: Callable | None = None,
    *,
    cluster: str = DEFAULTS.cluster,
    budget_s: float = DEFAULTS.budget_s,
    max_evaluations: int = DEFAULTS.max_evaluations,
    seed: int = DEFAULTS.seed,
    cost_model: str = DEFAULTS.cost_model,
    cache_dir: str | None = DEFAULTS.cache_dir,
    use_cache: bool = DEFAULTS.use_cache,
    check_speed: bool = DEFAULTS.check_speed,
    candidates: int = DEFAULTS.candidates,
    measure_budget_s: float = DEFAULTS.measure_budget_s,
    **tf_function_kwargs: Any,
) -> Any:
    """Like `tf.function(fn, jit_compile=True, **tf_function_kwargs)`, for a
    training step, with disco-xla's plan for `cluster` applied. `fn` may already
    be a `tf.function` (it must have `jit_compile=True`), in which case no
    tf.function keyword arguments are taken. With `check_speed` the original is
    kept where it runs faster (timed on the first call). Usable as
    `@disco_xla.tf_function` or `@disco_xla.tf_function(cluster=...)`."""
    settings_arguments = dict(
        cluster=cluster,
        budget_s=budget_s,
        max_evaluations=max_evaluations,
        seed=seed,
        cost_model=cost_model,
        cache_dir=cache_dir,
        use_cache=use_cache,
        check_speed=check_speed,
        candidates=candidates,
        measure_budget_s=measure_budget_s,
    )
    if fn is None:
        return functools.partial(tf_function, **settings_arguments, **tf_function_kwargs)
    settings = OptimizeSettings(**settings_arguments)
    if hasattr(fn, "experimental_get_compiler_ir") and hasattr(fn, "get_concrete_function"):
        if tf_function_kwargs:
            raise TypeError(
                "a function that is already a tf.function takes no tf.function arguments"
            )
        return TfFunction(fn, settings)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf_function_kwargs.setdefault("jit_compile", True)
    return TfFunction(tf.function(fn, **tf_function_kwargs), settings)
