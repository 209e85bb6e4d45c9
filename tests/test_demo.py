"""`make demo`'s program, `python -m disco_xla.demo`, as a user runs it."""

from __future__ import annotations


def test_demo_captures_inspects_and_finds_every_gradient(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "disco_xla.demo"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "4 gradient all-reduces found for 4 parameter tensors (as expected)" in result.stdout
    # Step 6: the sharded jax.jit form on 4 processes, checked equal on every rank.
    assert "[0]    outputs against jax.jit's own program, on every rank: equal" in result.stdout
    assert "[0]    disco_xla.jit runs: " in result.stdout
    assert (tmp_path / "build" / "demo" / "mlp_step.hlo.pb").exists()
    _check_demo_pricing(result.stdout, tmp_path / "build" / "demo" / "report.html")


def _check_demo_pricing(stdout: str, report_path) -> None:
    """Each step of the demo is priced with the profile calibrated on the
    runtime it measures, names it, and prints simulated beside measured."""
    import re

    steps = dict(re.findall(r"^(\d)\. (.*?)(?=^\d\. |\Z)", stdout, re.S | re.M))
    assert set(steps) == {"1", "2", "3", "4", "5", "6"}, stdout[-3000:]
    assert steps["2"].startswith("searching with the cpu-local-inprocess profile")
    for number in ("3", "4"):  # measured in this process, on 4 CPU devices
        assert "   profile: cpu-local-inprocess (" in steps[number], steps[number]
        assert "simulated ms   measured ms" in steps[number]
    assert "priced with cpu-local-inprocess" in steps["5"]
    assert "on cpu-local-inprocess" in report_path.read_text()
    # Measured on 4 gloo processes: the multi-process profile, on rank 0's lines.
    assert "[0]    profile: cpu-local (" in steps["6"], steps["6"]
    assert "cpu-local-inprocess" not in steps["6"]
    for number, row in (("4", "jax.pmap (XLA)"), ("6", "jax.jit (XLA)")):
        line = next(x for x in steps[number].splitlines() if x.strip(" [0]").startswith(row))
        simulated_ms, measured_ms = (float(x) for x in line.split()[-2:])
        # A load on the machine only makes the measured time longer; priced with
        # the other runtime's profile, step 4 was simulated at 21x its measured time.
        assert simulated_ms < 10 * measured_ms, line
        jit = next(x for x in steps[number].splitlines() if "disco_xla.jit (" in x)
        assert len(re.findall(r"\d+\.\d{3}", jit)) == 2, jit
