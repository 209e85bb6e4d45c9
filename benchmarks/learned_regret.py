"""Learning from a measured run: does a second search, after one measured run on
this machine, choose better than the first? (issue 16, item 3)

For each model (captured as in `fusion_boundary_cost.py` for 4 CPU devices):

1. the first search: `planning.find_plan` with an empty plan cache (the roofline,
   the profile's boundary charge);
2. one measured run, as a first call of `disco_xla.jit` makes it: the search's
   candidates (its best plans, the best baseline) and XLA's own program timed
   together on the same inputs in rotating rounds; their step times go to the
   plan cache (`planning.remember_measurement`), from which the next search
   fits what each collective, and each tensor of a tuple all-reduce, costs in a
   step here (`simulator.step_time_fit`). In one process (--repeats > 0) the kernels of the
   first plan and of XLA's own fusion are also timed under the profiler and kept
   (`planning.learn_kernel_times`, by structural hash);
3. the second search: `find_plan` again, which now prices each collective and
   tuple tensor at the learned costs and trusts the measured kernel times;
4. every candidate program of `rank_fidelity.py` (baselines, the first plan, its
   buckets alone, sampled plans) and the second plan, measured together in
   rotating rounds (`runtime.candidate_timing.time_candidates`), and simulated once as the
   first search saw them and once with what was learned.

It prints each search's regret (its plan's measured time over the fastest
program's, minus one) and the simulator's Kendall τ and top-1 regret over the
programs, before and after learning. The fastest program is the fastest of
those that compute XLA's results (the others are refused by every entry point).
Target (issue 16): the second search's regret below the first's.

With --processes 4 every step runs on 4 `jax.distributed` processes on loopback
(gloo), one CPU device each; rank 0 searches and shares the plans. Use --cluster
cpu-local there; kernels are not profiled (--repeats is ignored).

    .venv/bin/python benchmarks/learned_regret.py [--models resnet50 gpt2_small ...]
        [--cluster cpu-local-inprocess] [--plans 8] [--rounds 7] [--max-evals 300]
        [--repeats 5] [--processes 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
DEVICES = 4


def learned_times(module, plans: dict, repeats: int) -> dict[str, float]:
    """{structural hash: median seconds} of the groups of `plans` (label ->
    plan), each plan's groups timed under the profiler."""
    from disco_xla.profiling.sample_plans import measure_plan

    samples: dict[str, list[float]] = {}
    for label, plan in plans.items():
        for sample in measure_plan(module, plan, label, module.name, module.name, repeats):
            if sample.time_s > 0:
                samples.setdefault(sample.structural_hash, []).append(sample.time_s)
    return {kernel: statistics.median(times) for kernel, times in samples.items()}


def simulated_times(module, plans: dict, profile, table: dict | None, xla_graph) -> dict:
    """Each plan's simulated step time (the roofline, or `table` first), and
    XLA's own program's under 'xla'."""
    from disco_xla.driver.checked_rewrite import xla_own_groups
    from disco_xla.simulator.cost_models import (
        RooflineCostModel,
        TableCostModel,
        boundary_charged,
    )
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph

    model = RooflineCostModel(profile)
    if table:
        model = TableCostModel(table, fallback=model)
    model = boundary_charged(model, profile, xla_own_groups(module))
    seconds = {
        label: simulate(build_task_graph(module, plan), profile, model).iteration_s
        for label, plan in plans.items()
    }
    seconds["xla"] = simulate(xla_graph, profile, model).iteration_s
    return seconds


def measure(name: str, args, module=None) -> dict:
    """One model's row; `module` is its captured step (else captured here)."""
    import dataclasses

    import jax
    from fusion_boundary_cost import captured
    from rank_fidelity import candidate_plans, distinct_programs

    from disco_xla.driver.plan_cache import CandidateRecord
    from disco_xla.driver.planning import PlanChoice, find_plan, learn_kernel_times
    from disco_xla.plan import Plan
    from disco_xla.runtime.agreement import broadcast
    from disco_xla.runtime.candidate_timing import time_candidates
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module, compile_separately
    from disco_xla.search.baselines import captured_baselines
    from disco_xla.search.ranking import rank_fidelity
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.profiles import load_profile

    module = module if module is not None else captured(name)
    profile = load_profile(args.cluster)
    baselines = captured_baselines(
        module, compile_module(module, NO_COMBINER), profile, RooflineCostModel(profile)
    )
    in_process = jax.process_count() == 1
    cache_dir = tempfile.mkdtemp(prefix="learned_regret_")  # rank 0's is the one used
    settings = OptimizeSettings(
        cluster=args.cluster, max_evaluations=args.max_evals, budget_s=1e9, cache_dir=cache_dir
    )
    topic = f"learned_regret/{name}"

    def first_search() -> str:
        choice = find_plan(module, settings, compile_separately)
        return json.dumps({"key": choice.cache_key, "record": choice.candidates.to_json()})

    shared = json.loads(broadcast(f"{topic}/first", first_search))
    record = CandidateRecord.from_json(shared["record"], topic)
    choice = PlanChoice(record.plans["plan"], False, 0.0, record, shared["key"])
    first = choice.plan
    # The measured run: what a first call of disco_xla.jit times.
    run_programs, _, _ = distinct_programs(module, dict(record.plans), len(record.plans))
    original_s, run = time_candidates(module, run_programs, jax.device_count(), args.rounds, 0, ())
    run_s = {label: result.seconds for label, result in run.items()}
    run_s["original"] = original_s

    def second_search() -> str:
        from disco_xla.driver.planning import remember_measurement

        fastest = min(run_s, key=run_s.__getitem__)
        remember_measurement(choice, settings, fastest, run_s)
        table = {}
        if in_process and args.repeats > 0:
            measured_run = {"first": first, "xla-nocombine": baselines["xla-nocombine"].plan}
            table = learned_times(module, measured_run, args.repeats)
            learn_kernel_times(settings, table)
        second = find_plan(module, settings, compile_separately, keep_measured_choice=False)
        return json.dumps(
            {
                "plan": second.plan.to_json(),
                "message_s": second.candidates.message_s,
                "tuple_element_s": second.candidates.tuple_element_s,
                "table": table,
            }
        )

    learned = json.loads(broadcast(f"{topic}/second", second_search))
    second = Plan.from_json(learned["plan"], topic)
    table, message_s = learned["table"], learned["message_s"]
    tuple_element_s = learned["tuple_element_s"]
    plans = candidate_plans(module, baselines, first, args.plans)
    plans = {"first": plans.pop("found"), "second": second, **plans}
    plans = {
        label: Plan.from_json(text, label)
        for label, text in json.loads(
            broadcast(
                f"{topic}/plans",
                lambda: json.dumps({label: plan.to_json() for label, plan in plans.items()}),
            )
        ).items()
    }
    programs, plans, left_out = distinct_programs(module, plans, args.plans)
    xla_s, results = time_candidates(module, programs, jax.device_count(), args.rounds, 0, ())
    measured = {label: result.seconds for label, result in results.items()}
    measured["xla"] = xla_s
    xla_graph = baselines["xla"].task_graph()
    before = simulated_times(module, plans, profile, None, xla_graph)
    taught = dataclasses.replace(
        profile, collective_message_s=message_s, tuple_all_reduce_element_s=tuple_element_s
    )
    after = simulated_times(module, plans, taught, table, xla_graph)
    # A program whose outputs differ from XLA's is refused by every entry
    # point, so the fastest that a user could be given is the yardstick.
    equal = {label: bool(result.outputs.equal) for label, result in results.items()}
    fastest_s = min(s for label, s in measured.items() if label == "xla" or equal[label])
    same_as = {label: why.removeprefix("the same program as ") for label, why in left_out.items()}
    regret = {
        search: measured[same_as.get(search, search)] / fastest_s - 1
        for search in ("first", "second")
    }
    return {
        "model": name,
        "cluster": args.cluster,
        "processes": jax.process_count(),
        "learned_kernels": len(table),
        "learned_message_s": message_s,
        "learned_tuple_element_s": tuple_element_s,
        "measured_run_s": run_s,
        "first_search_regret": regret["first"],
        "second_search_regret": regret["second"],
        "second_same_as": same_as.get("second"),
        "before": _fidelity(rank_fidelity(before, measured)),
        "after": _fidelity(rank_fidelity(after, measured)),
        "equal": equal,
        "left_out": left_out,
        "measured_s": measured,
        "simulated_before_s": before,
        "simulated_after_s": after,
    }


def _fidelity(fidelity) -> dict:
    return {
        "kendall_tau": fidelity.kendall_tau,
        "top1_regret": fidelity.top1_regret,
        "simulator_choice": fidelity.simulator_choice,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "gpt2_small"])
    parser.add_argument("--cluster", default="cpu-local-inprocess")
    parser.add_argument("--plans", type=int, default=8, help="distinct programs, at least")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-evals", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5, help="profiled steps per plan")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(name.startswith("keras:") for name in args.models):
        os.environ["KERAS_BACKEND"] = "jax"
    from on_processes import rows_for_args

    rows = rows_for_args(__file__, args, DEVICES, measure)
    if rows is None:  # a worker rank: rank 0 of the launcher writes the rows
        return
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print(
            f"{row['model']} ({row['processes']} process(es); {row['learned_kernels']} kernels "
            f"learned, {row['learned_message_s'] * 1e6:.1f} us a collective, "
            f"{row['learned_tuple_element_s'] * 1e6:.1f} us a tuple tensor): search regret "
            f"{row['first_search_regret']:.1%} first, {row['second_search_regret']:.1%} second"
            + (f" (the same program as {row['second_same_as']})" if row["second_same_as"] else "")
        )
        for when in ("before", "after"):
            figures = row[when]
            print(
                f"  simulator {when} learning: tau {figures['kendall_tau']:.2f}, top-1 regret "
                f"{figures['top1_regret']:.1%} (chose {figures['simulator_choice']})"
            )


if __name__ == "__main__":
    main()
