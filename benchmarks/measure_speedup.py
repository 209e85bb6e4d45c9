"""Measured speed-up of disco-xla's plan over XLA's, on `jax.distributed` processes.

Run it under a launcher, one process per rank (one CPU device each):

    disco-xla launch -n 4 benchmarks/measure_speedup.py --model bert_base --size medium \
        [--model gpt2_small ...] [--rounds 10] [--cluster cpu-local] [--json]
    .venv/bin/python benchmarks/testbed_launch.py benchmarks/measure_speedup.py ...
        (2 processes in the network namespaces of `benchmarks/testbed.sh up`)

For each model it builds three programs from the same zoo training step
(`build_jax_step(..., mode='shard_map')` over every process's device):

- `xla`: the jitted step as XLA compiles it (its all-reduce combiner on: one
  combined all-reduce after the last gradient);
- `xla-nocombine`: the same lowered module compiled with `cpu-all-reduce-combiner`
  disabled for that compile only (one all-reduce per gradient, XLA's fusion);
- `disco`: `disco_xla.jit(step, cluster=...)`, which searches a plan (on rank 0),
  rewrites the module, and checks its outputs against the original's.

It checks that the three compute the same outputs (`runtime.output_comparison.compare_outputs`),
then times them paired and rotating: in round r the order is rotated by r, every
rank runs the same order, and each step is blocked on before the next starts.
It reports the median step time of each, the ratio of medians, and the median of
the per-round (paired) ratios. Beside them it prints the simulator's predicted
iteration time of the same three plans over the captured module (`xla` and
`xla-nocombine` as `search.baselines.captured_baselines` builds them, `disco` the
plan the run used), with the cluster profile of `--cluster`.

Rank 0 prints the result: a table, or one JSON object with `--json`.

`--size medium` is a benchmark-only size for the transformers, between the zoo's
`tiny` (tests) and `full` (too slow for 2 cores): see MEDIUM_CONFIGS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

PROGRAMS = ("xla", "xla-nocombine", "disco")


def _medium_configs() -> dict:
    """Transformer sizes whose step takes tens of milliseconds on this machine and
    whose gradients take comparable time to all-reduce over loopback gloo:
    (vocabulary, hidden, layers, heads, feed-forward, positions, sequence)."""
    from disco_xla.zoo import transformers as tr

    return {
        "bert_base": tr.TransformerConfig(2048, 256, 4, 4, 1024, 128, 64),
        "bert_large": tr.TransformerConfig(2048, 320, 6, 5, 1280, 128, 64),
        "transformer_base": tr.TransformerConfig(2048, 256, 3, 4, 1024, 0, 64),
        "gpt2_small": tr.TransformerConfig(2048, 256, 4, 4, 1024, 128, 64),
    }


@contextlib.contextmanager
def _zoo_size(name: str, size: str):
    """`build_jax_step` takes 'tiny' or 'full'; for 'medium' its tiny slot holds
    the medium configuration while the step is built."""
    if size != "medium":
        yield size
        return
    from disco_xla.zoo import jax_steps

    medium = _medium_configs()
    if name not in medium:
        raise SystemExit(f"--size medium exists for {sorted(medium)}, not {name}")
    saved = jax_steps._TRANSFORMERS[name]
    build, make_batch, full, _ = saved
    jax_steps._TRANSFORMERS[name] = (build, make_batch, full, medium[name])
    try:
        yield "tiny"
    finally:
        jax_steps._TRANSFORMERS[name] = saved


def _global_arguments(step, mesh, batch_axis: str):
    """The step's arguments as global arrays: parameters, state and optimizer state
    replicated, the batch split over the processes along its first axis."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    replicated = NamedSharding(mesh, P())
    split = NamedSharding(mesh, P(batch_axis))
    rank, processes = jax.process_index(), jax.process_count()
    params, state, opt_state, batch = step.args

    def replicate(x):
        return jax.make_array_from_process_local_data(replicated, np.asarray(x))

    def local_rows(x):
        x = np.asarray(x)
        rows = x.shape[0] // processes
        return jax.make_array_from_process_local_data(
            split, x[rank * rows : (rank + 1) * rows], x.shape
        )

    return (
        *jax.tree_util.tree_map(replicate, (params, state, opt_state)),
        jax.tree_util.tree_map(local_rows, batch),
    )


def _local_leaves(tree) -> list[np.ndarray]:
    import jax

    return [
        np.asarray(shard.data)
        for leaf in jax.tree_util.tree_leaves(tree)
        for shard in leaf.addressable_shards
    ]


def _differing(expected: list, got: list, step_args) -> list[str]:
    """Where this process's outputs differ by more than 1e-3 of their own scale,
    named by the argument path at the same position (the step returns its
    parameters, state and optimizer state in the order it takes them)."""
    import jax

    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(step_args)[0]]
    return [
        paths[i] if i < len(paths) else f"output {i}"
        for i, (a, b) in enumerate(zip(expected, got, strict=True))
        if a.size
        and float(np.max(np.abs(a.astype(np.float64) - b))) > 1e-3 * float(np.max(np.abs(a)))
    ]


def _time_paired(
    programs: dict, rounds: int, warmup: int, warm_step: bool = False
) -> dict[str, list[float]]:
    """Step times of each program, paired and rotating: round r runs the programs
    in their order rotated by r; each step is blocked on before the next starts.
    With `warm_step`, each timed step follows an untimed step of the same program,
    as in a training loop (a step that follows another program's finds its buffers
    out of cache)."""
    import jax

    names = list(programs)
    for _ in range(warmup):
        for name in names:
            jax.block_until_ready(programs[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            if warm_step:
                jax.block_until_ready(programs[name]())
            started = time.perf_counter()
            jax.block_until_ready(programs[name]())
            times[name].append(time.perf_counter() - started)
    return times


def _predictions(lowered, plan, cluster: str, cost_model_name: str) -> dict:
    """Simulated iteration time of the three plans over the captured module."""
    from disco_xla.driver.planning import prepared
    from disco_xla.hlo.graph import HloModule
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search.baselines import captured_baselines
    from disco_xla.simulator.cost_models import make_cost_model
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    data = lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()
    module = prepared(HloModule.from_bytes(data, "<measure_speedup>", "memory"))
    profile = load_profile(cluster)
    cost_model = make_cost_model(cost_model_name, profile, None)
    baselines = captured_baselines(module, compile_module(module, NO_COMBINER), profile, cost_model)
    graphs = {name: baselines[name].task_graph() for name in ("xla", "xla-nocombine")}
    if plan is not None:
        graphs["disco"] = build_task_graph(module, plan)

    def run(graph, ideal=None):
        return simulate(graph, profile, cost_model, ideal_compute_s=ideal)

    compute_s = run(graphs["xla-nocombine"]).compute_s
    results = {name: run(graph, compute_s) for name, graph in graphs.items()}
    return {
        "profile": profile.name,
        "workers": profile.workers,
        "iteration_s": {name: r.iteration_s for name, r in results.items()},
        "exposed_comm_s": {name: r.exposed_comm_s for name, r in results.items()},
        "buckets": {name: r.buckets for name, r in results.items()},
        "ideal_s": results["xla-nocombine"].ideal_s,
    }


def _ratios(times: dict[str, list[float]]) -> dict:
    """Speed-ups of `disco` (and of `xla-nocombine` over `xla`): ratio of medians
    and median of per-round ratios."""
    median = {name: statistics.median(values) for name, values in times.items()}

    def paired(slow: str, fast: str) -> float:
        return statistics.median(a / b for a, b in zip(times[slow], times[fast], strict=True))

    pairs = {
        "disco_vs_xla": ("xla", "disco"),
        "disco_vs_xla_nocombine": ("xla-nocombine", "disco"),
        "nocombine_vs_xla": ("xla", "xla-nocombine"),
    }
    return {
        "median_s": median,
        "speedup": {key: median[slow] / median[fast] for key, (slow, fast) in pairs.items()},
        "paired_speedup": {key: paired(slow, fast) for key, (slow, fast) in pairs.items()},
    }


def measure_model(name: str, args: argparse.Namespace, cache_dir: str) -> dict:
    """Build, check and time the three programs of one zoo model."""
    import jax
    from jax.sharding import Mesh

    import disco_xla
    from disco_xla.runtime.output_comparison import compare_outputs
    from disco_xla.runtime.xla_runner import ALL_REDUCE_COMBINER
    from disco_xla.zoo.jax_steps import AXIS, build_jax_step

    processes = jax.process_count()
    global_batch = args.batch_per_process * processes
    with _zoo_size(name, args.size) as zoo_size:
        step = build_jax_step(name, zoo_size, processes, global_batch, mode="shard_map")
    mesh = Mesh(np.array(jax.devices()), (AXIS,))
    arguments = _global_arguments(step, mesh, AXIS)

    started = time.perf_counter()
    lowered = step.fn.lower(*arguments)
    xla = lowered.compile()
    nocombine = lowered.compile(compiler_options={"xla_disable_hlo_passes": ALL_REDUCE_COMBINER})
    optimized = disco_xla.jit(
        step.fn,
        cluster=args.cluster,
        budget_s=args.budget_s,
        max_evaluations=args.max_evaluations,
        cost_model=args.cost_model,
        cache_dir=cache_dir,
        background=False,  # the first call's trial decides; its programs are timed here
    )
    # The first call searches, rewrites and checks, and returns the original's
    # result; the second runs the program disco-xla chose, which is compared here.
    jax.block_until_ready(optimized(*arguments))
    prepare_s = time.perf_counter() - started
    outputs = {
        "xla": xla(*arguments),
        "xla-nocombine": nocombine(*arguments),
        "disco": optimized(*arguments),
    }
    expected = _local_leaves(outputs["xla"])
    equal = {}
    for other in ("xla-nocombine", "disco"):
        got = _local_leaves(outputs[other])
        verdict = compare_outputs(expected, got)
        equal[other] = {
            "equal": verdict.equal,
            "max_rel_diff": verdict.max_rel_diff,
            "differing_outputs": _differing(expected, got, step.args),
        }
    del outputs

    programs = {
        "xla": lambda: xla(*arguments),
        "xla-nocombine": lambda: nocombine(*arguments),
        "disco": lambda: optimized(*arguments),
    }
    load_before = os.getloadavg()
    times = _time_paired(programs, args.rounds, args.warmup)
    load_after = os.getloadavg()
    plans = optimized.plans()
    gradient_bytes = sum(
        int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
        for x in jax.tree_util.tree_leaves(step.args[0])
    )
    return {
        "model": name,
        "size": args.size,
        "global_batch": global_batch,
        "parameter_tensors": step.parameter_tensors,
        "parameter_count": step.parameter_count,
        "gradient_bytes": gradient_bytes,
        "disco_status": optimized.status(),
        "plan_buckets": len(plans[0].all_reduce_buckets) if plans else None,
        "plan_fusion_groups": len(plans[0].fusion_groups) if plans else None,
        "outputs_equal": equal,
        "prepare_s": prepare_s,
        "load_average_1min": [load_before[0], load_after[0]],
        "times_s": times,
        **_ratios(times),
        "_lowered": lowered,
        "_plan": plans[0] if plans else None,
    }


def _print_table(result: dict) -> None:
    print(
        f"measure_speedup: {result['processes']} processes, {result['rounds']} paired rounds, "
        f"cluster {result['cluster']}"
    )
    header = f"{'model':<18}{'program':<15}{'median ms':>11}{'predicted ms':>14}"
    for entry in result["models"]:
        print(
            f"\n{entry['model']} ({entry['size']}, {entry['parameter_count']:,} parameters, "
            f"{entry['gradient_bytes'] / 2**20:.1f} MiB of gradients, batch "
            f"{entry['global_batch']}): disco {entry['disco_status']}, "
            f"plan of {entry['plan_buckets']} buckets"
        )
        print(header)
        predicted = entry.get("predicted", {}).get("iteration_s", {})
        for name in PROGRAMS:
            guess = predicted.get(name)
            print(
                f"{entry['model']:<18}{name:<15}{entry['median_s'][name] * 1e3:>11.2f}"
                + (f"{guess * 1e3:>14.2f}" if guess is not None else f"{'-':>14}")
            )
        for key, value in entry["speedup"].items():
            print(
                f"  {key}: {value:.3f}x (median of paired ratios "
                f"{entry['paired_speedup'][key]:.3f}x)"
                + (
                    f", predicted {entry['predicted_speedup'][key]:.3f}x"
                    if key in entry.get("predicted_speedup", {})
                    else ""
                )
            )
        print(f"  outputs equal to xla's: {entry['outputs_equal']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True, help="zoo model (repeatable)")
    parser.add_argument("--size", choices=["tiny", "medium", "full"], default="tiny")
    parser.add_argument("--batch-per-process", type=int, default=2, help="examples per process")
    parser.add_argument("--rounds", type=int, default=10, help="paired, rotating timed rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--cluster", default="cpu-local", help="profile name or YAML path")
    parser.add_argument("--cost-model", default="roofline")
    parser.add_argument("--max-evaluations", type=int, default=300)
    parser.add_argument("--budget-s", type=float, default=30.0)
    parser.add_argument("--cache-dir", help="plan cache (default: a fresh temporary one)")
    parser.add_argument("--no-predict", action="store_true", help="skip the simulator")
    parser.add_argument("--json", action="store_true", help="rank 0 prints one JSON object")
    args = parser.parse_args()

    import jax

    from disco_xla.runtime.agreement import gather

    if jax.process_count() < 2:
        raise SystemExit(
            "measure_speedup.py needs at least 2 jax.distributed processes: run it with "
            "`disco-xla launch -n 4 benchmarks/measure_speedup.py ...`"
        )
    rank = jax.process_index()
    with tempfile.TemporaryDirectory(prefix="disco_speedup_") as scratch:
        entries = [measure_model(name, args, args.cache_dir or scratch) for name in args.model]
    if rank == 0 and not args.no_predict:
        for entry in entries:
            entry["predicted"] = _predictions(
                entry["_lowered"], entry["_plan"], args.cluster, args.cost_model
            )
            predicted = entry["predicted"]["iteration_s"]
            if "disco" in predicted:
                entry["predicted_speedup"] = {
                    "disco_vs_xla": predicted["xla"] / predicted["disco"],
                    "disco_vs_xla_nocombine": predicted["xla-nocombine"] / predicted["disco"],
                    "nocombine_vs_xla": predicted["xla"] / predicted["xla-nocombine"],
                }
    # The other ranks wait for rank 0's simulations, so that none shuts down early.
    gather("measure_speedup/done", "ok", timeout_s=3600)
    if rank != 0:
        return 0
    for entry in entries:
        entry.pop("_lowered")
        entry.pop("_plan")
    result = {
        "processes": jax.process_count(),
        "rounds": args.rounds,
        "warmup": args.warmup,
        "cluster": args.cluster,
        "command": " ".join(sys.argv),
        "models": entries,
    }
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
