"""Run a script as 2 `jax.distributed` processes across the testbed's 1 Gbit/s link.

    sudo benchmarks/testbed.sh up
    .venv/bin/python benchmarks/testbed_launch.py [--timeout-s S] script.py ARGS
    sudo benchmarks/testbed.sh down

Like `disco-xla launch -n 2`, but rank 0 runs in namespace disco_ns0 (10.77.0.1,
which also hosts the coordinator) and rank 1 in disco_ns1 (10.77.0.2), through
`ip netns exec`. Every byte between the ranks, coordinator and gloo alike, crosses
the shaped veth pair. gloo takes its own address from the hostname, which means
nothing inside a namespace, so each rank builds its CPU collectives with
`make_gloo_tcp_collectives(client, hostname=<its namespace address>)` before JAX
creates its CPU backend. The script runs unchanged as `__main__`; output lines
are prefixed with the rank; a failing rank stops the other.
"""

from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys
import threading
import time

NAMESPACES = (("disco_ns0", "10.77.0.1"), ("disco_ns1", "10.77.0.2"))
PORT = 47291  # inside disco_ns0, where nothing else listens


def _worker(rank: int, script: str, arguments: list[str]) -> None:
    """One rank: join the job with gloo bound to this namespace, run the script."""
    import jax
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    coordinator = f"{NAMESPACES[0][1]}:{PORT}"
    address = NAMESPACES[rank][1]
    jax.distributed.initialize(
        coordinator, num_processes=len(NAMESPACES), process_id=rank, initialization_timeout=120
    )

    def cpu_client():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=address
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", cpu_client, priority=0, fail_quietly=False)
    sys.argv = [script, *arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            sys.stdout.flush()
            os._exit(stop.code if isinstance(stop.code, int) else 1)
    jax.distributed.shutdown()


def _relay(rank: int, process: subprocess.Popen) -> None:
    for line in process.stdout:
        sys.stdout.write(f"[{rank}] {line}")
        sys.stdout.flush()


def launch(script: str, arguments: list[str], timeout_s: float | None) -> int:
    """Both ranks in their namespaces; 0 if both succeed, else the first failure's
    exit code (124 on timeout)."""
    ranks = []
    for rank, (namespace, _) in enumerate(NAMESPACES):
        command = ["ip", "netns", "exec", namespace, sys.executable, os.path.abspath(__file__)]
        command += ["--worker", str(rank), script, *arguments]
        ranks.append(
            subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )
    relays = [
        threading.Thread(target=_relay, args=(rank, process), daemon=True)
        for rank, process in enumerate(ranks)
    ]
    for relay in relays:
        relay.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    code = 0
    try:
        while any(p.poll() is None for p in ranks):
            failed = [p.returncode for p in ranks if p.poll() not in (None, 0)]
            if failed:
                code = failed[0]
                break
            if deadline is not None and time.monotonic() > deadline:
                print(f"testbed_launch: timed out after {timeout_s:.0f} s", file=sys.stderr)
                code = 124
                break
            time.sleep(0.05)
    finally:
        for process in ranks:
            if process.poll() is None:
                process.terminate()
        for process in ranks:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for relay in relays:
            relay.join(timeout=1.0)
    return code or next((p.returncode for p in ranks if p.returncode), 0)


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(int(sys.argv[2]), sys.argv[3], sys.argv[4:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout-s", type=float, help="stop both ranks after this long")
    parser.add_argument("script")
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    missing = [ns for ns, _ in NAMESPACES if not os.path.exists(f"/run/netns/{ns}")]
    if missing:
        print(
            f"testbed_launch: namespace {', '.join(missing)} missing: run "
            "`benchmarks/testbed.sh up` first",
            file=sys.stderr,
        )
        return 2
    return launch(args.script, args.arguments, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
