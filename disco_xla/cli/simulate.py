"""`disco-xla simulate FILE`: simulate one training iteration of a plan."""

from __future__ import annotations

import argparse
import json

from disco_xla.cli.shared import add_xla_dump, load_dump, load_for_planning, load_plan, use_devices
from disco_xla.errors import DiscoInputError
from disco_xla.plan import verify_plan
from disco_xla.runtime.xla_runner import compile_module, compile_separately
from disco_xla.search.baselines import BASELINES, baseline, captured_baselines
from disco_xla.search.fusion_source import compiled_or_why, dumped_fusion, modelled_fusion
from disco_xla.settings import DEFAULTS
from disco_xla.simulator.cost_models import COST_MODELS as COST_MODEL_NAMES
from disco_xla.simulator.cost_models import TableCostModel, make_cost_model
from disco_xla.simulator.events import simulate
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.simulator.trace import chrome_trace, plot_gantt

COST_MODELS = list(COST_MODEL_NAMES)


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    simulate = commands.add_parser(
        "simulate", parents=[common], help="simulate one training iteration of a plan"
    )
    simulate.add_argument("file", help="HLO module of a data-parallel training step")
    simulate.add_argument(
        "--cluster",
        required=True,
        help="profile name or YAML path, either as NAME@NODESxDEVICES at another scale",
    )
    simulate.add_argument(
        "--plan",
        action="append",
        metavar="PLAN",
        help="a baseline (none, xla, xla-overlap, xla-tuned, xla-nocombine, horovod, "
        "horovod-legacy, ddp, mgwfbp, fsdp; maxtext on H100 profiles of 1 to 128 nodes) "
        "or a PLAN.json; default none. Repeat it to "
        "simulate several plans in one run (the module is compiled once for all baselines)",
    )
    add_xla_dump(simulate)
    simulate.add_argument("--cost-model", choices=COST_MODELS, default=DEFAULTS.cost_model)
    simulate.add_argument("--table", help="measured kernel times (JSON) for --cost-model table")
    simulate.add_argument(
        "--json", action="store_true", help="print one JSON object per plan, one per line"
    )
    simulate.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here (one plan)")
    simulate.add_argument("--plot", help="write a PNG Gantt chart here (every plan, one row each)")
    simulate.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    names = args.plan or ["none"]
    if args.trace and len(names) > 1:
        raise DiscoInputError(args.trace, f"--trace writes one plan's trace, not {len(names)}")
    module = load_for_planning(args.file)
    profile = load_profile(args.cluster, module.worker_count())
    cost_model = make_cost_model(args.cost_model, profile, args.table)
    results = {}
    for name in names:
        simulated_module, summary, result = _simulate_plan(
            name, module, profile, cost_model, load_dump(args.xla_dump)
        )
        results[name] = result
        if args.json:
            print(json.dumps(summary), flush=True)
        else:
            _print_result(name, simulated_module, profile, summary, result)
    if args.trace:
        with open(args.trace, "w") as file:
            json.dump(chrome_trace(results[names[0]]), file)
    if args.plot:
        plot_gantt(results, args.plot)
    return 0


def _simulate_plan(name: str, module, profile, cost_model, dump=None):
    """Simulate the plan `name` (a baseline or a PLAN.json) on `module`: the
    module it runs on, its summary, and the simulation. XLA's compiles of
    `module` are made once for every baseline (`compile_module` remembers them)."""
    note = ""
    if name in (*BASELINES, "maxtext"):
        chosen = _baseline(name, module, profile, cost_model, dump)
        module, plan, note = chosen.module, chosen.plan, chosen.note
        task_graph = chosen.task_graph  # run as the baseline runs (tuples, blocking)
    else:
        plan = load_plan(name)

        def task_graph():
            return build_task_graph(module, plan)

    verify_plan(plan, module, source=name)
    misses_before = getattr(cost_model, "misses", 0)
    result = simulate(task_graph(), profile, cost_model)
    summary = {"plan": name, "plan_note": note, "cluster": profile.name, **result.summary()}
    if isinstance(cost_model, TableCostModel):
        summary["table_misses"] = cost_model.misses - misses_before  # this plan's alone
    return module, summary, result


def _baseline(name: str, module, profile, cost_model, dump):
    """The baseline `name` over the modules XLA compiles here (combiner on and
    off); with XLA's `dump`, or where the module does not compile here, over the
    module itself with XLA's fusion from the dump or modelled (`fusion_source`)."""
    if name == "none":
        return baseline(name, module, None, None, profile, cost_model)
    use_devices(module)
    if dump is not None:
        fusion = dumped_fusion(module, dump)
        return captured_baselines(module, fusion, profile, cost_model, (name,))[name]
    separate, why = compiled_or_why(module, compile_separately)
    if separate is None:
        fusion = modelled_fusion(module, why)
        return captured_baselines(module, fusion, profile, cost_model, (name,))[name]
    return baseline(name, module, compile_module(module), separate, profile, cost_model)


def _print_result(plan_name: str, module, profile, summary: dict, result) -> None:
    """The simulated iteration as text: times, busy and exposed, and the critical path."""
    milli = 1e3
    print(
        f"{module.name} on {profile.name} ({profile.workers} workers, {summary['execution']}), "
        f"plan {plan_name}, cost model {summary['cost_model']}"
    )
    print(
        f"  iteration      {result.iteration_s * milli:.3f} ms  "
        f"(T/T_ideal {result.t_over_ideal:.2f}, ideal {result.ideal_s * milli:.3f} ms)"
    )
    print(f"  compute busy   {result.compute_s * milli:.3f} ms in {result.kernels} kernels")
    print(
        f"  comm busy      {result.comm_s * milli:.3f} ms in {result.buckets} buckets"
        f"{_others(result.collectives - result.buckets)}, "
        f"{result.exposed_comm_s * milli:.3f} ms exposed ({result.overlap_ratio:.0%} overlapped)"
    )
    print(f"  critical path  {' -> '.join(result.critical_path[-6:])}")
    if summary["plan_note"]:
        print(f"  plan           {summary['plan_note']}")


def _others(count: int) -> str:
    """' and N other collectives' when there are any."""
    if not count:
        return ""
    return f" and {count} other collective{'s' if count != 1 else ''}"
