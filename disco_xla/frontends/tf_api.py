"""`disco_xla.tf_function`: `tf.function(jit_compile=True)` for a training step,
running the module that disco-xla's plan rewrites, through TF's call_module op.

On the first call with a given input signature (the concrete function that
TensorFlow itself picks for the arguments, and the arguments' shapes: a trace
with unknown dimensions serves several), the step's HLO is captured, a plan is
read from the plan cache or searched, the module is rewritten, and the rewritten
program runs once beside the original on the same inputs (then its buckets
alone, if the plan's program does not agree). If the outputs agree
(the rule of `runtime.output_comparison.compare_outputs`: bit-equal, or within 1e-6 of the
output scales), later calls with that signature run the rewritten program;
otherwise, or if anything at all fails on our side, the original runs, with one
`DiscoFallbackWarning` (a Python `warnings` warning) that says why. The first
call returns the original's result, so training never depends on an unchecked
program. Called inside another `tf.function`'s trace, the original runs.

With `check_speed` (the default), the plan's other candidates are built as
well, and every one that computes the same as the original is timed against it,
all called as the user calls them, and the fastest runs, or the original when
it is as fast here (status "original: faster here ..."). The timed calls assign
the step's variables like any call: their values are saved before and assigned
back after, so timing trains nothing. Which candidates, the timing rule and
how the plan cache's recorded choice is reused are the same as for
`disco_xla.jit`: `trial.Trial`, whose TensorFlow side is `tf_trial.TfTrial`.

How the module's parameters and results map onto the function's inputs,
outputs and variables, and when the original runs because they cannot be
paired: `tf_trial`.

The cluster profile defaults to `cluster="auto"`, as for `disco_xla.jit`, read
from TensorFlow's devices on the first call (`tf_devices`): the GPUs' kind as
TensorFlow reports it (`get_device_details`), else the CPU; one process, or as
many as `TF_CONFIG` names workers (a `MultiWorkerMirroredStrategy` job).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any

from disco_xla.driver.signature_record import RecordState, SignatureRecord, fallback_record
from disco_xla.errors import one_line
from disco_xla.frontends.tf_trial import (
    TfTrial,
    bound_arguments,
    flat_arguments,
    pack_outputs,
    shapes_of,
    step_layout,
)
from disco_xla.frontends.wrapped_step import DiscoFallbackWarning, WrappedStep
from disco_xla.hlo.graph import HloModule
from disco_xla.settings import (
    AUTO_CLUSTER,
    WRAPPED_STEP_DEFAULTS,
    OptimizeSettings,
    settings_given,
)
from disco_xla.simulator.profile_choice import MIXED_KINDS, DeviceDescription

# TensorFlow is optional (the `tf` extra): imported inside the functions that use it.

__all__ = ["DiscoFallbackWarning", "TfFunction", "tf_function"]


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
        flat = flat_arguments(self._original, concrete_function, args, kwargs)
        signature = self._by_signature.get((concrete_function, shapes_of(flat)))
        if signature is None or signature.run is None:
            bound = bound_arguments(self._original, args, kwargs)
            return self._original.experimental_get_compiler_ir(*bound.args, **bound.kwargs)(
                stage="hlo"
            )
        return signature.run.experimental_get_compiler_ir(*flat)(stage="hlo")

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
            flat = flat_arguments(self._original, concrete_function, args, kwargs)
            # A trace with unknown dimensions serves several shapes; a module has one.
            key = (concrete_function, shapes_of(flat))
        except Exception as error:  # noqa: BLE001 - never break training
            if (concrete_function, None) not in self._by_signature:
                record = fallback_record(f"could not flatten the arguments: {one_line(error)}")
                self._by_signature[(concrete_function, None)] = record
                _warn(self, record.status, depth=1)
            return self._original(*args, **kwargs)
        signature = self._by_signature.get(key)
        if signature is None and self._settings.cluster == AUTO_CLUSTER:
            self._resolve_cluster(tf_devices)  # once: the devices of the first call
        if signature is None:
            signature, result = self._first_call(concrete_function, flat, args, kwargs)
            self._by_signature[key] = signature
            return result
        if signature.run is None:
            return self._original(*args, **kwargs)
        try:
            flat_outputs = signature.run(*flat)
        except Exception as error:  # noqa: BLE001 - never break training
            signature.fall_back(f"the rewritten program failed: {one_line(error)}")
            _warn(self, signature.status, depth=1)
            return self._original(*args, **kwargs)
        self.last_used = "optimized"
        return pack_outputs(concrete_function, flat_outputs)

    def _first_call(
        self, concrete_function, flat: list, args: tuple, kwargs: dict
    ) -> tuple[SignatureRecord, Any]:
        """Build the candidates, run the original, keep the candidates that
        compute the same, and with `check_speed` time them (`TfTrial`)."""
        record, trial = SignatureRecord("original"), None
        try:
            module = self._capture(args, kwargs)
            layout = step_layout(module, concrete_function, flat)
            trial = TfTrial(self, module, layout, concrete_function, flat, args, kwargs)
            result = trial.run_first_call(record)
        except Exception as error:  # noqa: BLE001 - never break training
            record.fall_back(one_line(error))
            if trial is not None:
                record.candidates = trial.report("original")
            ran = trial is not None and trial.original_ran
            result = trial.original_result if ran else self._original(*args, **kwargs)
        if record.state is RecordState.FALLBACK:
            _warn(self, record.status)
        return record, result

    def _capture(self, args, kwargs):
        """The step's module for these arguments. Defaults are bound first:
        `experimental_get_compiler_ir` does not apply them itself (TF 2.21)."""
        bound = bound_arguments(self._original, args, kwargs)
        data = self._original.experimental_get_compiler_ir(*bound.args, **bound.kwargs)(
            stage="hlo_serialized"
        )
        return HloModule.from_bytes(data, f"<tf:{self.__name__}>", "memory")


def tf_devices() -> DeviceDescription:
    """What `cluster="auto"` reads of TensorFlow's devices: the local GPUs and
    their kind, else the logical CPU devices; the processes `TF_CONFIG` names
    (its chief and workers), else one."""
    import tensorflow as tf

    processes = _tf_config_processes()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = [tf.config.experimental.get_device_details(gpu) for gpu in gpus]
        kinds = dict.fromkeys(detail.get("device_name", "unnamed GPU") for detail in details)
        return DeviceDescription("gpu", MIXED_KINDS.join(kinds), len(gpus), processes)
    cpus = tf.config.list_logical_devices("CPU")
    return DeviceDescription("cpu", "cpu", len(cpus), processes)


def _tf_config_processes() -> int:
    """The chief and workers of the `TF_CONFIG` job description, or 1."""
    try:
        cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
        count = sum(len(cluster.get(task, [])) for task in ("chief", "worker"))
    except (ValueError, AttributeError, TypeError):
        return 1
    return max(1, count)


def _warn(function: TfFunction, why: str, depth: int = 2) -> None:
    """Warn, pointing at the user's call: `depth` of our frames lie between
    this function and it."""
    function._warn("tf_function", why, stacklevel=depth + 2)


def tf_function(
    fn: Callable | None = None,
    *,
    cluster: str = WRAPPED_STEP_DEFAULTS.cluster,
    budget_s: float = WRAPPED_STEP_DEFAULTS.budget_s,
    max_evaluations: int = WRAPPED_STEP_DEFAULTS.max_evaluations,
    alpha: float = WRAPPED_STEP_DEFAULTS.alpha,
    seed: int = WRAPPED_STEP_DEFAULTS.seed,
    cost_model: str = WRAPPED_STEP_DEFAULTS.cost_model,
    cache_dir: str | None = WRAPPED_STEP_DEFAULTS.cache_dir,
    use_cache: bool = WRAPPED_STEP_DEFAULTS.use_cache,
    check_speed: bool = WRAPPED_STEP_DEFAULTS.check_speed,
    candidates: int = WRAPPED_STEP_DEFAULTS.candidates,
    measure_budget_s: float = WRAPPED_STEP_DEFAULTS.measure_budget_s,
    **tf_function_kwargs: Any,
) -> Any:
    """Like `tf.function(fn, jit_compile=True, **tf_function_kwargs)`, for a
    training step, with disco-xla's plan for `cluster` applied: a profile name
    or YAML path, or "auto" (the default), the shipped profile TensorFlow's
    devices call for (`tf_devices`; `profile()` says which). `fn` may already
    be a `tf.function` (it must have `jit_compile=True`), in which case no
    tf.function keyword arguments are taken. With `check_speed` the original is
    kept where it runs faster (timed on the first call). Usable as
    `@disco_xla.tf_function` or `@disco_xla.tf_function(cluster=...)`."""
    settings_arguments = settings_given(locals())
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
