"""The `disco-xla` command line.

Bad input ends with one line on stderr naming the file and the problem, and exit
code 2. `--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from disco_xla.errors import DiscoInputError

EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 1


def _inspect(args: argparse.Namespace) -> int:
    from disco_xla.hlo_passes.hlo_io import load_module
    from disco_xla.hlo_passes.summary import format_summary, summarize

    summary = summarize(load_module(args.file, args.module))
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from disco_xla.hlo_passes.hlo_io import load_module, save_module

    module = load_module(args.input, args.module)
    save_module(module, args.output)
    print(f"wrote {args.output} ({module.name}, {module.instruction_count} instructions)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="show a traceback on errors")
    parser = argparse.ArgumentParser(
        prog="disco-xla",
        description="Joint op-fusion and all-reduce bucketing for data-parallel XLA programs.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect", parents=[common], help="summarise an HLO module: sizes, all-reduces, FLOPs"
    )
    inspect.add_argument("file", help="HLO module (.pb, .hlo.pb, .txt, .hlo, .gz) or XLA dump dir")
    inspect.add_argument(
        "--module", help="in a dump directory, the module whose file name contains this"
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(run=_inspect)

    convert = commands.add_parser(
        "convert", parents=[common], help="convert between HLO formats, chosen by extension"
    )
    convert.add_argument("input")
    convert.add_argument("output", help="a .pb, .hlo.pb, .txt or .hlo path, optionally .gz")
    convert.add_argument(
        "--module", help="in a dump directory, the module whose file name contains this"
    )
    convert.set_defaults(run=_convert)
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


if __name__ == "__main__":
    sys.exit(main())
