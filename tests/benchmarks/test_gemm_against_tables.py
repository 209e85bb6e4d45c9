"""The GEMM check a lent GPU runs first, tried on the CPU: it times each shape
and sets it against XLA's H100 table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from disco_xla.simulator.gpu_tables import GemmTable

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gemm_against_tables.py"


def test_each_shape_is_timed_and_priced_by_the_table():
    command = [sys.executable, str(SCRIPT), "--platform", "cpu", "--shapes", "tiny"]
    result = subprocess.run(
        [*command, "--repeats", "2", "--json"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows = json.loads(result.stdout)["rows"]
    assert [r["shape"] for r in rows] == [[1, 64, 64, 64], [2, 128, 64, 32]]
    table = GemmTable("sm_90")
    for row in rows:
        assert row["measured_s"] > 0 and row["device"] == "cpu"
        assert row["table_s"] == table.seconds(*row["shape"], "bf16")
        assert row["error"] == row["table_s"] / row["measured_s"] - 1
