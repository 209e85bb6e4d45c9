"""Long work shows a progress bar on a terminal and stays quiet otherwise."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

from tests.conftest import REPO_ROOT, run_cli

CAPTURE = ["capture", "--model", "gpt2_small", "--replicas", "2"]


def _run_on_terminal(args: list[str]) -> str:
    """Run `disco-xla` with stderr on an 80-column pseudo-terminal; return what it drew."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    command = os.path.join(os.path.dirname(sys.executable), "disco-xla")
    process = subprocess.Popen(
        [command, *args], stdout=subprocess.DEVNULL, stderr=terminal, cwd=REPO_ROOT
    )
    os.close(terminal)
    drawn = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        drawn += chunk
    process.wait(timeout=120)
    os.close(controller)
    assert process.returncode == 0
    return drawn.decode(errors="replace")


def test_capture_draws_a_progress_bar_on_a_terminal(tmp_path):
    drawn = _run_on_terminal([*CAPTURE, "-o", str(tmp_path / "g.pb")])
    assert "lower" in drawn and "/3" in drawn


def test_capture_is_quiet_off_a_terminal_and_with_json(tmp_path):
    plain = run_cli(*CAPTURE, "-o", str(tmp_path / "a.pb"))
    assert plain.returncode == 0 and "/3" not in plain.stderr
    drawn = _run_on_terminal([*CAPTURE, "-o", str(tmp_path / "b.pb"), "--json"])
    assert "/3" not in drawn
