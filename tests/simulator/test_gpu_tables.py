"""XLA's measured GPU tables: the import, and the interpolators over them."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from disco_xla.simulator.gpu_tables import (
    CollectiveTable,
    GemmTable,
    OpCycles,
    load_tables,
    tables_path,
)

REPO = Path(__file__).resolve().parents[2]
SHARED_TABLES = REPO.parent / "shared" / "data" / "xla-gpu-perf-tables"


@pytest.mark.skipif(not SHARED_TABLES.is_dir(), reason="shared/ is not beside the repository")
def test_shipped_tables_are_a_fresh_import_of_xlas_textprotos(tmp_path):
    out = tmp_path / "tables.json"
    command = [sys.executable, str(REPO / "tools" / "import_xla_perf_tables.py")]
    subprocess.run([*command, str(SHARED_TABLES), str(out)], check=True, capture_output=True)
    assert json.loads(out.read_text()) == json.loads(tables_path().read_text())


def test_the_import_reads_every_entry():
    tables = load_tables()
    assert {key: len(rows) for key, rows in tables["matmul"]["sm_90"].items()} == {
        "bf16xbf16->bf16": 375,
        "f32xf32->f32": 375,
    }
    assert len(tables["matmul"]["sm_100"]["bf16xbf16->bf16"]) == 375
    assert len(tables["collectives"]["sm_90"]) == 264
    assert tables["op_cycles"]["sm_90"]["f32"]["multiply"] == 3


def test_gemm_grid_points_come_back_exactly():
    gemms = GemmTable("sm_90")
    for (b, m, n, k), log_rate in list(gemms.log_rate["bf16xbf16->bf16"].items())[:40]:
        assert gemms.flops_per_s(b, m, n, k, "bf16") == pytest.approx(math.exp(log_rate))
    # 4096^3 bf16 on an H100: about 783 TFLOP/s in XLA's table.
    assert gemms.flops_per_s(1, 4096, 4096, 4096, "bf16") == pytest.approx(7.833e14, rel=1e-3)


def test_gemm_interpolation_holds_out_grid_points():
    """Each interior point, predicted from its neighbours along m alone (the
    interpolation between them), is typically within 5%; the table's own
    scatter makes the worst 31%."""
    gemms = GemmTable("sm_90")
    table = gemms.log_rate["bf16xbf16->bf16"]
    errors = []
    for (b, m, n, k), log_rate in table.items():
        if 256 < m < 4096:
            between = math.exp((table[(b, m // 2, n, k)] + table[(b, m * 2, n, k)]) / 2)
            errors.append(abs(between / math.exp(log_rate) - 1))
    assert statistics.median(errors) < 0.06 and max(errors) < 0.35


def test_gemm_outside_the_grid():
    gemms = GemmTable("sm_90")
    edge = gemms.flops_per_s(4, 4096, 4096, 4096, "bf16")
    # Above: the nearest point's efficiency.
    assert gemms.flops_per_s(16, 16384, 8192, 8192, "bf16") == pytest.approx(edge)
    # Below: the nearest point's time (no smaller tile is faster).
    assert gemms.seconds(1, 16, 256, 256, "bf16") == pytest.approx(
        gemms.seconds(1, 256, 256, 256, "bf16")
    )
    # In between: between the neighbours.
    low, high = (gemms.flops_per_s(1, m, 2048, 2048, "bf16") for m in (1024, 2048))
    assert min(low, high) < gemms.flops_per_s(1, 1500, 2048, 2048, "bf16") < max(low, high)


def test_gemm_rate_follows_the_input_type():
    gemms = GemmTable("sm_90")
    bf16 = gemms.seconds(1, 4096, 4096, 4096, "bf16")
    assert gemms.seconds(1, 4096, 4096, 4096, "f16") == bf16
    assert gemms.seconds(1, 4096, 4096, 4096, "f32") > 1.8 * bf16


def test_collective_table_reads_xlas_points_and_agrees_across_kinds():
    table = CollectiveTable("sm_90")
    # 2^28 f32 elements all-reduced over 8 GPUs: 227.44 GB/s in the table.
    assert table.seconds("all-reduce", 2**30, 8) == pytest.approx(2**30 / 227_444_546_849)
    for devices in (2, 4, 8):
        whole = 256 * 2**20
        all_reduce = table.seconds("all-reduce", whole, devices)
        for half in ("all-gather", "reduce-scatter"):
            assert 0.4 < table.seconds(half, whole, devices) / all_reduce < 0.75
    sizes = [2**s for s in range(10, 33)]
    times = [table.seconds("all-reduce", s, 8) for s in sizes]
    assert times == sorted(times)
    assert not table.covers("all-reduce", 3)


def test_op_cycles_by_type():
    cycles = OpCycles("sm_90")
    assert cycles.cycles("exponential", "bf16") == cycles.cycles("exponential", "f16")
    assert cycles.cycles("divide", "f32") > cycles.cycles("add", "f32")
    assert cycles.cycles("select", "f32") == cycles.cycles("add", "f32")
