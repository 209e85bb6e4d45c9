"""Training scripts written the way users write them (`benchmarks/clients/`),
each run unmodified: plain, under `DISCO_XLA_FLAGS` on an empty plan cache (a
user's first run), and again on the cache that run left (a rerun), in rounds
of rotating order.

The clients know nothing of disco-xla. Each prints one JSON line: a final metric,
a sample of its final parameters, and its step or epoch times. For each client
this prints what the first run cost the loop (seconds, and as a share of the
plain loop), the rerun's speed counted from its first step, the steady speed
after the switch to the chosen program, the peak resident memory against plain,
and what the hook ran (`--disco_report`). `CLIENTS` lists them: library styles
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
    # The benchmark's run, about 40 s of plain loop here: long enough for the
    # background work (which waits for 10x the first call's time, `start_after`),
    # the trial and the timing rotation to end before the last quarter.
    long_arguments: tuple[str, ...] = ("--steps", "3000")


CLIENTS = {
    "sharded_jit_mnist": Client(
        "sharded_jit_mnist.py", ("--epochs", "2"), 1, "epoch_s", ("--epochs", "4000")
    ),
    "keras_fit": Client("keras_fit.py", (), 1, "epoch_s", ("--epochs", "1500")),
    "flax_nnx": Client("flax_nnx.py", long_arguments=("--steps", "8000")),
    "pmap_donate": Client("pmap_donate.py", long_arguments=("--steps", "20000")),
    "distributed_mlp": Client(
        "distributed_mlp.py", processes=4, long_arguments=("--steps", "1500")
    ),
    "flax_linen_checkpoint": Client(
        "flax_linen_checkpoint.py", long_arguments=("--steps", "25000")
    ),
    "optax_multisteps": Client("optax_multisteps.py", long_arguments=("--steps", "15000")),
    "ragged_last_batch": Client(
        "ragged_last_batch.py", ("--epochs", "3"), 1, "epoch_s", ("--epochs", "5000")
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


def _summary(name: str, rounds: list[dict[str, ClientRun]]) -> dict:
    """Each figure's median over the rounds, each round's runs taken together.

    - first-run cost: the hooked first run's loop time (the sum of its step or
      epoch times) less the plain run's, in seconds and as a share of plain's;
      negative where the run earned its cost back;
    - rerun speed: plain's loop time over the rerun's, every step counted from
      the first (a rerun finds the measured choice in the plan cache);
    - steady speed: plain's median step over the first run's, in the last
      quarter of the run (after the switch to the chosen program)."""
    key = CLIENTS[name].times_key

    def total(run: ClientRun) -> float:
        return sum(run.result[key])

    def last_quarter(run: ClientRun) -> float:
        times = run.result[key]
        return statistics.median(times[-max(1, len(times) // 4) :])

    def median(values) -> float:
        return statistics.median(list(values))

    cost = [total(r["first"]) - total(r["plain"]) for r in rounds]
    first_runs = [r["first"] for r in rounds]
    return {
        "client": name,
        "rounds": len(rounds),
        "plain_loop_s": round(median(total(r["plain"]) for r in rounds), 2),
        "first_run_cost_s": round(median(cost), 2),
        "first_run_cost_share": round(
            median(c / total(r["plain"]) for c, r in zip(cost, rounds, strict=True)), 3
        ),
        "rerun_speed": round(median(total(r["plain"]) / total(r["rerun"]) for r in rounds), 3),
        "rerun_first_step_s": round(median(r["rerun"].result[key][0] for r in rounds), 3),
        "plain_first_step_s": round(median(r["plain"].result[key][0] for r in rounds), 3),
        "steady_speed": round(
            median(last_quarter(r["plain"]) / last_quarter(r["first"]) for r in rounds), 3
        ),
        "peak_rss_ratio": round(
            median(r["first"].peak_rss_bytes / r["plain"].peak_rss_bytes for r in rounds), 3
        ),
        "first_status": _statuses(first_runs[-1]),
        "rerun_status": _statuses(rounds[-1]["rerun"]),
    }


def _statuses(run: ClientRun) -> dict[str, list[str]]:
    steps = run.report["steps"] if run.report else []
    return {step["name"]: step["status"] for step in steps}


# Each round runs plain, a first run on an empty plan cache and a rerun on the
# cache the first run left; the order rotates, the rerun always after its first.
_ORDERS = (("plain", "first", "rerun"), ("first", "rerun", "plain"), ("first", "plain", "rerun"))


def measure(name: str, rounds: int, cluster: str | None = None, wrapper: bool = False) -> dict:
    """`rounds` rounds of a client: plain, hooked on a fresh plan cache (a
    user's first run), and hooked again on that cache (a rerun), in rotating
    order (`_summary` says what is reported). With `wrapper`, each round also
    runs the hook with no work ever started (`--disco_start_after=1e9`): what
    the wrapped calls alone cost, as `wrapper_speed`."""
    cluster = cluster or ("cpu-local" if CLIENTS[name].processes > 1 else "cpu-local-inprocess")
    measured = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_index in range(rounds):
            cache = os.path.join(scratch, f"cache{round_index}")
            runs = {}
            order = _ORDERS[round_index % len(_ORDERS)]
            if wrapper:
                order = ("wrapper", *order) if round_index % 2 else (*order, "wrapper")
            for kind in order:
                flags = None
                if kind != "plain":
                    extra = ("--disco_start_after=1e9",) if kind == "wrapper" else ()
                    report = os.path.join(scratch, f"{kind}.json")
                    where = cache if kind != "wrapper" else os.path.join(scratch, "wrapper")
                    flags = hook_flags(cluster, where, report, extra)
                runs[kind] = run_client(name, flags, CLIENTS[name].long_arguments)
            measured.append(runs)
    summary = _summary(name, measured)
    if wrapper:
        loop = {
            kind: [sum(r[kind].result[CLIENTS[name].times_key]) for r in measured]
            for kind in ("plain", "wrapper")
        }
        summary["wrapper_speed"] = round(
            statistics.median(p / w for p, w in zip(loop["plain"], loop["wrapper"], strict=True)), 3
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS), choices=list(CLIENTS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--wrapper", action="store_true", help="also time the hook with no work started"
    )
    args = parser.parse_args(argv)
    for name in args.clients:
        summary = measure(name, args.rounds, wrapper=args.wrapper)
        if args.json:
            print(json.dumps(summary), flush=True)
            continue
        print(
            f"{name:22s} plain loop {summary['plain_loop_s']:.1f} s; first run costs "
            f"{summary['first_run_cost_s']:+.2f} s ({summary['first_run_cost_share']:+.1%}); "
            f"rerun {summary['rerun_speed']:.3f}x of plain from its first step; steady "
            f"{summary['steady_speed']:.3f}x; peak RSS {summary['peak_rss_ratio']:.3f}x; "
            f"first run: {summary['first_status']}; rerun: {summary['rerun_status']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
