"""Optimising a step off its critical path (`OptimizeSettings.background`).

The first call with a new argument signature runs the original (JAX's own first
call); a later one, once the run is long enough (`OptimizeSettings.start_after`;
under `jax.distributed` the second), lowers the step, runs the original and
returns its result (`OptimizedFunction`). In one process, the second call starts
the work whatever the run's length when the plan cache holds a measured choice
for the traced step (`jax_trial.recorded_choice`). A background thread then does
the slow part: it captures the module, agrees on it with the other ranks, finds
the plan (or reads it from the plan cache) and compiles every candidate program
and the reference. Until it is done the original runs.

Once every rank's thread is done (checked on every call in one process, and on
every `READY_CHECK_EVERY`-th call under `jax.distributed`, so that all ranks
decide on the same call), one call is the trial: the candidates run on copies
of its arguments, the original on the arguments themselves, and the programs
every rank finds equal are kept. With the speed check, the next calls run the
original and those programs in rotation (`TIMING_ROUNDS` rounds after one
round of warm-up), each call timed as the user makes it, and then every rank
switches to the fastest on the same call. A candidate that won the rotation is
first confirmed in blocks of consecutive calls (the original, the winner, the
original: `CONFIRM_CALLS`), as the loop will run it; it runs only if it is faster
there too. A choice the plan cache recorded is not timed again: it runs from the
call after the trial.
"""

from __future__ import annotations

import atexit
import os
import statistics
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

import jax

from disco_xla.capture import lowered_module
from disco_xla.driver.planning import has_cross_device_all_reduces, prepared
from disco_xla.driver.signature_record import RecordState, fallback_record
from disco_xla.driver.trial import TIMING_ROUNDS, reuses_original
from disco_xla.errors import one_line
from disco_xla.frontends.jax_trial import (
    CallArguments,
    JaxSignatureRecord,
    JaxTrial,
    agree_on_module,
    donation_note,
    remember_traced_step,
    shared_choice,
    waiting_s,
)
from disco_xla.runtime.agreement import gather, process_count
from disco_xla.runtime.jax_program import kept_arguments

if TYPE_CHECKING:
    from disco_xla.frontends.jax_api import OptimizedFunction

READY_CHECK_EVERY = 8  # calls between the ranks' checks that all background work is done
# The rotation's winner is confirmed in blocks of consecutive calls, as the loop
# will run it: the original, the winner, the original, each this many calls (the
# number that fills CONFIRM_BLOCK_S of the original's calls, within these bounds).
CONFIRM_CALLS = (8, 64)
CONFIRM_BLOCK_S = 0.25
EXIT_WAIT_S = 60.0  # at exit, how long to let a background compile finish
_running: weakref.WeakSet = weakref.WeakSet()


class BackgroundTrial:
    """What one signature runs while disco-xla optimises it: the original, then
    each program in turn while they are timed; `final` is the signature's
    record once every rank has chosen. Has `status`, `plan` and `candidates`
    as a `SignatureRecord` does."""

    def __init__(self, function: OptimizedFunction, lowered, step: int, first: CallArguments):
        self.function, self.lowered, self.step = function, lowered, step
        self.status = "original: optimising in the background"
        self.state = RecordState.PENDING
        self.plan: Any = None
        self.candidates: dict[str, dict] = {}
        self.final: JaxSignatureRecord | None = None
        self._first = first  # its `donated` says what the step consumes
        self._calls = 0
        self._trial: JaxTrial | None = None
        self._failure = ""
        self._data_parallel = True
        self._schedule: list[str] = []  # the programs the next calls run, timed
        self._untimed = 0  # how many of them warm up
        self._equal: list[str] = []
        self._times: dict[str, list[float]] = {}
        self._confirming: str | None = None  # the rotation's winner, timed in blocks
        self._previous: str | None = None  # the program the last timed call ran
        self._rotation_s: dict[str, float] = {}  # the rotation's times, kept for the report
        self._thread = threading.Thread(target=self._prepare, name="disco-xla", daemon=True)
        self._stop = threading.Event()

    def start(self) -> None:
        _running.add(self)
        self._thread.start()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait for the background work; True when it is done."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- the background thread ------------------------------------------------

    def _prepare(self) -> None:
        _yield_to_the_loop(True)
        try:
            # The call that started the work runs first (JAX dispatches it
            # before it is done): a compile beside it would slow it down.
            jax.block_until_ready(self._first.result)
        except Exception:  # noqa: BLE001 - its arrays may be gone already (donated)
            pass
        try:
            self._capture_and_build()
        except Exception as error:  # noqa: BLE001 - reported on the trial's call
            self._failure = one_line(error)
        finally:
            _yield_to_the_loop(False)

    def _capture_and_build(self) -> None:
        function, lowered = self.function, self.lowered
        try:
            module = lowered_module(lowered, f"<jax:{function.__name__}>")
            if not has_cross_device_all_reduces(module):
                self._data_parallel = False  # `final` says so once every rank knows
                return
            module = prepared(module)
        except Exception as error:  # noqa: BLE001
            raise RuntimeError(f"could not capture the step: {one_line(error)}") from None
        settings = function._planning_settings()  # raises where no profile fits
        wait_s = waiting_s(settings)
        agree_on_module(function.__name__, module, self.step, wait_s)
        choice = shared_choice(module, settings, self.step, wait_s)
        remember_traced_step(lowered, settings, choice)
        record, problem, executable = JaxSignatureRecord("original"), "", None
        record.plan = choice.plan
        try:
            # A recorded original builds and compiles nothing.
            if not reuses_original(choice.candidates, settings):
                executable = lowered.compile()
                record.kept = kept_arguments(lowered)
                record.out_tree = lowered.out_tree
        except Exception as error:  # noqa: BLE001 - this rank goes on in step with the others
            problem = one_line(error)
        trial = JaxTrial(function, module, choice, lowered, executable, record, self.step, problem)
        trial.stopping = self._stop.is_set  # at exit: no more compiles
        if not trial.reuses_original:
            trial.build_everything()
        self._trial = trial

    # -- the training loop's calls ------------------------------------------------

    def on_call(self, call: CallArguments) -> Any:
        """Run one call of the signature; may set `final`. A failure on our side
        (a rank that does not answer, say) runs the original from then on."""
        self._calls += 1
        try:
            return self._dispatch(call)
        except Exception as error:  # noqa: BLE001 - never break training
            self._schedule = []
            return self._give_up(call, one_line(error), call.result)

    def _dispatch(self, call: CallArguments) -> Any:
        if self._schedule:
            return self._timed_call(call)
        ready = self._all_ready()
        if ready is None:
            return call.original(keep_copies=False)
        if not ready:  # a rank's background work failed: all run the original
            return self._give_up(call, self._failure or "another rank could not optimise")
        if not self._data_parallel:
            self.final = JaxSignatureRecord("not data-parallel", RecordState.NOT_DATA_PARALLEL)
            return call.original(keep_copies=False)
        if self._trial.reuses_original:  # the plan cache says the original is faster here
            record = self._trial.record
            faster = self._trial.cached_original_status() + donation_note(self._first)
            record.set(RecordState.ORIGINAL_FASTER, faster)
            record.candidates = self._trial.report("original")
            self.final = record
            return call.original(keep_copies=False)
        return self._trial_call(call)

    def _all_ready(self) -> bool | None:
        """None while some rank is still working; else whether every rank's
        work succeeded. Ranks compare on the same calls only."""
        done = not self._thread.is_alive()
        if process_count() == 1:
            return None if not done else not self._failure
        if self._calls % READY_CHECK_EVERY:
            return None
        state = "0" if not done else ("2" if self._failure else "1")
        answers = gather(f"step{self.step}/ready/{self._calls}", state, 600.0)
        if "0" in answers:
            return None
        return "2" not in answers

    def _give_up(self, call: CallArguments, why: str, result: Any = None) -> Any:
        self.final = fallback_record(why + donation_note(self._first), JaxSignatureRecord)
        self.final.candidates = self._trial.report("original") if self._trial else {}
        self.function._warn("jit", self.final.status, stacklevel=5, once=True)
        if result is None and call.result is None:
            return call.original(keep_copies=False)
        return result if result is not None else call.result

    def _trial_call(self, call: CallArguments) -> Any:
        """The call on which the built programs are judged against the original."""
        trial = self._trial
        trial.call = call
        try:
            equal = trial.judge_built()
        except Exception as error:  # noqa: BLE001 - never break training
            return self._give_up(call, one_line(error))
        finally:
            call.release()
        result = trial.original_result
        if not equal:
            return self._give_up(call, trial.why(), result)
        if not self.function._settings.check_speed or trial.from_cache:
            self._finish(equal[0])
            return result
        labels = ["original", *equal]
        # Each round runs every program once, the order rotating a place a round;
        # the first round warms up, untimed.
        self._schedule = [
            labels[(round_index + i) % len(labels)]
            for round_index in range(TIMING_ROUNDS + 1)
            for i in range(len(labels))
        ]
        self._untimed = len(labels)
        self._equal = equal
        self.status = f"original: timing {len(equal)} candidates on the training steps"
        return result

    def _timed_call(self, call: CallArguments) -> Any:
        """One call of the rotation: the scheduled program, timed."""
        trial, label = self._trial, self._schedule[0]
        started = time.perf_counter()
        try:
            if label == "original":
                result = jax.block_until_ready(call.original(keep_copies=False))
            else:
                record = trial.record
                outputs = trial.programs[label]([call.leaves[i] for i in record.kept])
                for i in trial.left_to_delete(label):
                    call.leaves[i].delete()
                result = jax.block_until_ready(
                    jax.tree_util.tree_unflatten(record.out_tree, outputs)
                )
        except Exception as error:  # noqa: BLE001
            self._schedule = []
            return self._give_up(call, f"{label} failed while timed: {one_line(error)}")
        elapsed = time.perf_counter() - started
        call.result = result
        self._schedule.pop(0)
        # In the blocks, the first call after a switch between programs is not timed.
        switched, self._previous = self._confirming and label != self._previous, label
        if self._untimed:
            self._untimed -= 1
        elif not switched:
            self._times.setdefault(label, []).append(elapsed)
        if not self._schedule:
            self._decide()
        return result

    def _decide(self) -> None:
        """Every rank's median times averaged, and the fastest chosen; a
        candidate that won the rotation is confirmed in blocks first
        (`_confirm`)."""
        medians = {label: statistics.median(times) for label, times in self._times.items()}
        trial = self._trial
        if self._confirming is None:
            chosen = trial.decide(medians, self._equal)
            if chosen != "original":
                self._confirm(chosen)
                return
        else:
            chosen = trial.decide(medians, [self._confirming], "confirmation")
            if chosen != "original":
                # The blocks' times stand for the two programs; the rotation's for the rest.
                trial.measured_s = {**self._rotation_s, **trial.measured_s}
        self._finish(chosen)

    def _confirm(self, chosen: str) -> None:
        """Time the rotation's winner against the original in blocks of
        consecutive calls (original, winner, original): a program alternated
        with others each call can time faster than it then runs call after call
        (seen on `jax.pmap` steps of 1.5 ms here). The number of calls is the
        same on every rank (from the ranks' averaged times)."""
        self._rotation_s = dict(self._trial.measured_s)
        low, high = CONFIRM_CALLS
        original_s = max(self._rotation_s["original"], 1e-9)
        calls = min(high, max(low, int(CONFIRM_BLOCK_S / original_s)))
        # The first call of each block is not timed (the switch between programs).
        self._schedule = ["original"] * calls + [chosen] * calls + ["original"] * calls
        self._confirming, self._previous = chosen, None
        self._times = {}
        self.status = f"original: confirming {chosen} against the original, call after call"

    def _finish(self, chosen: str) -> None:
        """Every rank runs `chosen` from the next call (the plan cache keeps a
        measured choice)."""
        record = self._trial.record
        self._trial.finish(record, chosen)
        record.status += donation_note(self._first)
        self.final = record
        if record.state is RecordState.FALLBACK:
            self.function._warn("jit", record.status, stacklevel=5, once=True)


# While background work runs, the training loop's thread must not wait long for
# the interpreter lock (Python hands it over every `sys.getswitchinterval()`,
# 5 ms by default, when two threads want it: a loop of millisecond steps then
# slows by half), nor for the CPUs.
_BUSY_SWITCH_INTERVAL_S = 0.0002
_busy = {"threads": 0, "interval_s": 0.0}
_busy_lock = threading.Lock()


def _yield_to_the_loop(starting: bool) -> None:
    """Called by each background thread as it starts and ends: while any runs,
    the interpreter hands its lock over every _BUSY_SWITCH_INTERVAL_S, and the
    thread itself runs at the lowest CPU priority (Linux schedules threads
    apart; their compiler threads inherit it)."""
    if starting:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):  # not Linux: the priority stays
            pass
    with _busy_lock:
        if starting:
            if _busy["threads"] == 0:
                _busy["interval_s"] = sys.getswitchinterval()
                sys.setswitchinterval(_BUSY_SWITCH_INTERVAL_S)
            _busy["threads"] += 1
        else:
            _busy["threads"] -= 1
            if _busy["threads"] == 0:
                sys.setswitchinterval(_busy["interval_s"])


def stop_all() -> None:
    """At exit: tell background work to stop after its current compile, and
    wait up to EXIT_WAIT_S for it (a compile cut off by the interpreter's exit
    could crash it)."""
    deadline = time.monotonic() + EXIT_WAIT_S
    for background in list(_running):
        background._stop.set()
    for background in list(_running):
        background.wait(max(0.0, deadline - time.monotonic()))


atexit.register(stop_all)
