"""`disco-xla launch -n N script.py ARGS`: run a script as N `jax.distributed`
processes on this machine, with the coordinator on loopback.

Each rank runs `python -m disco_xla.runtime.launch_worker script.py ARGS`, which
calls `jax.distributed.initialize` (gloo CPU collectives) before running the
script as `__main__`, so the script itself needs no change; it must not call
`jax.distributed.initialize` again. Output lines are prefixed with the rank.
When a rank fails, the others are stopped within `grace_s`, so a failure never
leaves the job hanging; the launcher returns the first failing rank's exit code.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from disco_xla.errors import DiscoInputError

COORDINATOR_VARIABLE = "DISCO_XLA_COORDINATOR"
PROCESSES_VARIABLE = "DISCO_XLA_NUM_PROCESSES"
RANK_VARIABLE = "DISCO_XLA_PROCESS_ID"


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(
    script: str,
    arguments: list[str],
    processes: int,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
) -> int:
    """Run `script` as `processes` ranks; returns 0 if all succeed, else the exit
    code of the first rank that failed (124 on timeout)."""
    if processes < 1:
        raise DiscoInputError("launch", f"-n must be at least 1, not {processes}")
    if not Path(script).is_file():
        raise DiscoInputError(script, "no such script")
    port = free_loopback_port()
    workers = []
    for rank in range(processes):
        env = {
            **os.environ,
            COORDINATOR_VARIABLE: f"127.0.0.1:{port}",
            PROCESSES_VARIABLE: str(processes),
            RANK_VARIABLE: str(rank),
            "PYTHONUNBUFFERED": "1",
        }
        workers.append(
            subprocess.Popen(
                [sys.executable, "-m", "disco_xla.runtime.launch_worker", script, *arguments],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
        )
    printers = [
        threading.Thread(target=_relay, args=(rank, worker), daemon=True)
        for rank, worker in enumerate(workers)
    ]
    for printer in printers:
        printer.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    failed_code = 0
    try:
        while any(w.poll() is None for w in workers):
            codes = [w.poll() for w in workers]
            failures = [c for c in codes if c not in (None, 0)]
            if failures:
                failed_code = failures[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"disco-xla launch: timed out after {timeout_s:.0f} s", file=sys.stderr)
                failed_code = 124
                break
            time.sleep(0.05)
    finally:
        _stop(workers, grace_s)
        for printer in printers:
            printer.join(timeout=1.0)
    if failed_code == 0:
        failed_code = next((w.returncode for w in workers if w.returncode != 0), 0)
    return failed_code


def _relay(rank: int, worker: subprocess.Popen) -> None:
    for line in worker.stdout:
        sys.stdout.write(f"[{rank}] {line}")
        sys.stdout.flush()


def _stop(workers: list[subprocess.Popen], grace_s: float) -> None:
    """Terminate the ranks still running; kill those that outlive `grace_s`."""
    running = [w for w in workers if w.poll() is None]
    for worker in running:
        worker.terminate()
    deadline = time.monotonic() + grace_s
    for worker in running:
        try:
            worker.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
