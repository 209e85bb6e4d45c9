"""The one rule every entry point uses to call a rewritten step's outputs the
original's: bit-equal, or within a tolerance of the outputs' scales, with NaNs
and infinities where they were."""

from __future__ import annotations

import numpy as np

from disco_xla.runtime.output_comparison import compare_outputs, differing_outputs


def _outputs(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(5)]


def test_a_rounding_difference_is_equal_and_a_real_one_is_not():
    expected = _outputs()
    close = [a.copy() for a in expected]
    close[1][0, 0] = np.nextafter(close[1][0, 0], np.float32(np.inf))
    verdict = compare_outputs(expected, close)
    assert verdict.equal and not verdict.bit_equal
    far = [a.copy() for a in expected]
    far[2][1, 1] += 0.01
    assert not compare_outputs(expected, far).equal
    assert differing_outputs(expected, far) == [2]


def test_a_nan_among_the_outputs_does_not_hide_a_difference_elsewhere():
    # Random inputs can make an optimizer's moments NaN; the other outputs
    # must still be compared against finite scales.
    expected = _outputs()
    expected[0][:] = np.nan
    expected[3][0, :] = np.nan
    differing = [a.copy() for a in expected]
    differing[2][1, 1] += 0.01
    verdict = compare_outputs(expected, differing)
    assert not verdict.equal
    assert np.isfinite(verdict.tolerance_used) and verdict.tolerance_used > 1
    assert differing_outputs(expected, differing) == [2]
    # The same NaNs where they were, and nothing else changed: bit-equal.
    assert compare_outputs(expected, [a.copy() for a in expected]).bit_equal


def test_a_nan_or_infinity_that_moves_is_a_difference():
    expected = _outputs()
    moved = [a.copy() for a in expected]
    moved[4][0, 0] = np.nan
    assert not compare_outputs(expected, moved).equal
    assert differing_outputs(expected, moved) == [4]
    signed = [a.copy() for a in expected]
    expected[1][2, 2], signed[1][2, 2] = np.inf, -np.inf
    assert not compare_outputs(expected, signed).equal
