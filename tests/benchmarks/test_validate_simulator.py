"""`benchmarks/validate_simulator.py` on 2 gloo processes: the three plans compile,
compute the same step (vgg19: bit for bit, or within the project's tolerance),
and are measured and simulated (no timing checks)."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_two_processes_measure_and_simulate_none_xla_and_a_hand_picked_bucketing():
    result = run_cli(
        "launch",
        "-n",
        "2",
        "--timeout-s",
        "400",
        "benchmarks/validate_simulator.py",
        "--model",
        "vgg19",
        "--rounds",
        "2",
        "--profile-runs",
        "1",
        "--block",
        "2",
        "--batch-per-worker",
        "1",
        "--json",
        timeout_s=450,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    found = [line[4:] for line in result.stdout.splitlines() if line.startswith("[0] {")]
    assert len(found) == 1, result.stdout[-3000:]
    report = json.loads(found[0])
    assert report["runtime"] == "2 gloo processes" and report["cluster"] == "cpu-local"
    rows = {row["plan"]: row for row in report["rows"]}
    assert set(rows) == {"none", "xla", "buckets"}
    assert report["all_equal_to_xla"]
    assert isinstance(report["cpus_kept_awake"], bool)
    for row in rows.values():
        assert row["measured_ms"] > 0 and row["simulated_ms"] > 0 and row["table_misses"] == 0
        # The same program with the shipped GNN's and the roofline's kernel times.
        predicted = row["simulated_ms_ablated"]
        assert predicted["gnn_cost_model"] > 0 and predicted["roofline_cost_model"] > 0
        assert predicted["gnn_cost_model"] != row["simulated_ms"]
        # The same simulation with the traced collective times.
        assert predicted["traced_collectives"] > 0
    # vgg19 tiny has 38 gradients and a mean loss: one all-reduce each without the
    # combiner, XLA's one tuple all-reduce, and three buckets plus the loss.
    assert rows["none"]["all_reduces"] == 39
    assert rows["xla"]["all_reduces"] == 1
    assert rows["buckets"]["all_reduces"] == 4
    assert rows["xla"]["kernels"] < rows["none"]["kernels"]


def test_a_step_hands_over_its_parameters_and_results():
    from benchmarks.validate_simulator import step_buffers
    from disco_xla.hlo.hlo_io import module_from_text
    from tests.simulator.test_simulator import TWO_GRADIENTS

    # Three parameters in, a tuple of two updates out.
    assert step_buffers(module_from_text(TWO_GRADIENTS)) == 5


def test_probes_timed_with_the_plans_set_the_machine_speed_terms_of_the_profile():
    import dataclasses

    import pytest

    from benchmarks.validate_simulator import (
        EMPTY,
        EMPTY_MANY,
        IN_STEP,
        IN_STEP_NONE,
        LAG,
        LAG_NONE,
        PROBE,
        SEPARATE,
        TUPLE,
        with_probes,
    )
    from disco_xla.profiling.calibrate import IN_STEP_ROUNDS, STEP_PAIRS, TUPLE_TENSORS
    from disco_xla.simulator.profiles import load_profile

    profile = dataclasses.replace(
        load_profile("cpu-local-inprocess"),
        step_overhead_s=1e-5,
        step_buffer_s=5e-6,
        tuple_all_reduce_element_s=1e-3,
        all_reduce_points=((4096.0, 2e-5), (65536.0, 1e-4)),
    )
    # Steps of 1 and of STEP_PAIRS (argument, result) pairs: 20 us + 2 us a buffer.
    empty_s, buffer_s = 2e-5, 2e-6
    times = {
        EMPTY: [empty_s] * 3,
        EMPTY_MANY: [empty_s + 2 * (STEP_PAIRS - 1) * buffer_s] * 3,
        PROBE: [3e-3, empty_s + 4e-3, 9e-3],  # median: the empty step + 4 ms
        IN_STEP: [1e-3 + IN_STEP_ROUNDS * 5e-5] * 3,
        IN_STEP_NONE: [1e-3] * 3,
        # As one tensor the all-reduce adds 50 us a round; as 16, 15 x 15 us more,
        # and as 16 separate all-reduces 15 x 50 us more: a share of 0.3.
        TUPLE: [1e-3 + IN_STEP_ROUNDS * (5e-5 + (TUPLE_TENSORS - 1) * 1.5e-5)] * 3,
        SEPARATE: [1e-3 + IN_STEP_ROUNDS * 5e-5 * TUPLE_TENSORS] * 3,
        # With 1 ms more of kernels a round, each all-reduce adds 100 us more.
        LAG: [IN_STEP_ROUNDS * (2e-3 + 1.5e-4)] * 3,
        LAG_NONE: [IN_STEP_ROUNDS * 2e-3] * 3,
    }
    now = with_probes(profile, times, probe_kernel_s=2e-3)
    assert now.kernel_time_scale == pytest.approx(2.0)
    assert now.step_buffer_s == pytest.approx(buffer_s)
    assert now.step_overhead_s == pytest.approx(empty_s - 2 * buffer_s)
    # 0.3 of what the profile now charges a small all-reduce in a step, 50 us.
    assert now.tuple_all_reduce_element_s == pytest.approx(0.3 * 5e-5)
    # 1e-3 / 16 = 62.5 us a round without, 2 ms with more kernels: 100 us / 1.9375 ms.
    assert now.worker_lag == pytest.approx((1.5e-4 - 5e-5) / (2e-3 - 1e-3 / IN_STEP_ROUNDS))
    # A 4 KB all-reduce now adds 50 us to a step; every point moves by 30 us.
    assert [size for size, _ in now.all_reduce_points] == [4096.0, 65536.0]
    assert [t for _, t in now.all_reduce_points] == pytest.approx([5e-5, 1.3e-4])
    # The device's rates stay the profile's.
    assert now.peak_flops == profile.peak_flops


def test_traced_collectives_cost_what_the_trace_measured():
    import pytest

    from benchmarks.validate_simulator import traced_comm_cost
    from disco_xla.hlo.hlo_io import module_from_text
    from disco_xla.plan import Plan
    from disco_xla.simulator.comm import all_reduce_s
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile
    from tests.simulator.test_simulator import TWO_GRADIENTS

    module = module_from_text(TWO_GRADIENTS)
    graph = build_task_graph(module, Plan.unfused(module))
    profile = load_profile("cpu-local")
    # Both all-reduces are 4 KB: they share the mean of their traced means.
    cost = traced_comm_cost(graph, {"mean1": [1e-3, 3e-3], "mean2": [4e-3], "grad1": [9.0]})
    assert cost(4096, profile) == pytest.approx((2e-3 + 4e-3) / 2)
    # A size the trace did not show keeps the profile's model.
    assert cost(8192, profile) == all_reduce_s(8192, profile)
    # Without traced all-reduces every size keeps it.
    assert traced_comm_cost(graph, {"grad1": [9.0]})(4096, profile) == all_reduce_s(4096, profile)
