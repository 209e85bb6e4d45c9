"""Wall-clock timing of repeated runs, shared by calibration and the benchmarks."""

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
