"""`disco-xla inspect` as a user runs it: the JSON and the readable summary,
and a reader that stops early."""

from __future__ import annotations

import json

from tests.conftest import run_cli

REQUIRED_KEYS = {"instructions", "computations", "all_reduces", "all_reduce_bytes", "flops"}


def test_inspect_json_reports_the_pmap_step(module_files):
    result = run_cli("inspect", module_files["jax_pmap_step"], "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert REQUIRED_KEYS <= summary.keys()
    assert summary["all_reduces"] == 5 and summary["gradient_all_reduces"] == 4
    assert summary["gradient_all_reduce_bytes"] == (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert summary["num_partitions"] == 4 and summary["num_replicas"] == 1
    assert summary["opcodes"]["all-reduce"] == 5
    assert summary["flops"] > 2 * 32 * 64 * 256  # at least the first layer's forward dot
    assert summary["format"] == "pb"


def test_inspect_prints_a_readable_summary(module_files):
    result = run_cli("inspect", module_files["tf_train_step"])
    assert result.returncode == 0, result.stderr
    assert "instructions" in result.stdout and "all-reduces   0" in result.stdout
    assert "dot 3" in result.stdout or "dot " in result.stdout


def test_a_reader_that_stops_early_is_not_an_internal_error(module_files):
    """`disco-xla inspect ... | head`: the reader has gone when we write."""
    import os
    import subprocess
    import sys

    command = os.path.join(os.path.dirname(sys.executable), "disco-xla")
    child = subprocess.Popen(
        [command, "inspect", module_files["jax_pmap_step"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child.stdout.close()  # no reader: every write fails with a broken pipe
    _, errors = child.communicate(timeout=120)
    assert "internal error" not in errors and "Traceback" not in errors, errors
    assert child.returncode == 141
