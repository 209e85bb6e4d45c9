"""Training scripts written the way users write them (`benchmarks/clients/`),
each run unmodified: plain, and under `DISCO_XLA_FLAGS`, paired and alternating.

The clients know nothing of disco-xla. Each prints one JSON line: a final metric,
a sample of its final parameters, and its step or epoch times. For each client
this prints the median step (or epoch) time under the hook against plain, the
first step's time against plain (the first call's overhead: capture, search,
compiles and trial), the peak resident memory of the process against plain, and
what the hook ran (`--disco_report`). `CLIENTS` lists them: library styles
(sharded `jax.jit`, Keras `model.fit`, Flax NNX and Linen, pmap, Optax's
`MultiSteps`), an evaluation and a checkpoint between steps, and a smaller last
batch that traces the step again. One-process clients run on 2 host CPU
devices; `distributed_mlp` runs as 4 `jax.distributed` processes through
`disco-xla launch`, priced with `cpu-local`.

    .venv/bin/python benchmarks/real_clients.py [--clients NAME ...] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLIENTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "clients")
DEVICES = 2  # in-process collectives on more host devices can deadlock here (README)


@dataclass(frozen=True)
class Client:
    script: str  # file name under benchmarks/clients/
    arguments: tuple[str, ...] = ()  # the tiny sizes the tests use
    processes: int = 1  # >1: run through `disco-xla launch -n processes`
    times_key: str = "step_s"  # which list of times the client prints
    # The benchmark's run: long enough for the background work, the trial and
    # the timing rotation to end well before the last quarter of the run.
    long_arguments: tuple[str, ...] = ("--steps", "3000")


CLIENTS = {
    "sharded_jit_mnist": Client(
        "sharded_jit_mnist.py", ("--epochs", "2"), 1, "epoch_s", ("--epochs", "400")
    ),
    "keras_fit": Client("keras_fit.py", (), 1, "epoch_s", ("--epochs", "600")),
    "flax_nnx": Client("flax_nnx.py"),
    "pmap_donate": Client("pmap_donate.py", long_arguments=("--steps", "8000")),
    "distributed_mlp": Client(
        "distributed_mlp.py", processes=4, long_arguments=("--steps", "1500")
    ),
    "flax_linen_checkpoint": Client("flax_linen_checkpoint.py"),
    "optax_multisteps": Client("optax_multisteps.py"),
    "ragged_last_batch": Client(
        "ragged_last_batch.py", ("--epochs", "3"), 1, "epoch_s", ("--epochs", "600")
    ),
}


@dataclass
class ClientRun:
    """One run of a client: its printed result, the hook's report (None when
    plain), the process's peak resident memory and its wall time."""

    result: dict
    report: dict | None
    peak_rss_bytes: int
    wall_s: float
    stderr: str = field(repr=False, default="")


def hook_flags(cluster: str, cache_dir: str, report: str, extra: tuple[str, ...] = ()) -> str:
    """The DISCO_XLA_FLAGS of a hooked run."""
    return " ".join(
        [
            "--disco_enable",
            f"--disco_cluster={cluster}",
            f"--disco_cache_dir={cache_dir}",
            f"--disco_report={report}",
            *extra,
        ]
    )


def _command(client: Client, arguments: tuple[str, ...]) -> list[str]:
    script = os.path.join(CLIENTS_DIR, client.script)
    if client.processes > 1:
        launcher = os.path.join(os.path.dirname(sys.executable), "disco-xla")
        return [launcher, "launch", "-n", str(client.processes), script, *arguments]
    return [sys.executable, script, *arguments]


def run_client(
    name: str,
    flags: str | None,
    arguments: tuple[str, ...] | None = None,
    timeout_s: float = 900,
) -> ClientRun:
    """Run client `name` once, plain (`flags` None) or under DISCO_XLA_FLAGS=`flags`
    (which should hold a `--disco_report=FILE`). Raises RuntimeError with the end
    of its stderr if it fails."""
    client = CLIENTS[name]
    env = dict(os.environ)
    env.pop("DISCO_XLA_FLAGS", None)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
    env["PYTHONUNBUFFERED"] = "1"
    if flags is not None:
        env["DISCO_XLA_FLAGS"] = flags
    command = _command(client, client.arguments if arguments is None else arguments)
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=REPO_ROOT)
        try:
            _, status, usage = _wait(process, timeout_s)
        finally:
            process.kill()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    wall_s = time.perf_counter() - started
    if status != 0:
        raise RuntimeError(f"{name} exited with {status}: {stderr[-3000:]}")
    lines = [line for line in stdout.splitlines() if "{" in line]
    result = json.loads(lines[-1][lines[-1].index("{") :])  # launch prefixes the rank
    report = None
    if flags is not None:
        path = flags.split("--disco_report=")[1].split()[0]
        with open(path) as file:
            report = json.load(file)
    return ClientRun(result, report, usage.ru_maxrss * 1024, wall_s, stderr)


def _wait(process: subprocess.Popen, timeout_s: float):
    """os.wait4 on the process with a deadline: (pid, exit status, rusage)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            return pid, os.waitstatus_to_exitcode(status), usage
        if time.monotonic() > deadline:
            raise TimeoutError(f"{process.args} ran past {timeout_s} s")
        time.sleep(0.05)


def _summary(name: str, plain: list[ClientRun], hooked: list[ClientRun]) -> dict:
    key = CLIENTS[name].times_key

    def median_of(runs, pick):
        return statistics.median(pick(run.result[key]) for run in runs)

    def last_quarter(times):  # after the switch to the chosen program
        return statistics.median(times[-max(1, len(times) // 4) :])

    steady = median_of(hooked, last_quarter) / median_of(plain, last_quarter)
    first = median_of(hooked, lambda t: t[0]) / median_of(plain, lambda t: t[0])
    memory = statistics.median(r.peak_rss_bytes for r in hooked) / statistics.median(
        r.peak_rss_bytes for r in plain
    )
    steps = hooked[-1].report["steps"] if hooked[-1].report else []
    return {
        "client": name,
        "rounds": len(plain),
        "steady_time_ratio": round(steady, 3),
        "first_time_ratio": round(first, 2),
        "first_plain_s": round(median_of(plain, lambda t: t[0]), 3),
        "first_hooked_s": round(median_of(hooked, lambda t: t[0]), 3),
        "peak_rss_ratio": round(memory, 3),
        "status": {step["name"]: step["status"] for step in steps},
    }


def measure(name: str, rounds: int, cluster: str | None = None) -> dict:
    """`rounds` paired runs of a client, plain and hooked, the order alternating;
    the hooked runs share one plan cache (the first searches; later ones use
    the cached, measured choice, as a user's second run would)."""
    cluster = cluster or ("cpu-local" if CLIENTS[name].processes > 1 else "cpu-local-inprocess")
    plain, hooked = [], []
    with tempfile.TemporaryDirectory() as scratch:
        flags = hook_flags(cluster, os.path.join(scratch, "cache"), os.path.join(scratch, "r.json"))
        for round_index in range(rounds):
            order = [None, flags] if round_index % 2 == 0 else [flags, None]
            for run_flags in order:
                run = run_client(name, run_flags, CLIENTS[name].long_arguments)
                (plain if run_flags is None else hooked).append(run)
    return _summary(name, plain, hooked)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    for name in args.clients:
        summary = measure(name, args.rounds)
        if args.json:
            print(json.dumps(summary), flush=True)
            continue
        print(
            f"{name:18s} steady {summary['steady_time_ratio']:.3f}x of plain, first step "
            f"{summary['first_hooked_s']:.2f} s against {summary['first_plain_s']:.2f} s, "
            f"peak RSS {summary['peak_rss_ratio']:.3f}x; {summary['status']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
