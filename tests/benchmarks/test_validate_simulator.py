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
    for row in rows.values():
        assert row["measured_ms"] > 0 and row["simulated_ms"] > 0 and row["table_misses"] == 0
    # vgg19 tiny has 38 gradients and a mean loss: one all-reduce each without the
    # combiner, XLA's one tuple all-reduce, and three buckets plus the loss.
    assert rows["none"]["all_reduces"] == 39
    assert rows["xla"]["all_reduces"] == 1
    assert rows["buckets"]["all_reduces"] == 4
    assert rows["xla"]["kernels"] < rows["none"]["kernels"]
