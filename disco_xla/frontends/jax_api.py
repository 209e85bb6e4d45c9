"""`disco_xla.jit`: `jax.jit` / `jax.pmap` for data-parallel training steps, running
the rewritten module that disco-xla's plan makes.

A step has one record per argument signature (tree structure, shapes, dtypes,
layouts over devices and static arguments). On the first call with a signature
the step is lowered. If its module reduces gradients across devices, a plan and
its candidates (the search's next best plans, the best baseline) are read from
the plan cache or searched, the module is rewritten for each and compiled, and
each rewritten program runs once beside the original, on copies of the same
arguments (`jax_trial`). Of those whose outputs agree (the rule of
`runtime.output_comparison.compare_outputs`), the fastest, timed beside the original, runs
in later calls, unless the original is as fast; otherwise, or if anything at
all fails on our side, the original runs, with one `DiscoFallbackWarning` that
says why. By default that work happens in the background while the original
runs (`jax_background`); with `background=False`, in the first call. The first
call always returns the original's result.

Under `jax.distributed` every rank captures the module, the ranks compare its
fingerprint (where they differ, every rank runs the original), rank 0 finds the
plan and shares it, and the ranks agree on which programs each could build, on
every verdict, and on the times (averaged over the ranks), so all of them run
the same program.

The cluster profile defaults to `cluster="auto"`: on the first call the step's
devices are read (`jax_devices`: platform, device kind, devices per process,
processes) and the shipped profile they call for is used
(`simulator.profile_choice`); `profile()` names it and says why. Where none
fits (an unknown GPU), a data-parallel signature runs the original, and its
status and one warning say how to write a profile.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from typing import Any

import jax
from jax._src import api, pmap  # JAX's own jit and pmap (the env hook replaces jax.jit)

from disco_xla.capture import lowered_module
from disco_xla.driver.planning import has_cross_device_all_reduces, prepared
from disco_xla.driver.signature_record import RecordState, fallback_record
from disco_xla.driver.trial import cached_original_status, reuses_original
from disco_xla.errors import one_line
from disco_xla.frontends.jax_background import BackgroundTrial
from disco_xla.frontends.jax_signature import MAX_QUICK_KEYS, Signature, leaf_key, quick_leaf_key
from disco_xla.frontends.jax_trial import (
    CallArguments,
    JaxSignatureRecord,
    JaxTrial,
    agree_on_module,
    deleted,
    donation_note,
    recorded_choice,
    remember_traced_step,
    shared_choice,
    waiting_s,
)
from disco_xla.frontends.settled_dispatch import REFUSED, SettledDispatch
from disco_xla.frontends.wrapped_step import DiscoFallbackWarning, WrappedStep
from disco_xla.runtime.agreement import process_count
from disco_xla.runtime.jax_program import kept_arguments
from disco_xla.settings import (
    AUTO_CLUSTER,
    WRAPPED_STEP_DEFAULTS,
    OptimizeSettings,
    settings_given,
)
from disco_xla.simulator.profile_choice import MIXED_KINDS, DeviceDescription

__all__ = ["DiscoFallbackWarning", "OptimizedFunction", "jit", "wrap"]

_prepared_steps = itertools.count()  # the same on every rank of an SPMD script
CALLED_ONCE = "original: called once so far"


class OptimizedFunction(SettledDispatch, WrappedStep):
    """A jitted or pmapped step that runs disco-xla's rewritten program when it
    can and the original otherwise. Call it like the original; `lower` and other
    attributes are the original's. `status()` says what each signature runs."""

    def __init__(self, lowerable: Any, settings: OptimizeSettings, static: tuple = ((), ())):
        super().__init__(lowerable, settings)
        self._static_positions, self._static_names = static
        # Each call's quick key (shardings as they are) -> its `Signature`
        # (shardings as layouts, `leaf_key`), one object per signature: the
        # quick key costs half as much, and the records' table then finds its
        # key by identity (comparing a tree structure calls Python code, e.g.
        # Flax NNX's graph definitions', once per call is enough).
        self._signature_of: dict[tuple, Signature] = {}
        self._signatures: dict[Signature, Signature] = {}
        self._init_settled_dispatch(lowerable)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if time.perf_counter() < self._unwatched_until:
            if self._behind_jax is None:
                return self._call_unwatched(args, kwargs)
            result = self._call_behind_jax(args, kwargs)
            if result is not REFUSED:
                return result
        result = self._call_with_records(args, kwargs)
        self._unwatched_until = self._settled_until()
        return result

    def _dynamic(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A call's arguments less its static ones."""
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in self._static_positions)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_names}
        return dynamic_args, dynamic_kwargs

    def _static_values(self, args: tuple, kwargs: dict) -> tuple:
        return tuple(args[i] for i in self._static_positions if i < len(args)) + tuple(
            sorted((k, v) for k, v in kwargs.items() if k in self._static_names)
        )

    def _call_with_records(self, args: tuple, kwargs: dict) -> Any:
        try:
            leaves, signature = self._signature(args, kwargs)
        except Exception:  # noqa: BLE001 - something we cannot key on: leave it to JAX
            return self._original(*args, **kwargs)
        if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self._original(*args, **kwargs)  # inside an outer transformation
        compiled = self._by_signature.get(signature)
        if compiled is None and self._settings.cluster == AUTO_CLUSTER:
            self._resolve_cluster(jax_devices)  # once: the devices of the first call
        if compiled is None and self._settings.background:
            call = CallArguments(self, args, kwargs, leaves, signature.tree)
            compiled, result = self._first_in_background(call)
            self._by_signature[signature] = compiled
            return result
        if compiled is None or compiled.state is RecordState.CALLED_ONCE:
            if compiled is not None and not self._run_long_enough(compiled):
                return self._original(*args, **kwargs)
            call = CallArguments(self, args, kwargs, leaves, signature.tree)
            if self._settings.background:
                compiled, result = self._start_in_background(call)
            else:
                compiled, result = self._first_call(call)
            self._by_signature[signature] = compiled
            return result
        if isinstance(compiled, BackgroundTrial):
            result = compiled.on_call(CallArguments(self, args, kwargs, leaves, signature.tree))
            if compiled.final is not None:
                self._by_signature[signature] = compiled.final
            return result
        if compiled.run is None:
            return self._original(*args, **kwargs)
        try:
            outputs = compiled.run([leaves[i] for i in compiled.kept])
            for i in compiled.delete_after:
                leaves[i].delete()
        except Exception as error:  # noqa: BLE001 - never break training
            compiled.fall_back(f"the rewritten program failed: {one_line(error)}")
            _warn(self, compiled.status)
            if any(deleted(leaf) for leaf in leaves):
                raise  # it took the donated arguments: nothing is left to run on
            return self._original(*args, **kwargs)
        return jax.tree_util.tree_unflatten(compiled.out_tree, outputs)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the background work (capture, search, compiles) of every
        signature seen so far is done; True if it is. The programs are judged,
        timed and switched to on the calls after it (`BackgroundTrial`)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for record in list(self._by_signature.values()):
            if isinstance(record, BackgroundTrial):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not record.wait(left):
                    return False
        return True

    def _first_in_background(self, call: CallArguments) -> tuple[Any, Any]:
        """The first call of a signature with `background` on runs the original.
        A signature called once only (an initial layout, an evaluation) is not
        worth optimising, so the work starts on a later call, once the run is
        long enough (`_run_long_enough`); or on the second call, in a single
        process, when the plan cache holds a measured choice for this traced
        step (a rerun: the work is then one compile and one check, with no
        search and no timing). Under `jax.distributed` it waits for the second
        call: every rank must start on the same call, and each may have its own
        plan cache."""
        started = time.perf_counter()
        result = call.original(keep_copies=False)
        return self._record_first_call(call, time.perf_counter() - started), result

    def _record_first_call(self, call: CallArguments, first_call_s: float) -> JaxSignatureRecord:
        """The record of a signature whose first call, the original's, has
        just run in `first_call_s` (`_first_in_background`). Where the plan
        cache records, for this traced step, that the original ran fastest here,
        that is final at once: nothing is captured, built or timed."""
        recorded = None
        if process_count() == 1:
            try:  # after the original: the step is traced by then
                recorded = recorded_choice(self, call)
            except Exception:  # noqa: BLE001 - then it is found on the second call
                recorded = None
        if recorded is not None and reuses_original(recorded, self._settings):
            status = cached_original_status(recorded.measured_s) + donation_note(call)
            record = JaxSignatureRecord(status, RecordState.ORIGINAL_FASTER)
            record.plan = recorded.plans.get("plan")
            record.candidates = {"original": {"chosen": True, "from_cache": True}}
            return record
        record = JaxSignatureRecord(CALLED_ONCE, RecordState.CALLED_ONCE)
        factor = self._settings.start_after
        if recorded is None:  # else the second call starts the work
            record.first_call = (first_call_s, time.perf_counter())
            if factor > 0 and process_count() == 1:
                record.status = (
                    f"original: not optimised yet (the work starts once the step has run "
                    f"{factor:g}x its first call's {first_call_s:.2f} s)"
                )
        return record

    def _run_long_enough(self, record: JaxSignatureRecord) -> bool:
        """Whether a signature called once so far has run long enough for the
        background work to start: `start_after` times its first call's time
        since that call ended (the work's compiles cost about as much as JAX's
        own first call each, so a shorter run never earns them back). Under
        `jax.distributed`, with `start_after` 0, or where the plan cache holds
        the choice (no `first_call` kept), on the second call."""
        factor = self._settings.start_after
        if factor <= 0 or process_count() > 1 or record.first_call is None:
            return True
        first_call_s, ended = record.first_call
        return time.perf_counter() - ended >= factor * first_call_s

    def _start_in_background(self, call: CallArguments) -> tuple[Any, Any]:
        """Lower the step, run the original, and leave the rest to a
        `BackgroundTrial`."""
        try:
            lowered = self._original.lower(*call.args, **call.kwargs)
        except Exception as error:  # noqa: BLE001
            record = fallback_record(
                f"could not capture the step: {one_line(error)}", JaxSignatureRecord
            )
            _warn(self, record.status)
            return record, call.original(keep_copies=False)
        result = call.original(keep_copies=False)
        return self._in_background(call, lowered), result

    def _in_background(self, call: CallArguments, lowered) -> BackgroundTrial:
        """The background work started for the signature of `call`, whose
        original has run."""
        background = BackgroundTrial(self, lowered, next(_prepared_steps), call)
        background.start()
        return background

    def _with_leaves(self, args: tuple, kwargs: dict, tree, leaves: list) -> tuple[tuple, dict]:
        """`args` and `kwargs` with their array leaves replaced by `leaves`
        (static arguments kept as they are)."""
        dynamic_args, dynamic_kwargs = jax.tree_util.tree_unflatten(tree, leaves)
        dynamic = iter(dynamic_args)
        rebuilt = tuple(
            args[i] if i in self._static_positions else next(dynamic) for i in range(len(args))
        )
        static_kwargs = {k: v for k, v in kwargs.items() if k in self._static_names}
        return rebuilt, {**dynamic_kwargs, **static_kwargs}

    def _signature(self, args: tuple, kwargs: dict):
        dynamic_args, dynamic_kwargs = self._dynamic(args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((dynamic_args, dynamic_kwargs))
        static = self._static_values(args, kwargs)
        quick = (tree, tuple(map(quick_leaf_key, leaves)), static)
        signature = self._signature_of.get(quick)
        if signature is None:
            found = Signature((tree, tuple(map(leaf_key, leaves)), static))
            signature = self._signatures.setdefault(found, found)
            if len(self._signature_of) >= MAX_QUICK_KEYS:
                self._signature_of.clear()
            self._signature_of[quick] = signature
        return leaves, signature

    def _first_call(self, call: CallArguments) -> tuple[JaxSignatureRecord, Any]:
        """What a new signature runs, and the result of its first call. Any
        failure before the original has run returns the original's result with
        one warning; the trial itself (`_optimize`) never reads an argument the
        original has consumed."""
        try:
            lowered = self._original.lower(*call.args, **call.kwargs)
            # A jit with sharded arguments: after SPMD partitioning, where its
            # gradient all-reduces are.
            module = lowered_module(lowered, f"<jax:{self.__name__}>")
            data_parallel = has_cross_device_all_reduces(module)
            if data_parallel:
                module = prepared(module)
        except Exception as error:  # noqa: BLE001
            why = f"could not capture the step: {one_line(error)}"
            compiled = fallback_record(why, JaxSignatureRecord)
            _warn(self, compiled.status)
            return compiled, call.original()
        if not data_parallel:
            return JaxSignatureRecord(
                "not data-parallel", RecordState.NOT_DATA_PARALLEL
            ), call.original()
        try:
            compiled, result = self._optimize(module, lowered, call)
        except Exception as error:  # noqa: BLE001 - never break training
            compiled = fallback_record(one_line(error), JaxSignatureRecord)
            result = call.result
            _warn(self, compiled.status)
            if result is None:  # the original has not run yet
                result = call.original()
        finally:
            call.release()
        compiled.status += donation_note(call)
        return compiled, result

    def _optimize(self, module, lowered, call: CallArguments) -> tuple[JaxSignatureRecord, Any]:
        """Find the plan and its candidates, then run the first call's trial
        (`JaxTrial`): every rank builds the candidate programs, keeps those all
        ranks agree compute the same as the original, and of those runs the
        fastest, timed beside the original; else the original."""
        step, settings = next(_prepared_steps), self._planning_settings()
        wait_s = waiting_s(settings)
        agree_on_module(self.__name__, module, step, wait_s)
        # rank 0's plan: on failure, every rank raises here
        choice = shared_choice(module, settings, step, wait_s)
        remember_traced_step(lowered, settings, choice)
        record, problem, executable = JaxSignatureRecord("original"), "", None
        try:  # this rank's own work: it goes on in step with the others if it fails
            executable = lowered.compile()
            record.kept = kept_arguments(lowered)
            record.out_tree = lowered.out_tree
            if len(call.leaves) != len(jax.tree_util.tree_leaves(lowered.in_avals)):
                raise RuntimeError("the arguments do not match the lowered step")
        except Exception as error:  # noqa: BLE001 - never break training
            executable, problem = None, one_line(error)
        trial = JaxTrial(self, module, choice, lowered, executable, record, step, problem)
        trial.call = call
        result = trial.run_first_call(record)
        if record.state is RecordState.FALLBACK:
            _warn(self, record.status)
        return record, result


def jax_devices() -> DeviceDescription:
    """What `cluster="auto"` reads of JAX's devices in this process: the
    platform and kind of its local devices, how many, and the processes."""
    local = jax.local_devices()
    kinds = dict.fromkeys(device.device_kind for device in local)
    return DeviceDescription(
        platform=local[0].platform,
        device_kind=MIXED_KINDS.join(kinds),
        local_device_count=len(local),
        process_count=jax.process_count(),
    )


def _warn(function: OptimizedFunction, why: str) -> None:
    """One warning per function and reason (a new signature with the same problem
    does not warn again)."""
    function._warn("jit", why, stacklevel=4, once=True)


def jit(
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
    background: bool = WRAPPED_STEP_DEFAULTS.background,
    start_after: float = WRAPPED_STEP_DEFAULTS.start_after,
    **jit_kwargs: Any,
) -> Any:
    """Like `jax.jit(fn, **jit_kwargs)`, for a data-parallel training step, with
    disco-xla's plan for `cluster` applied: a profile name or YAML path, or
    "auto" (the default), the shipped profile this process's devices call for,
    read on the first call (`profile()` says which and why). `fn` may already be transformed
    (`jax.pmap(step, axis_name=...)`, `jax.jit(shard_map(...))`), in which case no
    jit keyword arguments are taken. Usable as `@disco_xla.jit` or
    `@disco_xla.jit(cluster=...)`.

    With `check_speed`, each signature's search's `candidates` best plans, the
    plan's buckets alone and the best baseline are timed beside the original
    (in rotating rounds), and the fastest that computes the same as the
    original runs, or the original when none is faster. With `background` (the
    default) the search and compiles run in a thread while the original runs,
    and the timing rounds are the training loop's own calls; otherwise all of
    it happens in the first call, the timing within `measure_budget_s`.
    `measurements()` reports each candidate's simulated and measured time; the
    plan cache keeps the choice for the next run."""
    settings_arguments = settings_given(locals())
    if fn is None:
        return functools.partial(jit, **settings_arguments, **jit_kwargs)
    settings = OptimizeSettings(**settings_arguments)
    return wrap(fn, settings, "jit", jit_kwargs)


def wrap(
    fn: Callable, settings: OptimizeSettings, transform: str, kwargs: dict
) -> OptimizedFunction:
    """`fn` under `transform` ('jit' or 'pmap', JAX's own, with `kwargs`) unless it
    is transformed already, as an OptimizedFunction."""
    if hasattr(fn, "lower"):
        if kwargs:
            raise TypeError("a function that is already transformed takes no jit arguments")
        return OptimizedFunction(fn, settings)
    if transform == "pmap":
        lowerable = pmap.pmap(fn, **kwargs)
        static = (_positions(kwargs.get("static_broadcasted_argnums", ())), ())
    else:
        lowerable = api.jit(fn, **kwargs)
        static = (
            _positions(kwargs.get("static_argnums", ())),
            _names(kwargs.get("static_argnames", ())),
        )
    return OptimizedFunction(lowerable, settings, static)


def _positions(value) -> tuple[int, ...]:
    return (value,) if isinstance(value, int) else tuple(value or ())


def _names(value) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value or ())
