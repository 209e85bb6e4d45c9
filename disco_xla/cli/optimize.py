"""`disco-xla optimize FILE -o OUT`: search for the plan with the lowest
simulated time, beside every baseline; with `-o MODULE`, also apply it, checked
and measured on this machine. The flags' defaults are `settings.DEFAULTS`."""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from disco_xla.cli.apply import add_write_checks, write_checked, written_line
from disco_xla.cli.report import write_report
from disco_xla.cli.shared import (
    add_setting_options,
    add_xla_dump,
    load_dump,
    load_for_planning,
    use_devices,
)
from disco_xla.cli.simulate import COST_MODELS
from disco_xla.errors import DiscoInputError
from disco_xla.runtime.xla_runner import compile_separately
from disco_xla.search.fusion_source import xla_fusion_of
from disco_xla.search.pipeline import Pricing, plan_module, pricing
from disco_xla.search.summary import comparison_summary, format_table
from disco_xla.search.xla_flags import XlaFlags, closest_xla_flags
from disco_xla.settings import DEFAULTS, OptimizeSettings, settings_declared


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    optimize = commands.add_parser(
        "optimize", parents=[common], help="search for the plan with the lowest simulated time"
    )
    optimize.add_argument("file")
    optimize.add_argument(
        "--cluster",
        required=True,
        help="profile name or YAML path, either as NAME@NODESxDEVICES at another scale",
    )
    add_setting_options(optimize)
    add_xla_dump(optimize)
    optimize.add_argument("--cost-model", choices=COST_MODELS, default=DEFAULTS.cost_model)
    optimize.add_argument("--table", help="measured kernel times (JSON) for --cost-model table")
    optimize.add_argument(
        "-o",
        "--output",
        required=True,
        help="PLAN.json, or a module path (.pb, .txt, ...) to search and apply in one go",
    )
    optimize.add_argument(
        "--measure",
        action="store_true",
        help="with -o PLAN.json: time the candidates on this machine as -o MODULE does, "
        "and write the plan of the fastest that computes the same",
    )
    optimize.add_argument(
        "--xla-flags",
        action="store_true",
        help="also print the XLA_FLAGS closest to the found plan (combine thresholds, the "
        "latency-hiding scheduler) and the simulated time of the program they give",
    )
    optimize.add_argument("--report", help="write an HTML report here")
    optimize.add_argument("--json", action="store_true")
    add_write_checks(optimize)
    optimize.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    _check_arguments(args)
    module = load_for_planning(args.file)
    settings = _settings(args)
    prices = pricing(module, settings, args.table)
    profile, cost_model = prices.profile, prices.cost_model
    use_devices(module)
    comparison = _search(args, module, settings, prices)
    best = comparison.found
    plan_path = args.output if args.output.endswith(".json") else args.output + ".plan.json"
    _write_plan(plan_path, best.plan)
    written = None
    writes_module = plan_path != args.output  # -o names a module: search and apply in one go
    if writes_module or args.measure:
        written = write_checked(module, best.plan, plan_path, args, comparison, writes_module)
        if written.plan is not None and written.plan != best.plan:
            # Measured faster than the search's first choice: its plan is the one kept.
            _write_plan(plan_path, written.plan)
    if args.report:
        note = comparison.fusion.note if comparison.fusion else ""
        write_report(args.report, module, profile, comparison.results, best.plan, note)
    report = {
        **comparison_summary(comparison),
        "cost_model": cost_model.name,
        "cluster": profile.name,
        "plan": plan_path,
    }
    if written is not None:
        report["measured"] = written.measured()
        report["written"] = written.written
    flags = _xla_flags(module, comparison, prices) if args.xla_flags else None
    if flags is not None:
        report["xla_flags"] = {
            "flags": flags.flags,
            "thresholds": flags.thresholds,
            "buckets": len(flags.buckets),
            "simulated_s": flags.simulated_s,
        }
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{module.name} on {profile.name}, cost model {cost_model.name}: "
        f"{best.evaluations} plans evaluated in {best.search_s:.1f} s; every plan below is "
        "simulated over the captured module"
    )
    if comparison.fusion is not None:
        print(f"baselines from {comparison.fusion.note}")
    print(format_table(comparison))
    if flags is not None:
        _print_flags(flags, comparison)
    print(f"wrote {plan_path}")
    if written is not None:
        print(written_line(args.output, written, "wrote" if writes_module else "measured for"))
        _print_candidates(written)
    return 0


def _check_arguments(args: argparse.Namespace) -> None:
    for name, setting in settings_declared().items():
        if setting.cli_option and setting.positive and getattr(args, name) <= 0:
            raise DiscoInputError("optimize", f"{setting.cli_option} must be positive")
    if args.alpha < 1:
        raise DiscoInputError("optimize", "--alpha must be at least 1")
    if args.measure and args.no_check:
        raise DiscoInputError("optimize", "--measure runs the candidates; --no-check does not")


def _settings(args: argparse.Namespace) -> OptimizeSettings:
    offered = {name for name, setting in settings_declared().items() if setting.cli_option}
    chosen = {name: getattr(args, name) for name in offered}
    return OptimizeSettings(cluster=args.cluster, cost_model=args.cost_model, **chosen)


def _search(args: argparse.Namespace, module, settings: OptimizeSettings, prices: Pricing):
    """The planning pipeline with both ablations, from XLA's fusion with its
    all-reduce combiner off (where every baseline starts), a progress bar per
    search on a terminal."""
    fusion = xla_fusion_of(module, compile_separately, load_dump(args.xla_dump))
    quiet = args.json or not sys.stderr.isatty()
    bars = []

    def on_search(label: str):
        bar = tqdm(total=args.max_evaluations, disable=quiet, desc=label, leave=False)
        bars.append(bar)

        def progress(evaluations: int, best_s: float) -> None:
            bar.update(evaluations - bar.n)
            bar.set_postfix_str(f"best {best_s * 1e3:.3f} ms")

        return progress

    try:
        return plan_module(
            module,
            settings,
            prices,
            fusion,
            ablations=True,
            keep=settings.candidates,
            on_search=on_search,
        )
    finally:
        for bar in bars:
            bar.close()


def _xla_flags(module, comparison, prices: Pricing) -> XlaFlags:
    """The XLA_FLAGS closest to the found plan, over XLA's fusion."""
    xla_fusion = comparison.baselines["xla-nocombine"].plan  # one all-reduce per gradient
    return closest_xla_flags(
        module, comparison.found.plan, xla_fusion, prices.profile, prices.cost_model
    )


def _print_flags(flags: XlaFlags, comparison) -> None:
    found_s = comparison.results["found"].iteration_s
    overlap_s = comparison.results["xla-overlap"].iteration_s
    print("XLA_FLAGS closest to the found plan (XLA's own fusion, its combiners at these")
    print(f"thresholds, {len(flags.buckets)} buckets):")
    print(f'  XLA_FLAGS="{flags.flags}"')
    print(
        f"  simulated {flags.simulated_s * 1e3:.3f} ms with these flags; found plan "
        f"{found_s * 1e3:.3f} ms; xla-overlap {overlap_s * 1e3:.3f} ms"
    )
    chunked = comparison.found.plan.chunked_collectives
    if chunked and flags.windowed_einsum_mib is None:
        print(
            f"  no flag splits collectives into chunks as the found plan does ({len(chunked)}): "
            "only its rewrite (-o) realises them"
        )
    elif chunked:
        print(
            f"  windowed einsum stands for the found plan's {len(chunked)} collectives in "
            "chunks; it splits each one a step a device"
        )


def _write_plan(path: str, plan) -> None:
    try:
        with open(path, "w") as file:
            file.write(plan.to_json())
    except OSError as error:
        raise DiscoInputError(path, f"cannot write it ({error.strerror})") from None


def _print_candidates(written) -> None:
    """Each measured candidate's times against XLA's own program, a line each."""
    if written.original_s is None:
        return
    print(f"  xla (XLA's own program)  measured {written.original_s * 1e3:.3f} ms")
    for label, entry in written.candidates.items():
        if "seconds" not in entry:
            why = entry.get("error") or f"the same program as the {entry.get('same_as')}"
            print(f"  {label:24s} {why}")
            continue
        simulated = entry.get("simulated_s")
        print(
            f"  {label:24s} measured {entry['seconds'] * 1e3:.3f} ms "
            f"({written.original_s / entry['seconds']:.2f}x XLA's speed)"
            + (f", simulated {simulated * 1e3:.3f} ms" if simulated is not None else "")
            + ("" if entry["equal"] else ", outputs differ")
        )
