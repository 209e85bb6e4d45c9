"""How `disco_xla.jit` calls a step once its signatures are settled, at the cost
of a call of JAX's own step: a rewritten program behind JAX's C++ dispatch
(`_call_behind_jax`), or the original called directly, JAX's count of its
programs showing a new signature (`_call_unwatched`). `_settled_until` says
when each way applies; `OptimizedFunction` takes the records' way otherwise."""

from __future__ import annotations

import time
from typing import Any

import jax

from disco_xla.driver.signature_record import RecordState
from disco_xla.frontends.jax_trial import CallArguments, deleted
from disco_xla.runtime.agreement import process_count

REFUSED = object()  # `_call_behind_jax`: the call is the records' to make
# The states whose signature runs the original for good (`_settled_until`).
_RUNS_THE_ORIGINAL = frozenset(
    {RecordState.ORIGINAL_FASTER, RecordState.FALLBACK, RecordState.NOT_DATA_PARALLEL}
)


class SettledDispatch:
    """The settled ways of calling a step, for `OptimizedFunction` (whose
    records, settings, static arguments and original they read)."""

    def _init_settled_dispatch(self, lowerable: Any) -> None:
        # JAX's count of the programs it holds for the step (a jit's, not a
        # pmap's): while every signature seen runs the original and has nothing
        # left to start, calls go straight to it, and a count that grows shows
        # a new signature (`_call_unwatched`).
        self._programs_held = getattr(lowerable, "_cache_size", None)
        self._unwatched_until = 0.0  # a `time.perf_counter()` reading; 0: no
        # The one signature running our program, behind JAX's dispatch, while
        # calls skip the records (`_settled_until`): its program and static
        # arguments; calls JAX's dispatch refused for it, and taken by it.
        self._behind_jax: tuple[Any, tuple | None] | None = None
        self._refused_calls, self._taken_calls = 0, 0

    def _call_behind_jax(self, args: tuple, kwargs: dict) -> Any:
        """Call the one signature's program through JAX's dispatch (checked
        there, in C++, to be that signature), or `REFUSED`, when the call is of
        another signature, or anything else went wrong before it ran: the
        records then take it. Where they take more than one call in eight,
        this way is given up."""
        program, static = self._behind_jax
        try:
            if static is None:
                result = program(*args, **kwargs)
            else:
                result = self._call_with_static(program, static, args, kwargs)
            self._taken_calls += 1
            return result
        except Exception:  # noqa: BLE001 - the records' way decides, and says why
            self._refused_calls += 1
            if self._refused_too_often():
                self._behind_jax, self._unwatched_until = None, 0.0
            return REFUSED

    def _refused_too_often(self) -> bool:
        """Whether JAX's dispatch refused more than one call in eight (after 64)."""
        return 8 * self._refused_calls > self._taken_calls + 64

    def _call_with_static(self, program, static: tuple, args: tuple, kwargs: dict) -> Any:
        """`program` (compiled for the static arguments `static`) on a call's
        dynamic arguments, where its static ones are those."""
        if self._static_values(args, kwargs) != static:
            raise TypeError("other static arguments")
        dynamic_args, dynamic_kwargs = self._dynamic(args, kwargs)
        return program(*dynamic_args, **dynamic_kwargs)

    def _call_unwatched(self, args: tuple, kwargs: dict) -> Any:
        """Call the original with no signature of our own: JAX's own dispatch,
        in C++, the same cost as the plain step. Where JAX compiled the step
        anew for this call, it was a signature not seen before, which is
        recorded as its first call (`_record_first_call`)."""
        held = self._programs_held()
        started = time.perf_counter()
        result = self._original(*args, **kwargs)
        if self._programs_held() != held:
            first_call_s = time.perf_counter() - started
            try:
                leaves, signature = self._signature(args, kwargs)
            except Exception:  # noqa: BLE001 - something we cannot key on: JAX's alone
                return result
            if signature not in self._by_signature and not any(
                isinstance(leaf, jax.core.Tracer) for leaf in leaves
            ):
                call = CallArguments(self, args, kwargs, leaves, signature.tree)
                call.donated = [deleted(leaf) for leaf in leaves]
                self._by_signature[signature] = self._record_first_call(call, first_call_s)
                self._unwatched_until = self._settled_until()
        return result

    def _settled_until(self) -> float:
        """Until when calls may skip the records, and how. Where one signature
        runs our program and JAX's dispatch can run it (`_call_behind_jax`):
        for good, since a call of any other signature is refused there and
        taken by the records. Where every signature runs the original
        (`_call_unwatched`, for a step whose JAX programs can be counted):
        until the first moment a waiting signature may start its work
        (`_run_long_enough`), and not at all where one starts it on its next
        call. Never (0) while work is under way, where our own dispatch runs a
        program, or without `background` (a new signature's first call is
        then its trial)."""
        self._behind_jax = None
        if not self._settings.background:
            return 0.0
        until, programs, starts_on_a_call = float("inf"), [], False
        for signature, record in self._by_signature.items():
            state = getattr(record, "state", None)
            if state is RecordState.CALLED_ONCE:
                waits = self._settings.start_after > 0 and process_count() == 1
                if record.first_call is None or not waits:
                    starts_on_a_call = True  # its next call starts the work
                else:
                    first_call_s, ended = record.first_call
                    until = min(until, ended + self._settings.start_after * first_call_s)
            elif state is RecordState.OPTIMIZED and record.run is not None:
                if record.behind_jax is None or record.behind_jax_tree != signature.tree:
                    return 0.0
                programs.append((record.behind_jax, signature))
            elif state not in _RUNS_THE_ORIGINAL or getattr(record, "run", None) is not None:
                return 0.0
        if programs:  # every other signature's call is refused there, into the records
            if len(programs) > 1 or self._refused_too_often():
                return 0.0
            program, signature = programs[0]
            static = signature.key[2] if self._static_positions or self._static_names else None
            self._behind_jax = (program, static)
            return float("inf")
        if starts_on_a_call or self._programs_held is None:
            return 0.0
        return until
