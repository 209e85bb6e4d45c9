"""The first-call speed check shared by `disco_xla.jit` and `disco_xla.tf_function`:
its decision rule on given timings, and the order in which the paired rounds run."""

from __future__ import annotations

import pytest

from disco_xla.driver.trial import TIMING_ROUNDS, slower_status
from disco_xla.timing import paired_median_seconds


@pytest.mark.parametrize(
    ("original_s", "rewritten_s", "keeps_rewritten"),
    [(0.010, 0.008, True), (0.008, 0.010, False), (0.010, 0.010, False)],
)
def test_the_rewritten_program_stays_only_when_strictly_faster(
    original_s, rewritten_s, keeps_rewritten
):
    status = slower_status(original_s, rewritten_s, "optimized")
    if keeps_rewritten:
        assert status is None
        return
    assert status.startswith("original: faster here (")
    # Both times per step in milliseconds, and what the original won against.
    assert f"{original_s * 1e3:.3f} ms per step" in status
    assert f"against {rewritten_s * 1e3:.3f} ms for optimized)" in status


def test_paired_rounds_alternate_which_program_runs_first():
    calls: list[str] = []
    original_s, rewritten_s = paired_median_seconds(
        lambda: calls.append("original"), lambda: calls.append("rewritten"), TIMING_ROUNDS
    )
    assert len(calls) == 2 * TIMING_ROUNDS
    rounds = [tuple(calls[i : i + 2]) for i in range(0, len(calls), 2)]
    assert rounds[0::2] == [("rewritten", "original")] * (TIMING_ROUNDS // 2)
    assert rounds[1::2] == [("original", "rewritten")] * (TIMING_ROUNDS // 2)
    assert original_s >= 0.0 and rewritten_s >= 0.0
