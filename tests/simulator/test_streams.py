"""The `gpu-streams` schedule's issue order: buckets go in plan order, unless a
kernel would then wait for a bucket queued behind one whose gradients it
comes before."""

from __future__ import annotations

import math

import pytest

from disco_xla.simulator.streams import issue_order, streams_iteration_ps


def _run(last_producer, waits, comm_ps, bucket_count):
    """The iteration time of 10 kernels of 1 ps each and `comm_ps` buckets on
    one stream, read by the kernels in `waits`."""
    comms = len(comm_ps)
    return streams_iteration_ps(
        10,
        lambda positions: list(positions),
        waits,
        comm_ps,
        [0] * comms,
        [0] * comms,
        last_producer,
        [[] for _ in range(comms)],
        bucket_count,
    )


def test_plan_order_stays_where_no_kernel_would_wait_behind_a_later_gradient():
    # Bucket 0 is produced at kernel 2 and read at 9, bucket 1 at 5 and read at 9.
    assert issue_order([2, 5], [[], []], 2, [9, 9]) == [0, 1]
    # Out of readiness order is still the plan's order when nothing reads early.
    assert issue_order([5, 2], [[], []], 2, [9, 9]) == [0, 1]
    assert issue_order([5, 2], [[], []], 2, None) == [0, 1]


def test_a_bucket_read_before_an_earlier_buckets_producer_goes_first():
    # As in a loop body: bucket 0's gradient is produced at kernel 7, but kernel
    # 4 reads bucket 1, produced at 3. In plan order the stream would hold
    # bucket 1 behind bucket 0, which cannot start before kernel 7.
    assert issue_order([7, 3, 8], [[], [], []], 3, [8, 4, 9]) == [1, 0, 2]
    waits = {4: [1], 8: [0], 9: [2]}
    assert _run([7, 3, 8], waits, [5, 5, 5], 3) > 0  # no "cannot make progress"
    # Only the buckets that must move do: an unread one keeps its place.
    assert issue_order([7, 3, 8, 1], [[], [], [], []], 4, [8, 4, 9, math.inf]) == [1, 0, 2, 3]


def test_buckets_read_before_their_own_producers_keep_plan_order_and_cannot_progress():
    # Kernels 2 and 3 read buckets 0 and 1, whose last gradients are produced at
    # kernels 5 and 4 (a reader of one member ordered before another member's
    # producer): no issue order helps, and the schedule says so at once.
    assert issue_order([5, 4], [[], []], 2, [2, 3]) == [0, 1]
    with pytest.raises(RuntimeError, match="cannot make progress"):
        _run([5, 4], {2: [0], 3: [1]}, [5, 5], 2)
