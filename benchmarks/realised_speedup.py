"""Measured against simulated: the programs a plan turns into, against XLA's own.

For each model (captured as in `fusion_boundary_cost.py`: pmap over 4 CPU devices
in one process) it searches a plan (`search.optimize`, with XLA's own fusion
known), then runs, on the same random inputs, in paired rounds whose order
rotates (`runtime.candidate_timing.time_candidates`):

- `xla`: XLA's own program (all-reduce combiner on), the reference;
- `xla-nocombine`: the module compiled with the combiner off;
- `xla-fusion`: XLA's own fusion enforced through our rewrite (no call at all,
  since only departing groups are outlined);
- `found`: the found plan (its fusion departures and its buckets);
- `buckets`: the found plan's buckets alone.

It prints each one's measured median step time, its speed against `xla`, whether
its outputs equal `xla`'s, and the simulated iteration time of the same plan with
the profile of `--cluster` (`xla-fusion` simulates as `xla-nocombine`).

With `--processes 4` the same programs run on 4 `jax.distributed` processes on
loopback (gloo), one CPU device each: this process captures the modules (on 4
devices, as above) and launches 4 ranks (`runtime.launch`). Rank 0 searches the
plan and shares it; every rank runs every program with the same step counts;
outputs are equal only if they are on every rank; the times are rank 0's.
Use `--cluster cpu-local` there (the profile measured over gloo).

    .venv/bin/python benchmarks/realised_speedup.py [--models resnet50 gpt2_small ...]
        [--cluster cpu-local-inprocess] [--rounds 10] [--max-evals 300] [--json]
        [--processes 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
DEVICES = 4
PROGRAMS = ("xla-nocombine", "xla-fusion", "found", "buckets")


def measure(name: str, cluster: str, rounds: int, max_evaluations: int, module=None) -> dict:
    """One model's row; `module` is its captured step (else captured here)."""
    from fusion_boundary_cost import captured

    from disco_xla.driver.checked_rewrite import rewrite, xla_own_groups
    from disco_xla.plan import Plan, departing_groups
    from disco_xla.runtime.agreement import broadcast, gather
    from disco_xla.runtime.candidate_timing import time_candidates
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search import optimize
    from disco_xla.search.baselines import captured_baselines
    from disco_xla.simulator.cost_models import RooflineCostModel, boundary_charged
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    module = module if module is not None else captured(name)
    compiled = compile_module(module, NO_COMBINER)
    profile = load_profile(cluster)
    baselines = captured_baselines(module, compiled, profile, RooflineCostModel(profile))
    own = xla_own_groups(module)
    found = Plan.from_json(
        broadcast(
            f"realised_speedup/{name}/plan",
            lambda: optimize(
                module, cluster, max_evaluations=max_evaluations, compiled=compiled
            ).to_json(),
        )
    )
    own_plan = baselines["xla-nocombine"].plan
    candidates = {
        "xla-nocombine": module,
        "xla-fusion": rewrite(module, own_plan, source="xla fusion"),
        "found": rewrite(module, found, source="found plan"),
        "buckets": rewrite(module, found, fusion=False, source="found buckets"),
    }
    import jax

    xla_s, results = time_candidates(module, candidates, jax.device_count(), rounds, 0, ())
    # Over several processes each compared its own devices' outputs.
    verdicts = {
        label: gather(
            f"realised_speedup/{name}/{label}/equal",
            f"{int(r.outputs.equal)}{int(r.outputs.bit_equal)}",
        )
        for label, r in results.items()
    }
    model = boundary_charged(RooflineCostModel(profile), profile, own)

    def simulated_s(plan_graph) -> float:
        return simulate(plan_graph, profile, model).iteration_s

    plans = {"xla-nocombine": own_plan, "xla-fusion": own_plan, "found": found}
    simulated = {label: simulated_s(build_task_graph(module, p)) for label, p in plans.items()}
    buckets_plan = dataclasses.replace(own_plan, all_reduce_buckets=found.all_reduce_buckets)
    simulated["buckets"] = simulated_s(build_task_graph(module, buckets_plan))
    simulated["xla"] = simulated_s(baselines["xla"].task_graph())
    row = {
        "model": name,
        "cluster": cluster,
        "processes": jax.process_count(),
        "found_buckets": len(found.all_reduce_buckets),
        "found_departing_groups": len(departing_groups(module, found, own)),
        "xla": {"measured_s": xla_s, "simulated_s": simulated["xla"]},
    }
    for label in PROGRAMS:
        result = results[label]
        row[label] = {
            "measured_s": result.seconds,
            "speed_vs_xla": xla_s / result.seconds,
            "equal": all(v[0] == "1" for v in verdicts[label]),
            "bit_equal": all(v[1] == "1" for v in verdicts[label]),
            "simulated_s": simulated[label],
            "simulated_speed_vs_xla": simulated["xla"] / simulated[label],
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "gpt2_small"])
    parser.add_argument("--cluster", default="cpu-local-inprocess")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-evals", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(name.startswith("keras:") for name in args.models):
        os.environ["KERAS_BACKEND"] = "jax"
    if args.worker:
        _worker(args)
        return
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    if args.processes > 1:
        rows = _on_processes(args)
    else:
        rows = [measure(n, args.cluster, args.rounds, args.max_evals) for n in args.models]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(
        f"{'model':20s} {'program':14s} {'measured ms':>12s} {'vs xla':>7s} "
        f"{'simulated ms':>13s} {'vs xla':>7s}  outputs"
    )
    for row in rows:
        xla = row["xla"]
        print(
            f"{row['model']:20s} {'xla':14s} {xla['measured_s'] * 1e3:12.3f} {1:7.2f} "
            f"{xla['simulated_s'] * 1e3:13.3f} {1:7.2f}  reference"
        )
        for label in PROGRAMS:
            cell = row[label]
            equal = "bit-equal" if cell["bit_equal"] else ("equal" if cell["equal"] else "DIFFER")
            print(
                f"{'':20s} {label:14s} {cell['measured_s'] * 1e3:12.3f} "
                f"{cell['speed_vs_xla']:7.2f} {cell['simulated_s'] * 1e3:13.3f} "
                f"{cell['simulated_speed_vs_xla']:7.2f}  {equal}"
            )
        print(
            f"{'':20s} found plan: {row['found_buckets']} buckets, "
            f"{row['found_departing_groups']} groups departing from XLA's fusion"
        )


def _on_processes(args) -> list[dict]:
    """Capture here, measure on `args.processes` ranks; rank 0 writes the rows."""
    from fusion_boundary_cost import captured
    from on_processes import rows_on_processes

    if args.processes != DEVICES:
        raise SystemExit(f"--processes: the modules are captured for {DEVICES} devices")
    forwarded = ["--cluster", args.cluster, "--rounds", str(args.rounds)]
    forwarded += ["--max-evals", str(args.max_evals)]
    return rows_on_processes(__file__, args.models, captured, forwarded, args.processes)


def _worker(args) -> None:
    """One rank: measure each saved module; rank 0 writes rows.json."""
    from on_processes import worker_rows

    worker_rows(
        args.worker,
        args.models,
        lambda name, module: measure(name, args.cluster, args.rounds, args.max_evals, module),
    )


if __name__ == "__main__":
    main()
