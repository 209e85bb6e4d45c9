"""Wall-clock timing of repeated runs, shared by calibration, the benchmarks and
the first-call speed check of `disco_xla.jit` / `disco_xla.tf_function`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


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
    seconds: dict[str, list[float]] = {"original": [], "rewritten": []}
    calls = {"original": original, "rewritten": rewritten}
    for round_index in range(rounds):
        order = ("original", "rewritten") if round_index % 2 else ("rewritten", "original")
        for name in order:
            started = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - started)
    return statistics.median(seconds["original"]), statistics.median(seconds["rewritten"])
