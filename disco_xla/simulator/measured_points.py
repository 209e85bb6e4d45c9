"""Times read off measured (bytes, seconds) points: a collective's time at
any size from the sizes that were timed (`disco-xla calibrate`'s points, XLA's
measured collective table).

The points are first made non-decreasing in size from above (a time is at most
the time measured for any larger message, which removes one-off stalls), then
interpolated linearly; below the smallest size the time is that size's, above
the largest it grows at the bandwidth of the last two points.
"""

from __future__ import annotations

import bisect
from functools import lru_cache


@lru_cache(maxsize=16)
def _envelope(points: tuple[tuple[float, float], ...]) -> tuple[list[float], list[float]]:
    """Sizes and times, each time lowered to the least time of any larger size."""
    sizes = [size for size, _ in points]
    times = [seconds for _, seconds in points]
    for i in range(len(times) - 2, -1, -1):
        times[i] = min(times[i], times[i + 1])
    return sizes, times


def measured_s(size_bytes: float, points: tuple[tuple[float, float], ...]) -> float:
    """The time of a collective of `size_bytes` read off its measured (bytes,
    seconds) points."""
    sizes, times = _envelope(points)
    if size_bytes <= sizes[0] or len(sizes) == 1:
        return times[0] if size_bytes <= sizes[0] else times[0] * size_bytes / sizes[0]
    if size_bytes >= sizes[-1]:
        slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
        return times[-1] + max(slope, 0.0) * (size_bytes - sizes[-1])
    right = bisect.bisect_left(sizes, size_bytes)
    left = right - 1
    share = (size_bytes - sizes[left]) / (sizes[right] - sizes[left])
    return times[left] + share * (times[right] - times[left])
