"""`disco-xla convert INPUT OUTPUT`: convert between HLO formats."""

from __future__ import annotations

import argparse

from disco_xla.hlo.hlo_io import load_module, save_module


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    convert = commands.add_parser(
        "convert", parents=[common], help="convert between HLO formats, chosen by extension"
    )
    convert.add_argument("input")
    convert.add_argument("output", help="a .pb, .hlo.pb, .txt or .hlo path, optionally .gz")
    convert.add_argument(
        "--module", help="in a dump directory, the module whose file name contains this"
    )
    convert.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    module = load_module(args.input, args.module)
    save_module(module, args.output)
    print(f"wrote {args.output} ({module.name}, {module.instruction_count} instructions)")
    return 0
