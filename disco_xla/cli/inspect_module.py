"""`disco-xla inspect FILE`: summarise an HLO module."""

from __future__ import annotations

import argparse
import json

from disco_xla.hlo.hlo_io import load_module
from disco_xla.hlo.summary import format_summary, summarize


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    inspect = commands.add_parser(
        "inspect", parents=[common], help="summarise an HLO module: sizes, all-reduces, FLOPs"
    )
    inspect.add_argument("file", help="HLO module (.pb, .hlo.pb, .txt, .hlo, .gz) or XLA dump dir")
    inspect.add_argument(
        "--module", help="in a dump directory, the module whose file name contains this"
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    summary = summarize(load_module(args.file, args.module))
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0
