"""`disco-xla launch -n N SCRIPT ARGS`: run a script as N ranks on this machine
(`runtime/launch.py`)."""

from __future__ import annotations

import argparse

from disco_xla.errors import DiscoInputError
from disco_xla.runtime.launch import launch, launch_horovod


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "launch",
        parents=[common],
        help="run a script as N jax.distributed processes on this machine (loopback)",
    )
    parser.add_argument("-n", "--processes", type=int, required=True, help="processes (ranks)")
    parser.add_argument("--timeout-s", type=float, help="stop every rank after this long")
    parser.add_argument(
        "--engine",
        choices=["jax", "horovod"],
        default="jax",
        help="jax.distributed ranks, or horovodrun (gloo) from .venv-horovod",
    )
    parser.add_argument("script", help="a Python script; it runs unchanged on every rank")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's arguments")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.timeout_s is not None and args.timeout_s <= 0:
        raise DiscoInputError("launch", "--timeout-s must be positive")
    run_ranks = launch_horovod if args.engine == "horovod" else launch
    return run_ranks(args.script, args.arguments, args.processes, args.timeout_s)
