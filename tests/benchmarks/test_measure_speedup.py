"""`benchmarks/measure_speedup.py` under `disco-xla launch -n 2`: one JSON object from
rank 0 with measured and predicted times of the three programs (no timing checks)."""

from __future__ import annotations

import json

from tests.conftest import run_cli

PROGRAMS = ("xla", "xla-nocombine", "disco")
PAIRS = ("disco_vs_xla", "disco_vs_xla_nocombine", "nocombine_vs_xla")


def _rank_zero_json(stdout: str) -> dict:
    found = [line[len("[0] ") :] for line in stdout.splitlines() if line.startswith("[0] {")]
    assert len(found) == 1, stdout[-3000:]
    return json.loads(found[0])


def test_two_processes_two_rounds_report_every_program_measured_and_predicted():
    result = run_cli(
        "launch",
        "-n",
        "2",
        "--timeout-s",
        "400",
        "benchmarks/measure_speedup.py",
        "--model",
        "vgg19",
        "--size",
        "tiny",
        "--batch-per-process",
        "1",
        "--rounds",
        "2",
        "--warmup",
        "1",
        "--max-evaluations",
        "5",
        "--json",
        timeout_s=450,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    report = _rank_zero_json(result.stdout)
    assert report["processes"] == 2 and report["rounds"] == 2
    (entry,) = report["models"]
    assert entry["model"] == "vgg19" and entry["global_batch"] == 2
    for name in PROGRAMS:
        assert len(entry["times_s"][name]) == 2
        assert all(t > 0 for t in entry["times_s"][name])
        assert entry["median_s"][name] > 0
        assert entry["predicted"]["iteration_s"][name] > 0
    for pair in PAIRS:
        assert entry["speedup"][pair] > 0 and entry["paired_speedup"][pair] > 0
        assert entry["predicted_speedup"][pair] > 0
    # The three programs compute the same step.
    assert entry["outputs_equal"]["xla-nocombine"]["equal"]
    assert entry["outputs_equal"]["disco"]["equal"]
    assert entry["disco_status"] and entry["plan_buckets"] >= 1
