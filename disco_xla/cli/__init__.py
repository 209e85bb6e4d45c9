"""The `disco-xla` command line.

Bad input ends with one line on stderr naming the file and the problem, and exit
code 2. `--verbose` adds the traceback.

Each command is one module of this package: `add_parser(commands, common)` adds
its subparser, `run(args)` runs it and returns the exit code. The modules are
named after their commands, except `inspect_module` (`inspect`) and
`profile_kernels` (`profile`), named apart from the standard library's modules.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from disco_xla.cli import (
    apply,
    calibrate,
    capture,
    convert,
    eval_cost_model,
    inspect_module,
    launch,
    optimize,
    profile_kernels,
    simulate,
    train_cost_model,
    verify,
)
from disco_xla.errors import DiscoInputError

EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 1

# In the order `disco-xla --help` lists them.
COMMANDS = (
    inspect_module,
    convert,
    capture,
    calibrate,
    simulate,
    optimize,
    apply,
    verify,
    launch,
    profile_kernels,
    train_cost_model,
    eval_cost_model,
)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="show a traceback on errors")
    parser = argparse.ArgumentParser(
        prog="disco-xla",
        description="Joint op-fusion and all-reduce bucketing for data-parallel XLA programs.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(commands, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except DiscoInputError as error:
        if args.verbose:
            traceback.print_exc()
        print(f"disco-xla: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("disco-xla: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`disco-xla inspect ... | head`): not our error.
        # Point stdout at nothing so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:  # noqa: BLE001 - one line unless --verbose
        if args.verbose:
            traceback.print_exc()
        message = " ".join(str(error).split())[:500]
        print(
            f"disco-xla: internal error: {type(error).__name__}: {message} "
            "(run with --verbose for a traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL_ERROR
