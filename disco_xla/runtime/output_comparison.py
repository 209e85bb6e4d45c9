"""The one equivalence rule between a rewritten step's outputs and the
original's (`compare_outputs`): bit-equal, or every output within 1e-6 of its
own scale plus the step's typical output scale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from disco_xla.errors import RewriteError

# Where XLA changed a reduction order, an output may differ by 1e-6 of its own scale
# plus 1e-6 of the step's typical output scale: outputs that are zero in exact
# arithmetic (an attention key bias's gradient) hold only rounding noise.
RELATIVE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class OutputComparison:
    equal: bool  # bit-equal, or every output within the tolerance
    bit_equal: bool
    max_abs_diff: float
    max_rel_diff: float  # largest |a - b| / max|a| over the outputs
    tolerance_used: float  # largest |a - b| / (1e-6 · (max|a| + typical scale)); equal if <= 1


def differing_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> list[int]:
    """The positions of the outputs that `compare_outputs` would not count as
    equal (each judged against the typical scale of all of `expected`)."""
    typical = _typical_scale(expected)
    found = []
    for index, (a, b) in enumerate(zip(expected, got, strict=True)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape or _difference(a, b, typical)[2] > 1.0:
            found.append(index)
    return found


def compare_outputs(expected: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> OutputComparison:
    """The one equivalence rule: bit-equal, or every output within 1e-6 of its own
    scale plus the typical (median) output scale of `expected`. Scales and
    differences are over finite values; a NaN or an infinity must be where it
    was, and the same (random inputs can make an optimizer's outputs NaN: once
    a NaN made every tolerance NaN, and so passed any difference)."""
    if len(expected) != len(got):
        raise RewriteError(f"the rewritten step has {len(got)} outputs, not {len(expected)}")
    expected = [np.asarray(a) for a in expected]
    got = [np.asarray(b) for b in got]
    typical = _typical_scale(expected)
    bit_equal, max_abs, max_rel, used = True, 0.0, 0.0, 0.0
    for a, b in zip(expected, got, strict=True):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise RewriteError(
                f"an output changed from {a.dtype}{list(a.shape)} to {b.dtype}{list(b.shape)}"
            )
        if np.array_equal(a, b, equal_nan=a.dtype.kind in "fcV"):
            continue
        bit_equal = False
        diff, relative, ratio = _difference(a.astype(np.float64), b.astype(np.float64), typical)
        max_abs, max_rel, used = max(max_abs, diff), max(max_rel, relative), max(used, ratio)
    return OutputComparison(
        equal=bit_equal or used <= 1.0,
        bit_equal=bit_equal,
        max_abs_diff=max_abs,
        max_rel_diff=max_rel,
        tolerance_used=used,
    )


def _typical_scale(outputs: Sequence[np.ndarray]) -> float:
    """The median of the outputs' scales (`_finite_scale`)."""
    scales = [_finite_scale(np.asarray(a, np.float64)) for a in outputs if np.size(a)]
    return float(np.median(scales)) if scales else 0.0


def _finite_scale(values: np.ndarray) -> float:
    """The largest magnitude among the finite values (0 where there are none)."""
    return float(np.max(np.abs(values[np.isfinite(values)]), initial=0.0))


def _difference(a: np.ndarray, b: np.ndarray, typical: float) -> tuple[float, float, float]:
    """(largest |a - b|, that over a's scale, that over the tolerance) of two
    outputs of one shape, over their finite values. A NaN or an infinity that
    is not where it was, and the same, is an infinite difference."""
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(
        a[~finite], b[~finite], equal_nan=True
    ):
        return math.inf, math.inf, math.inf
    diff = float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))
    scale = _finite_scale(a)
    return (
        diff,
        diff / max(scale, 1e-30),
        diff / max(RELATIVE_TOLERANCE * (scale + typical), 1e-30),
    )
