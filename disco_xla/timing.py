"""Wall-clock timing of repeated runs, shared by calibration, the benchmarks and
the first-call speed check of `disco_xla.jit` / `disco_xla.tf_function`; the
JAX profiler's events of repeated runs, and the time each thunk in them took;
and holding the CPUs awake."""

from __future__ import annotations

import contextlib
import glob
import os
import statistics
import struct
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator

import jax
from jax._src.lib import _profile_data


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median wall time of `repeats` calls of `fn`, after `warmup` untimed calls
    (which compile, and let collectives set up their connections)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_median_seconds(
    original: Callable[[], object], rewritten: Callable[[], object], rounds: int
) -> tuple[float, float]:
    """Median wall time of each of two programs over `rounds` paired rounds, in
    which they run back to back, the rewritten one first in even rounds and the
    original first in odd ones (a noisy machine then slows both alike). Each
    callable must return only once its results are ready. Returns
    (original_s, rewritten_s)."""
    medians = rotating_median_seconds({"rewritten": rewritten, "original": original}, rounds)
    return medians["original"], medians["rewritten"]


def rotating_median_seconds(
    calls: dict[str, Callable[..., object]],
    rounds: int,
    prepare: Callable[[], object] | None = None,
) -> dict[str, float]:
    """Median wall time of each program over `rounds` rounds. Every round runs
    each program once, back to back, and the order rotates by one place a round
    (round r starts with the r-th program), so that each program runs in every
    position and a noisy machine slows all of them alike. Each callable must
    return only once its results are ready. With `prepare`, each call is given
    what `prepare()` returns, made untimed just before it (fresh copies of
    arguments that a call consumes, for example)."""
    labels = list(calls)
    seconds: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            given = () if prepare is None else (prepare(),)
            started = time.perf_counter()
            calls[label](*given)
            seconds[label].append(time.perf_counter() - started)
    return {label: statistics.median(times) for label, times in seconds.items()}


def traced_events(
    run: Callable[[], object], runs: int, plane_prefixes: tuple[str, ...]
) -> list[tuple[str, dict, float]]:
    """(event name, stats, seconds) of every event on the JAX profiler's planes
    whose name starts with one of `plane_prefixes`, over `runs` calls of `run`
    (each must block until its results are ready). The Python tracer is off: on
    a few cores its own work slows the kernels it is meant to time. On the CPU the
    plane `/host:CPU` has one event per thunk, with the stats `hlo_op`, `run_id`
    and `device_ordinal`. Each event's stats also hold `start_ns`, its start in
    nanoseconds from the trace's start, and `line` the name of its line."""
    found: list[tuple[str, dict, float]] = []
    with tempfile.TemporaryDirectory() as directory:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0
        jax.profiler.start_trace(directory, profiler_options=options)
        try:
            for _ in range(runs):
                run()
        finally:
            jax.profiler.stop_trace()
        traces = glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True)
        if not traces:
            raise RuntimeError("the JAX profiler wrote no trace")
        for plane in _profile_data.ProfileData.from_file(traces[0]).planes:
            if plane.name.startswith(plane_prefixes):
                for line in plane.lines:
                    for event in line.events:
                        stats = {
                            **dict(event.stats),
                            "start_ns": event.start_ns,
                            "line": line.name,
                        }
                        found.append((event.name, stats, event.duration_ns * 1e-9))
    return found


# XLA:CPU's thunk executor runs some thunks asynchronously: seen on jaxlib 0.10.2
# for the convolutions it hands to Eigen (a grouped convolution's gradient, the
# filter gradient of a depthwise one). The thunk's own event then ends once its
# work is handed to the thread pool, which can be a thousandth of its time, and a
# second event named COMPLETION_PREFIX + its name marks when the work completed.
# The two carry one flow id: the stat `_p` of the thunk's event, `_c` of the other.
COMPLETION_PREFIX = "end: "


def thunk_seconds(events: list[tuple[str, dict, float]]) -> list[tuple[str, dict, float]]:
    """`events` (from `traced_events`) with each asynchronous thunk's time
    running until its work completed. Each moment of a run on a device counts
    once: to the thunks whose own event holds it, as their events' durations
    always did; a moment that no thunk's own event holds, but that lies between
    an asynchronous thunk's event end and its completion (its tail), is shared
    evenly among the tails in flight then. A thunk whose own event encloses
    other thunks' (a while or call thunk running its body) is left out of that
    count. Other events are returned as they are.

    So a synchronous thunk keeps its event's duration, as measured beside
    whatever ran with it, and an asynchronous one gets its launch plus the time
    its device spent on nothing but completing it (two convolutions completing
    together each get half). On a keras ResNeXt-26 step (tiny, 2 devices) the
    thunks' own events summed to a third of the step's wall time, since its
    grouped convolutions' events ended at launch
    (`benchmarks/traced_kernel_share.py`, BENCHMARKS.md)."""
    completions: dict[object, list[float]] = {}
    for name, stats, seconds in events:
        if name.startswith(COMPLETION_PREFIX) and "_c" in stats:
            end_s = stats["start_ns"] * 1e-9 + seconds
            completions.setdefault(stats["_c"], []).append(end_s)
    for ends in completions.values():
        ends.sort()
    by_device: dict[tuple, list[tuple[int, float, float, float]]] = {}
    for index, (_, stats, seconds) in enumerate(events):
        if "hlo_op" not in stats or "start_ns" not in stats:
            continue
        start_s = stats["start_ns"] * 1e-9
        end_s = start_s + seconds
        ends = completions.get(stats.get("_p"), [])
        after = bisect_left(ends, start_s)
        completed_s = max(ends[after], end_s) if after < len(ends) else end_s
        device = (stats.get("run_id"), stats.get("device_ordinal"))
        by_device.setdefault(device, []).append((index, start_s, end_s, completed_s))
    tails: dict[int, float] = {}
    for thunks in by_device.values():
        callers = _callers(thunks)
        counted = [t for t in thunks if t[0] not in callers]
        tails.update(
            _shared_evenly(
                [(key, end, completed) for key, _, end, completed in counted if completed > end],
                blocked=[(start, end) for _, start, end, _ in counted],
            )
        )
    return [
        (name, stats, seconds + tails.get(index, 0.0))
        for index, (name, stats, seconds) in enumerate(events)
    ]


def summed_per_run(events: list[tuple[str, dict, float]]) -> float:
    """The median, over runs and devices, of the summed times of the thunks
    (events with the stat `hlo_op`) of one run on one device."""
    sums: dict[tuple, float] = {}
    for _, stats, seconds in events:
        if "hlo_op" in stats:
            key = (stats.get("run_id"), stats.get("device_ordinal"))
            sums[key] = sums.get(key, 0.0) + seconds
    if not sums:
        raise RuntimeError("the profiler trace holds no kernels")
    return statistics.median(sums.values())


def _callers(thunks: list[tuple[int, float, float, float]]) -> set[int]:
    """The keys of the synchronous thunks (key, start, event end, completion)
    whose event encloses another thunk's."""
    ordered = sorted(thunks, key=lambda thunk: (thunk[1], -thunk[3]))
    callers = set()
    for position, (key, _, end, completed) in enumerate(ordered):
        if completed > end:
            continue
        for _, other_start, _, other_completed in ordered[position + 1 :]:
            if other_start >= end:
                break
            if other_completed <= end:
                callers.add(key)
                break
    return callers


def _shared_evenly(
    intervals: list[tuple[int, float, float]], blocked: list[tuple[float, float]] = ()
) -> dict[int, float]:
    """{key: its share} of (key, start, end) intervals when each moment outside
    the `blocked` (start, end) spans is shared evenly among the intervals that
    hold it: an interval's share is the integral over its span of
    1 / (intervals in flight), where no blocked span holds the moment."""
    if not intervals:
        return {}
    changes = sorted(
        [(start, 1, 0) for _, start, _ in intervals]
        + [(end, -1, 0) for _, _, end in intervals]
        + [(start, 0, 1) for start, _ in blocked]
        + [(end, 0, -1) for _, end in blocked]
    )
    times, shared_until = [], []  # the running integral at each change
    in_flight = blocking = 0
    total, previous = 0.0, changes[0][0]
    for moment, step, block_step in changes:
        if in_flight and not blocking:
            total += (moment - previous) / in_flight
        in_flight += step
        blocking += block_step
        previous = moment
        times.append(moment)
        shared_until.append(total)

    def integral(moment: float) -> float:
        return shared_until[bisect_left(times, moment)]

    return {key: integral(end) - integral(start) for key, start, end in intervals}


# Linux's PM QoS interface: while a process holds this file open with a 32-bit 0
# written to it, idle CPUs poll instead of entering an idle state they must be
# woken from.
CPU_LATENCY_DEVICE = "/dev/cpu_dma_latency"


@contextlib.contextmanager
def cpus_kept_awake(device: str = CPU_LATENCY_DEVICE) -> Iterator[bool]:
    """While open, asks Linux to keep this machine's idle CPUs polling rather than
    halting (a CPU wake-up latency of 0 through PM QoS, as tuned's
    latency-performance profile does). Yields whether the request is held: it
    needs write access to `device`, and without it timing goes on as before.

    On a virtual machine, a halted virtual CPU is woken by its host. On the 2-CPU
    machine this project is measured on, that made the collectives of two devices
    in one process wait for each other's thread at random: a tiny gpt2_small
    step's median over a block of runs was 1.4 ms in some blocks and 2.6 ms in
    others. Held, it was 1.1-1.3 ms in every block
    (`benchmarks/step_time_spread.py`)."""
    try:
        descriptor = os.open(device, os.O_WRONLY)
    except OSError:
        yield False
        return
    try:
        try:
            held = os.write(descriptor, struct.pack("i", 0)) == 4
        except OSError:
            held = False
        yield held
    finally:
        os.close(descriptor)
