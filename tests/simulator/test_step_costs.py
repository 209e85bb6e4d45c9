"""What a step costs beyond its kernels and all-reduces on a calibrated CPU profile:
the host's per-step and per-buffer cost, the kernel time scale on shared cores, and
all-reduce points as they add to a computing step (issue 4, third validation)."""

from __future__ import annotations

import dataclasses

import pytest

from disco_xla.hlo.hlo_io import module_from_text
from disco_xla.plan import Plan
from disco_xla.profiling.calibrate import STEP_PAIRS, StepCosts, in_step_points
from disco_xla.simulator.comm import all_reduce_s
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from tests.simulator.test_simulator import KERNEL_S, TWO_GRADIENTS, timed


@pytest.fixture(scope="module")
def module():
    return module_from_text(TWO_GRADIENTS)


def test_step_costs_and_the_kernel_scale_add_to_a_serial_iteration(module):
    plain = dataclasses.replace(load_profile("cpu-local"), overlap=False)
    assert (plain.step_overhead_s, plain.step_buffer_s) != (0.0, 0.0)  # calibrated
    plain = dataclasses.replace(
        plain, step_overhead_s=0.0, step_buffer_s=0.0, kernel_time_scale=1.0
    )
    costly = dataclasses.replace(
        plain, step_overhead_s=1e-4, step_buffer_s=2e-6, kernel_time_scale=2.0
    )
    graph, costs = timed(module, Plan.unfused(module), plain)
    all_reduces_s = 2 * all_reduce_s(4096, plain)
    base = simulate(graph, plain, costs, step_buffers=5)
    assert base.iteration_s == pytest.approx(sum(KERNEL_S.values()) + all_reduces_s)
    result = simulate(graph, costly, costs, step_buffers=5)
    # T = scale · (sum of kernels) + all-reduces + step_overhead_s + buffers · step_buffer_s
    expected = 2.0 * sum(KERNEL_S.values()) + all_reduces_s + 1e-4 + 5 * 2e-6
    assert result.iteration_s == pytest.approx(expected)
    assert result.ideal_s == pytest.approx(2.0 * sum(KERNEL_S.values()) + 1e-4 + 5 * 2e-6)
    assert result.compute_s == pytest.approx(2.0 * sum(KERNEL_S.values()))


def test_a_gpu_profile_has_no_step_costs_and_simulates_bit_for_bit_as_before(module):
    profile = load_profile("h200-1x8-nvlink")
    assert (profile.step_overhead_s, profile.step_buffer_s, profile.kernel_time_scale) == (
        0.0,
        0.0,
        1.0,
    )
    graph = build_task_graph(module, Plan.unfused(module))
    _, costs = timed(module, Plan.unfused(module), profile)
    with_buffers = simulate(graph, profile, costs, step_buffers=1000)
    without = simulate(graph, profile, costs)
    assert with_buffers.iteration_s == without.iteration_s
    assert with_buffers.spans_ps == without.spans_ps and with_buffers.ideal_s == without.ideal_s


def test_step_costs_from_empty_steps_and_the_compute_probe():
    buffer_s, overhead_s = 2e-6, 16e-6
    one = overhead_s + 2 * buffer_s
    many = overhead_s + 2 * STEP_PAIRS * buffer_s
    costs = StepCosts.from_times(one, many, probe_s=one + 3e-3, probe_kernel_s=1.5e-3)
    assert costs.step_buffer_s == pytest.approx(buffer_s)
    assert costs.step_overhead_s == pytest.approx(overhead_s)
    assert costs.empty_step_s == one
    assert costs.kernel_time_scale == pytest.approx(2.0)
    # Without a probe, kernels keep their profiled time.
    assert StepCosts.from_times(one, many).kernel_time_scale == 1.0


def test_all_reduce_points_become_what_an_all_reduce_adds_to_a_computing_step():
    measured = [(4096, 1e-3), (16384, 0.5e-3), (65536, 3e-3)]
    step = StepCosts(1e-5, 1e-6, 2e-5, 1.0, all_reduce_in_step_s=2e-4)
    # Each less the least (0.5 ms), plus the in-step 0.2 ms; never below that.
    points = in_step_points(measured, step)
    assert [size for size, _ in points] == [4096, 16384, 65536]
    assert [t for _, t in points] == pytest.approx([7e-4, 2e-4, 2.7e-3])
    # Without the in-step probe: each less the empty step.
    no_probe = dataclasses.replace(step, all_reduce_in_step_s=None)
    assert [t for _, t in in_step_points(measured, no_probe)] == pytest.approx(
        [1e-3 - 2e-5, 0.5e-3 - 2e-5, 3e-3 - 2e-5]
    )


def test_other_collectives_points_use_their_own_in_step_time():
    measured = [(4096, 1e-3), (65536, 4e-3)]
    step = StepCosts(
        1e-5, 1e-6, 2e-5, 1.0, all_reduce_in_step_s=2e-4, collective_in_step_s={"all-gather": 5e-5}
    )
    assert step.in_step_s("all-gather") == 5e-5 and step.in_step_s("all-reduce") == 2e-4
    assert [t for _, t in in_step_points(measured, step, "all-gather")] == pytest.approx(
        [5e-5, 3.05e-3]
    )
    # A kind without an in-step time falls back to the empty step's.
    assert [t for _, t in in_step_points(measured, step, "all-to-all")] == pytest.approx(
        [1e-3 - 2e-5, 4e-3 - 2e-5]
    )


def _kernel_time_before_each_collective(spans_ps) -> list[int]:
    """From a run's spans in start order: for each all-reduce, the kernel time
    (ps) started since the previous all-reduce started (or the step's start)."""
    found, since = [], 0
    for _, _, kind, start, end in sorted(spans_ps, key=lambda span: span[3]):
        if kind == "kernel":
            since += end - start
        else:
            found.append(since)
            since = 0
    return found


@pytest.mark.parametrize("threads", [1, 2])
def test_each_collective_waits_for_the_slowest_worker_by_the_worker_lag(module, threads):
    plain = dataclasses.replace(
        load_profile("cpu-local"),
        compute_threads=threads,
        step_overhead_s=0.0,
        step_buffer_s=0.0,
        kernel_time_scale=1.0,
        worker_lag=0.0,
    )
    lagging = dataclasses.replace(plain, worker_lag=0.5)
    graph, costs = timed(module, Plan.unfused(module), plain)
    base = simulate(graph, plain, costs)
    result = simulate(graph, lagging, costs)
    collectives = [span for span in result.spans_ps if span[2] != "kernel"]
    base_collectives = {span[0]: span for span in base.spans_ps if span[2] != "kernel"}
    waits = _kernel_time_before_each_collective(result.spans_ps)
    assert len(collectives) == len(waits) == 2 and sum(waits) > 0
    ordered = sorted(collectives, key=lambda span: span[3])
    for (name, _, _, start, end), kernels_ps in zip(ordered, waits, strict=True):
        _, _, _, base_start, base_end = base_collectives[name]
        # Its own transfer, plus half the kernel time since the workers last met.
        assert end - start == (base_end - base_start) + round(0.5 * kernels_ps)
    if threads == 1:  # one after another: the waits add to the iteration
        assert result.iteration_s == pytest.approx(base.iteration_s + 0.5 * sum(waits) * 1e-12)
    assert result.iteration_s > base.iteration_s


def test_a_gpu_profile_ignores_the_worker_lag(module):
    profile = load_profile("h200-1x8-nvlink")
    assert profile.worker_lag == 0.0
    graph = build_task_graph(module, Plan.unfused(module))
    _, costs = timed(module, Plan.unfused(module), profile)
    lagging = dataclasses.replace(profile, worker_lag=0.5)
    assert simulate(graph, lagging, costs).spans_ps == simulate(graph, profile, costs).spans_ps


def test_the_worker_lag_is_the_all_reduce_growth_over_the_kernel_time():
    from disco_xla.profiling.calibrate import worker_lag

    # An all-reduce adds 20 us after 15 us of kernels a round, 70 us after 515 us.
    assert worker_lag((20e-6, 15e-6), (70e-6, 515e-6)) == pytest.approx(0.1)
    assert worker_lag((20e-6, 15e-6), (10e-6, 515e-6)) == 0.0  # never negative
    assert worker_lag((20e-6, 15e-6), (70e-6, 15e-6)) == 0.0  # no more kernels: unknown


@pytest.mark.parametrize("share", [0.6, 0.9, 1.3])
def test_a_tuple_tensor_is_priced_at_its_measured_share_of_a_separate_all_reduce(share):
    from disco_xla.profiling.calibrate import (
        IN_STEP_BYTES,
        TUPLE_TENSORS,
        tuple_element_seconds,
        tuple_element_share,
    )
    from disco_xla.simulator.events import communication_ps

    # The in-step probe: one all-reduce adds 50 us a round; each of the 15 more
    # tensors adds 40 us as separate all-reduces, and `share` of that in a tuple.
    rounds_s, extra = 1e-3, TUPLE_TENSORS - 1
    one_s, separate_s = rounds_s + 5e-5, rounds_s + 5e-5 + extra * 4e-5
    tuple_s = one_s + extra * share * 4e-5
    assert tuple_element_share(one_s, tuple_s, separate_s) == pytest.approx(share)
    assert tuple_element_share(one_s, one_s - 1e-5, separate_s) == 0.0  # never below 0
    assert tuple_element_share(one_s, tuple_s, one_s) == 1.0  # cannot be told
    # The profile then charges the probe's tensors in that order: the tuple's
    # extra tensors cost `share` of the separate all-reduces' extra.
    profile = dataclasses.replace(load_profile("cpu-local-inprocess"), collective_message_s=0.0)
    small_s = min(t for _, t in profile.all_reduce_points)
    step = StepCosts(1e-5, 1e-6, 2e-5, 1.0, all_reduce_in_step_s=small_s)
    priced = dataclasses.replace(
        profile, tuple_all_reduce_element_s=tuple_element_seconds(share, step)
    )
    tensor = IN_STEP_BYTES // TUPLE_TENSORS
    one_ps = communication_ps(IN_STEP_BYTES, 1, priced, all_reduce_s)[0]
    separate_ps = TUPLE_TENSORS * communication_ps(tensor, 1, priced, all_reduce_s)[0]
    tuple_ps = communication_ps(
        IN_STEP_BYTES, TUPLE_TENSORS, priced, all_reduce_s, (tensor,) * TUPLE_TENSORS
    )[0]
    assert (tuple_ps - one_ps) / (separate_ps - one_ps) == pytest.approx(share, rel=1e-6)
