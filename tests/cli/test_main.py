"""`python -m disco_xla.cli` and the `disco-xla` command are the same command line."""

from __future__ import annotations

from tests.conftest import run_cli


def test_python_dash_m_runs_the_same_command_line():
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "disco_xla.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_cli("--help").stdout
    for command in ("inspect", "capture", "calibrate", "optimize", "profile", "eval-cost-model"):
        assert command in result.stdout
