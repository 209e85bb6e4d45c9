"""Wall-clock timing of repeated runs, shared by calibration, the benchmarks and
the first-call speed check of `disco_xla.jit` / `disco_xla.tf_function`; the
JAX profiler's events of repeated runs; and holding the CPUs awake."""

from __future__ import annotations

import contextlib
import os
import statistics
import struct
import time
from collections.abc import Callable, Iterator


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
    calls: dict[str, Callable[[], object]], rounds: int
) -> dict[str, float]:
    """Median wall time of each program over `rounds` rounds. Every round runs
    each program once, back to back, and the order rotates by one place a round
    (round r starts with the r-th program), so that each program runs in every
    position and a noisy machine slows all of them alike. Each callable must
    return only once its results are ready."""
    labels = list(calls)
    seconds: dict[str, list[float]] = {label: [] for label in labels}
    for round_index in range(rounds):
        shift = round_index % len(labels)
        for label in labels[shift:] + labels[:shift]:
            started = time.perf_counter()
            calls[label]()
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
    nanoseconds from the trace's start."""
    import glob
    import tempfile

    import jax
    from jax._src.lib import _profile_data

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
                        stats = {**dict(event.stats), "start_ns": event.start_ns}
                        found.append((event.name, stats, event.duration_ns * 1e-9))
    return found


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
