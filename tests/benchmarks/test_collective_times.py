"""`benchmarks/collective_times.py`: a traced step's collectives and other kernels,
summed per traced run and device, and the long collectives counted."""

from __future__ import annotations

import pytest


def test_each_traced_step_sums_its_collectives_and_kernels_and_counts_long_collectives():
    from benchmarks.collective_times import per_step_times

    def event(op, run, device, seconds):
        return ("thunk", {"hlo_op": op, "run_id": run, "device_ordinal": device}, seconds)

    events = [
        event("psum.1", 7, 0, 2e-3),
        event("psum.2", 7, 0, 1e-4),
        event("fusion", 7, 0, 3e-4),
        event("psum.1", 7, 1, 5e-4),
        event("fusion", 7, 1, 2e-4),
        ("ThunkExecutor::Execute", {"run_id": 7}, 9.0),  # not a kernel
    ]
    steps = per_step_times(events, {"psum.1", "psum.2"}, long_s=1e-3)
    assert len(steps) == 2
    first, second = steps
    assert first["collective_s"] == pytest.approx(2.1e-3)
    assert first["kernel_s"] == pytest.approx(3e-4)
    assert (first["long"], first["long_s"]) == (1, 2e-3)
    assert second["collective_s"] == pytest.approx(5e-4)
    assert (second["long"], second["long_s"]) == (0, 0.0)


def test_a_step_follows_its_slowest_device_phase_by_phase():
    import pytest

    from benchmarks.collective_times import slower_device_ratios

    def kernel(op, device, start, seconds, run=3):
        stats = {"hlo_op": op, "run_id": run, "device_ordinal": device, "start_ns": start}
        return ("thunk", stats, seconds)

    # Device 0 is slower before the all-reduce, device 1 after it (listed out of
    # order: phases follow the start times).
    events = [
        kernel("late", 0, 900, 1.0),
        kernel("early", 0, 100, 3.0),
        kernel("psum", 0, 500, 0.5),
        kernel("early", 1, 100, 1.0),
        kernel("psum", 1, 500, 2.5),
        kernel("late", 1, 900, 3.0),
        kernel("early", 0, 100, 1.0, run=4),  # one device only: no ratio
    ]
    # Slowest per phase: 3 + 3 = 6; each device's kernels: 4.
    assert slower_device_ratios(events, {"psum"}) == [pytest.approx(6 / 4)]
