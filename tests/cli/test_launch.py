"""`disco-xla launch` as a user runs it: a failing rank stops the others, and
bad input is refused in one line."""

from __future__ import annotations

import textwrap

from tests.conftest import run_cli


def test_a_failing_rank_stops_the_others(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time, jax
            if jax.process_index() == 1:
                sys.exit(3)
            time.sleep(600)
            """
        )
    )
    result = run_cli("launch", "-n", "2", str(script), timeout_s=120)
    assert result.returncode == 3


def test_launch_refuses_bad_input_with_one_line():
    result = run_cli("launch", "-n", "2", "/no/such/script.py")
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such script" in result.stderr
    result = run_cli("launch", "-n", "0", "/no/such/script.py")
    assert result.returncode == 2
