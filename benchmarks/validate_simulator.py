"""Simulated against measured step times, on this machine (issue 4's validation).

For each zoo training step (`jit(shard_map)`, one CPU device per worker) and each
plan, we compile the step, run it, take the median step time, profile its kernels,
and simulate the same compiled program with a table cost model built from those
kernel times and the cluster profile of the runtime it ran on. The plans:

- `none`: XLA's fusion and all-reduce combiner off (one all-reduce per gradient);
- `xla`: XLA as it compiles the step (one combined, tuple all-reduce at the end);
- `buckets`: a hand-picked bucketing, the gradients in program order cut into
  three concatenated all-reduces (disco-xla's rewrite, XLA's fusion kept).

Two runtimes:

    # 4 CPU devices in one process (profile cpu-local-inprocess)
    .venv/bin/python benchmarks/validate_simulator.py
    # 2 jax.distributed processes, gloo on loopback (profile cpu-local)
    disco-xla launch -n 2 benchmarks/validate_simulator.py

Timing is paired and rotating over the three plans of a step (every rank in the
same order, each step blocked on). Target (issue 4): within 10% on every case.
Options: --model NAME (repeatable), --size tiny|medium, --rounds N, --cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

IN_PROCESS_DEVICES = 2
PLANS = ("none", "xla", "buckets")
BUCKETS = 3
NO_FUSION_NO_COMBINER = {"xla_disable_hlo_passes": "cpu-all-reduce-combiner,fusion"}


def _executable_module(executable):
    from disco_xla.hlo_passes.graph import HloModule

    data = executable.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
    return HloModule.from_bytes(data, "<compiled>")


def _bucket_plan(module):
    """The gradients in program order, cut into BUCKETS runs of equal count."""
    import dataclasses

    from disco_xla.plan import Plan, gradient_all_reduces_in_order
    from disco_xla.search.baselines import legal_buckets

    names = [a.name for a in gradient_all_reduces_in_order(module)]
    size = -(-len(names) // BUCKETS)
    buckets = [tuple(names[i : i + size]) for i in range(0, len(names), size)]
    return dataclasses.replace(
        Plan.unfused(module), all_reduce_buckets=legal_buckets(module, buckets)
    )


def _programs(step, arguments):
    """{plan: (run, compiled module)} of one step."""
    import jax

    from disco_xla.hlo_passes.graph import HloModule
    from disco_xla.planning import prepared
    from disco_xla.runtime.apply import NO_COMBINER, apply_plan
    from disco_xla.runtime.jax_program import kept_arguments, standing_in_for

    lowered = step.fn.lower(*arguments)
    xla = lowered.compile()
    none = lowered.compile(compiler_options=NO_FUSION_NO_COMBINER)
    module = prepared(
        HloModule.from_bytes(
            lowered.compiler_ir("hlo").as_serialized_hlo_module_proto(), "<step>", "memory"
        )
    )
    rewritten = apply_plan(module, _bucket_plan(module), "buckets", fusion=False, check=False)
    all_leaves = jax.tree_util.tree_leaves(arguments)
    leaves = [all_leaves[i] for i in kept_arguments(lowered)]
    buckets = standing_in_for(rewritten, lowered, xla, NO_COMBINER)
    return {
        "none": (lambda: none(*arguments), _executable_module(none)),
        "xla": (lambda: xla(*arguments), _executable_module(xla)),
        "buckets": (lambda: buckets(leaves), buckets.compiled_module()),
    }


def _arguments(step, mesh):
    from measure_speedup import _global_arguments

    from disco_xla.zoo.jax_steps import AXIS

    return _global_arguments(step, mesh, AXIS)


def validate_model(name: str, size: str, workers: int, args, profile) -> list[dict]:
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from measure_speedup import _local_leaves, _time_paired, _zoo_size

    from disco_xla.plan import Plan
    from disco_xla.profiling.kernel_times import kernel_time_table, profile_kernel_times
    from disco_xla.runtime.apply import compare_outputs
    from disco_xla.simulator.cost_models import RooflineCostModel, TableCostModel
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.zoo.jax_steps import AXIS, build_jax_step

    with _zoo_size(name, size) as zoo_size:
        step = build_jax_step(name, zoo_size, workers, args.batch_per_worker * workers, "shard_map")
    mesh = Mesh(np.array(jax.devices()[:workers]), (AXIS,))
    programs = _programs(step, _arguments(step, mesh))
    # The three programs compute the same step: check it, on this worker's shards.
    outputs = {p: _local_leaves(run()) for p, (run, _) in programs.items()}
    equal = {p: compare_outputs(outputs["xla"], got).equal for p, got in outputs.items()}
    del outputs
    load = os.getloadavg()[0]
    times = _time_paired({p: run for p, (run, _) in programs.items()}, args.rounds, warmup=2)
    rows = []
    for plan_name, (run, compiled) in programs.items():
        table = kernel_time_table(compiled, profile_kernel_times(run, repeats=args.profile_runs))
        cost_model = TableCostModel(table, RooflineCostModel(profile))
        graph = build_task_graph(compiled, Plan.unfused(compiled))
        result = simulate(graph, profile, cost_model)
        measured_s = statistics.median(times[plan_name])
        rows.append(
            {
                "step": f"{name} ({size})",
                "plan": plan_name,
                "measured_ms": measured_s * 1e3,
                "simulated_ms": result.iteration_s * 1e3,
                "error": result.iteration_s / measured_s - 1,
                "kernels": len(graph.kernels),
                "all_reduces": result.collectives,
                "equal_to_xla": equal[plan_name],
                "table_misses": cost_model.misses,
                "load": load,
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="zoo model (repeatable)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "medium"))
    parser.add_argument("--cluster", help="profile (default: the runtime's own)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--profile-runs", type=int, default=5)
    parser.add_argument("--batch-per-worker", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import jax

    from disco_xla.runtime.launch import RANK_VARIABLE

    distributed = RANK_VARIABLE in os.environ  # run by `disco-xla launch`
    if not distributed:
        jax.config.update("jax_num_cpu_devices", IN_PROCESS_DEVICES)
    from disco_xla.simulator.profiles import load_profile

    workers = jax.process_count() if distributed else IN_PROCESS_DEVICES
    cluster = args.cluster or ("cpu-local" if distributed else "cpu-local-inprocess")
    profile = load_profile(cluster)
    rows = []
    for name in args.model or ["vgg19", "resnet50", "gpt2_small"]:
        rows += validate_model(name, args.size, workers, args, profile)
    if jax.process_index() != 0:
        return 0
    runtime = f"{workers} gloo processes" if distributed else f"{workers} devices, one process"
    summary = {
        "runtime": runtime,
        "cluster": cluster,
        "within_10_percent": sum(abs(r["error"]) <= 0.10 for r in rows),
        "all_equal_to_xla": all(r["equal_to_xla"] for r in rows),
        "cases": len(rows),
    }
    if args.json:
        print(json.dumps({**summary, "rows": rows}))
        return 0
    print(f"runtime: {runtime}; profile {cluster}")
    print("| step | plan | measured ms | simulated ms | error | kernels | all-reduces | load |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['step']} | {row['plan']} | {row['measured_ms']:.2f} | "
            f"{row['simulated_ms']:.2f} | {row['error']:+.0%} | {row['kernels']} | "
            f"{row['all_reduces']} | {row['load']:.1f} |"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
