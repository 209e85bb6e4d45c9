"""`disco-xla launch -n N script.py ARGS`: run a script as N `jax.distributed`
processes on this machine, with the coordinator on loopback.

Each rank runs `python -m disco_xla.runtime.launch_worker script.py ARGS`, which
calls `jax.distributed.initialize` (gloo CPU collectives) before running the
script as `__main__`, so the script itself needs no change; it must not call
`jax.distributed.initialize` again. Output lines are prefixed with the rank.
When a rank fails, the others are stopped within `grace_s`, so a failure never
leaves the job hanging; the launcher returns the first failing rank's exit code.

`launch_horovod` (`disco-xla launch --engine horovod`) runs the script under
`horovodrun -np N -H localhost:N --gloo` from the separate `.venv-horovod`
environment (Horovod builds only against TensorFlow 2.12; see the Makefile), with
this repository on PYTHONPATH. horovodrun stops the other ranks when one fails;
on timeout the whole process group is stopped.
"""

from __future__ import annotations

import os
import signal
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
HOROVOD_VENV_VARIABLE = "DISCO_XLA_HOROVOD_VENV"
REPO_ROOT = Path(__file__).resolve().parents[2]


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _check_job(script: str, processes: int) -> None:
    if processes < 1:
        raise DiscoInputError("launch", f"-n must be at least 1, not {processes}")
    if not Path(script).is_file():
        raise DiscoInputError(script, "no such script")


def launch(
    script: str,
    arguments: list[str],
    processes: int,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
) -> int:
    """Run `script` as `processes` ranks; returns 0 if all succeed, else the exit
    code of the first rank that failed (124 on timeout)."""
    _check_job(script, processes)
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


def horovod_environment() -> Path:
    """The `.venv-horovod` to run Horovod from: `$DISCO_XLA_HOROVOD_VENV` when set,
    else the one beside this package's repository, else one in the working
    directory."""
    explicit = os.environ.get(HOROVOD_VENV_VARIABLE)
    if explicit:
        candidates = [Path(explicit)]
    else:
        candidates = [REPO_ROOT / ".venv-horovod", Path.cwd() / ".venv-horovod"]
    for venv in candidates:
        if (venv / "bin" / "horovodrun").is_file():
            return venv
    raise DiscoInputError(
        str(candidates[0]),
        "no Horovod environment (bin/horovodrun): create it with `make .venv-horovod/.installed`",
    )


def launch_horovod(
    script: str,
    arguments: list[str],
    processes: int,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
) -> int:
    """Run `script` as `processes` Horovod ranks (gloo, this machine) with the
    `.venv-horovod` Python; returns horovodrun's exit code (124 on timeout)."""
    _check_job(script, processes)
    venv = horovod_environment()
    python_path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    command = [str(venv / "bin" / "horovodrun"), "-np", str(processes)]
    command += ["-H", f"localhost:{processes}", "--gloo", str(venv / "bin" / "python"), script]
    runner = subprocess.Popen(
        [*command, *arguments],
        env={**os.environ, "PYTHONPATH": python_path, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # one process group: a timeout stops every rank
    )
    try:
        return runner.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"disco-xla launch: timed out after {timeout_s:.0f} s", file=sys.stderr)
        return 124
    finally:
        _stop_group(runner, grace_s)


def _stop_group(runner: subprocess.Popen, grace_s: float) -> None:
    """Stop horovodrun and its ranks (its process group): TERM, then KILL after
    `grace_s`. The ranks may outlive horovodrun itself, so the group is signalled
    even when horovodrun has already exited."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(runner.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGTERM:
            try:
                runner.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and _group_alive(runner.pid):
                time.sleep(0.05)
            if not _group_alive(runner.pid):
                return


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True
