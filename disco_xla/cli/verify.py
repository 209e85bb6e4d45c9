"""`disco-xla verify ORIGINAL REWRITTEN`: run both modules side by side; exit 1
where their outputs differ."""

from __future__ import annotations

import argparse
import json

from disco_xla.cli.shared import load_for_planning, use_devices
from disco_xla.errors import DiscoInputError, RewriteError
from disco_xla.runtime.candidate_timing import verify_rewrite
from disco_xla.runtime.xla_runner import devices_needed


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    verify = commands.add_parser(
        "verify", parents=[common], help="run an original and a rewritten module side by side"
    )
    verify.add_argument("original")
    verify.add_argument("rewritten")
    verify.add_argument("--devices", type=int, required=True, help="CPU devices to run on")
    verify.add_argument("--rounds", type=int, default=5, help="paired timing rounds")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    original = load_for_planning(args.original)
    rewritten = load_for_planning(args.rewritten)
    for path, module in ((args.original, original), (args.rewritten, rewritten)):
        needed = devices_needed(module)
        if needed != args.devices:
            raise DiscoInputError(path, f"the module runs on {needed} devices, not {args.devices}")
    use_devices(original)
    try:
        comparison = verify_rewrite(original, rewritten, args.devices, args.rounds)
    except RewriteError as error:
        raise DiscoInputError(args.rewritten, str(error)) from None
    if args.json:
        print(json.dumps(comparison.to_dict()))
    else:
        verdict = (
            "bit-equal"
            if comparison.bit_equal
            else ("equal within 1e-6 relative" if comparison.equal else "DIFFERENT")
        )
        print(
            f"outputs: {verdict} (max abs diff {comparison.max_abs_diff:.3g}, "
            f"relative {comparison.max_rel_diff:.3g})"
        )
        original_ms, rewritten_ms = comparison.original_s * 1e3, comparison.rewritten_s * 1e3
        print(
            f"median step: original {original_ms:.3f} ms, rewritten {rewritten_ms:.3f} ms "
            f"over {comparison.rounds} paired rounds"
        )
    return 0 if comparison.equal else 1
