"""`disco-xla calibrate` as a user runs it: it measures, fits and writes a profile
that loads, keeps the CPUs awake when asked, and adds its figures to a profile."""

from __future__ import annotations

import json
import math
import os

import pytest
import yaml

from disco_xla.simulator.comm import collective_s
from disco_xla.simulator.profiles import (
    MEASURED_COLLECTIVE_KINDS,
    load_profile,
)
from tests.conftest import run_cli


@pytest.mark.parametrize("where", [["--devices", "2"], ["--processes", "2"]])
def test_calibrate_measures_fits_and_writes_a_loadable_profile(tmp_path, where):
    path = tmp_path / "here.yaml"
    result = run_cli(
        "calibrate",
        *where,
        "--max-bytes",
        "262144",
        "--repeats",
        "3",
        "--json",
        "-o",
        str(path),
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert [p["bytes"] for p in report["points"]] == [4096, 16384, 65536, 262144]
    assert all(p["measured_s"] > 0 for p in report["points"])
    assert report["alpha_s"] >= 0 and report["bandwidth_bytes_per_s"] > 0
    assert report["workers"] == 2
    profile = load_profile(str(path))
    assert profile.intra_node.bandwidth_bytes_per_s == pytest.approx(
        report["bandwidth_bytes_per_s"]
    )
    assert math.isclose(profile.peak_flops["f32"], report["peak_flops_f32"])
    # XLA:CPU sends a tuple all-reduce's tensors one after another, on both runtimes.
    assert report["tuple_all_reduce_element_s"] > 0
    assert profile.tuple_all_reduce_element_s == pytest.approx(report["tuple_all_reduce_element_s"])
    # Each is priced as its measured share of a separate all-reduce, at the price
    # the profile puts on a small one.
    assert report["tuple_all_reduce_share"] > 0
    assert report["tuple_all_reduce_element_s"] == pytest.approx(
        report["tuple_all_reduce_share"] * report["all_reduce_in_step_s"]
    )
    # What a step costs beyond kernels and all-reduces, measured on empty steps and
    # probes, goes into the profile; the points are what an all-reduce adds to a step.
    assert report["step_buffer_s"] > 0 and report["empty_step_s"] > 0
    assert report["kernel_time_scale"] > 0 and report["all_reduce_in_step_s"] >= 0
    assert profile.step_overhead_s == pytest.approx(report["step_overhead_s"])
    assert profile.step_buffer_s == pytest.approx(report["step_buffer_s"])
    assert profile.kernel_time_scale == pytest.approx(report["kernel_time_scale"])
    assert report["worker_lag"] >= 0
    assert profile.worker_lag == pytest.approx(report["worker_lag"])
    # The boundary probe ran both programs, equal, and its residual went in.
    probe = report["fusion_boundary_probe"]
    assert probe["boundaries"] > 0 and probe["equal"] is True
    assert probe["xla_s"] > 0 and probe["split_s"] > 0 and probe["modelled_extra_s"] > 0
    residual = (probe["split_s"] - probe["xla_s"] - probe["modelled_extra_s"]) / probe["boundaries"]
    assert report["fusion_boundary_s"] == pytest.approx(max(0.0, residual))
    assert profile.fusion_boundary_s == pytest.approx(report["fusion_boundary_s"])
    assert min(t for _, t in profile.all_reduce_points) == pytest.approx(
        max(report["all_reduce_in_step_s"], 1e-9)
    )
    # The other collectives were timed at every other size, alone and inside a
    # computing step, and the communication model now reads their points.
    measured = report["collective_points"]
    assert set(measured) == set(MEASURED_COLLECTIVE_KINDS) == set(profile.collective_points)
    assert set(report["collective_in_step_s"]) == set(MEASURED_COLLECTIVE_KINDS)
    for kind, points in measured.items():
        assert [p["bytes"] for p in points] == [4096, 65536]
        least = max(report["collective_in_step_s"][kind], 1e-9)
        assert min(p["in_step_s"] for p in points) == pytest.approx(least)
        assert profile.collective_points[kind] == tuple(
            (pytest.approx(p["bytes"]), pytest.approx(p["in_step_s"])) for p in points
        )
        largest = points[-1]["in_step_s"]
        assert collective_s(kind, 65536, profile) == pytest.approx(largest)
        assert collective_s(kind, 4096, profile) == pytest.approx(
            min(p["in_step_s"] for p in points)
        )


def test_calibrate_keeps_the_cpus_awake_when_asked_and_says_so(tmp_path):
    from disco_xla.timing import CPU_LATENCY_DEVICE

    path = tmp_path / "awake.yaml"
    arguments = ["--devices", "2", "--max-bytes", "4096", "--repeats", "2", "-o", str(path)]
    result = run_cli("calibrate", *arguments, "--keep-cpus-awake", "--json", timeout_s=300)
    if not os.access(CPU_LATENCY_DEVICE, os.W_OK):
        # Where the request may not be made, a one-line error, and no profile.
        assert result.returncode == 2 and CPU_LATENCY_DEVICE in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and not path.exists()
        return
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["runtime"].endswith(
        "idle CPUs kept polling (--keep-cpus-awake)"
    )
    assert "--keep-cpus-awake" in yaml.safe_load(path.read_text())["calibration"]["runtime"]


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--devices", "1"], "at least 2"),
        (["--engine", "horovod", "--processes", "1"], "at least 2"),
        (["--engine", "horovod", "--devices", "4"], "--engine horovod runs ranks"),
    ],
)
def test_calibrate_refuses_what_it_cannot_measure(flags, problem):
    result = run_cli("calibrate", *flags)
    assert result.returncode == 2 and problem in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_calibrate_adds_its_figures_to_a_profile_at_their_worker_count(tmp_path):
    path = tmp_path / "machine.yaml"
    shipped = open(load_profile("cpu-local-inprocess").source).read()
    path.write_text(shipped)
    before = load_profile(str(path))
    arguments = ["--devices", "4", "--max-bytes", "4096", "--repeats", "2", "--json"]
    result = run_cli("calibrate", *arguments, "--add-to", str(path), timeout_s=300)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["added_at_workers"] == 4 and report["profile"] == str(path)
    after = load_profile(str(path))
    # Its own count's figures are as they were; the new count reads what was measured.
    assert after.workers == 2 and after.all_reduce_points == before.all_reduce_points
    assert after.worker_lag == before.worker_lag
    at_four = load_profile(str(path), workers=4)
    assert at_four.workers == 4 and at_four.worker_lag == pytest.approx(report["worker_lag"])
    assert [size for size, _ in at_four.all_reduce_points] == [4096]
    assert at_four.tuple_all_reduce_element_s == pytest.approx(report["tuple_all_reduce_element_s"])
    # The profile's opening comments (its provenance) are kept.
    opening = shipped[: shipped.index("\nname:") + 1]
    assert opening.startswith("# Written by") and path.read_text().startswith(opening)
    # Its own count cannot be added as a section: a one-line error before measuring.
    again = run_cli("calibrate", "--devices", "2", "--add-to", str(path))
    assert again.returncode == 2 and "write it anew with -o" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
