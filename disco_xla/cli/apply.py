"""`disco-xla apply FILE PLAN -o OUT`: rewrite a module to run a plan, checked
against the original on this machine. `optimize -o MODULE` writes its module
the same way (`write_checked`)."""

from __future__ import annotations

import argparse
import json

from disco_xla.cli.shared import load_for_planning, load_plan, use_devices
from disco_xla.driver.checked_rewrite import checked_rewrite
from disco_xla.driver.planning import measured_alternatives
from disco_xla.errors import DiscoInputError
from disco_xla.hlo.hlo_io import save_module


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    apply = commands.add_parser(
        "apply",
        parents=[common],
        help="rewrite a module to run a plan (run against the original; never slower or different)",
    )
    apply.add_argument("file")
    apply.add_argument("plan", help="PLAN.json for this module")
    apply.add_argument("-o", "--output", required=True)
    apply.add_argument("--json", action="store_true", help="print one JSON object")
    add_write_checks(apply)
    apply.set_defaults(run=run)


def add_write_checks(parser: argparse.ArgumentParser) -> None:
    """The options of a command that writes a rewritten module."""
    parser.add_argument(
        "--no-check",
        action="store_true",
        help="write the rewrite without running it against the original (for another machine)",
    )
    parser.add_argument(
        "--buckets-only", action="store_true", help="apply the plan's buckets alone, no fusion"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="paired timing rounds of the check (default 5)"
    )


def run(args: argparse.Namespace) -> int:
    module = load_for_planning(args.file)
    plan = load_plan(args.plan)
    use_devices(module)
    written = write_checked(module, plan, args.plan, args)
    if args.json:
        print(json.dumps({"written": written.written, "measured": written.measured()}))
        return 0
    print(written_line(args.output, written))
    return 0


def write_checked(
    module, plan, plan_source: str, args: argparse.Namespace, comparison=None, save: bool = True
):
    """Rewrite `module` for `plan`, checked on this machine (unless --no-check),
    and save the program `checked_rewrite.checked_rewrite` chose to `args.output`
    (unless `save` is False: then only its measurements are wanted). With the
    search's `comparison`, its next best plans and the best baseline are
    measured beside the plan (--candidates)."""
    if args.rounds < 1:
        raise DiscoInputError(args.file, "--rounds must be at least 1")
    alternatives, simulated = {}, {}
    if comparison is not None:
        alternatives, simulated = measured_alternatives(
            comparison.found.top_plans, comparison.baseline_plans, args.candidates
        )
    written = checked_rewrite(
        module,
        plan,
        plan_source,
        buckets_only=args.buckets_only,
        check=not args.no_check,
        rounds=args.rounds,
        alternatives=alternatives,
        simulated_s=simulated,
        budget_s=getattr(args, "measure_budget_s", None),
    )
    if save:
        save_module(written.module, args.output)
    return written


def written_line(path: str, written, verb: str = "wrote") -> str:
    """One line: what was written to `path` (or, with another `verb`, chosen
    for it), and why."""
    label = written.written
    what = {
        "plan": "the plan (fusion boundaries and buckets)",
        "buckets": "the plan's buckets alone",
        "original": "the original module unchanged",
    }.get(label) or (
        f"the {label.split(':', 1)[1]} baseline's plan"
        if label.startswith("baseline:")
        else f"the search's plan ranked {label.rsplit('-', 1)[1]}"
    )
    return f"{verb} {path}: {what}; {written.why}"
