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

    # 2 CPU devices in one process (profile cpu-local-inprocess)
    .venv/bin/python benchmarks/validate_simulator.py
    # 2 jax.distributed processes, gloo on loopback (profile cpu-local)
    disco-xla launch -n 2 benchmarks/validate_simulator.py

Measurement is in rounds (`_measure_rotating`), every rank in the same order:
each round runs each plan, rotated, as a training loop does, one untimed step
and then --block timed steps, each blocked on; the first --profile-runs rounds
also trace one step of each plan for its kernel times. In the same rounds,
`disco-xla calibrate`'s probes are timed (and the compute probe traced), and the
profile's machine-speed terms are taken from them (`with_probes`): the host's
cost of a step, the kernel time scale, the in-step all-reduce time, the
worker lag and each tuple tensor's time. This machine's speed drifted by 1.8x
within minutes, so a profile calibrated before describes another machine
(--no-probes keeps the profile's own terms). The simulation adds the host's cost of a step for the
compiled module's argument and result buffers (`step_buffers`) and scales
kernel times by the kernel time scale. Each kernel's time is its mean over the
profiled runs (--kernel-statistic). Each row also gives the simulation without
one model term (`simulated_ms_ablated`: no step costs, no kernel time scale, the
other kernel statistic), which is what that term contributes; with each
collective's traced duration as its cost (`traced_collectives`: what is left
when the collectives cost what the trace measured, waits included); and with
predicted kernel times instead of measured ones (the shipped GNN, and the
roofline): their iteration-time error. While measuring, idle CPUs are kept
polling (`disco_xla.timing.cpus_kept_awake`; --let-cpus-sleep to not): on this
virtual machine a halted CPU's wake-up made a step's collectives wait 30-60 us
per hand-off, or not, at random. Target (issue 4): within 10% on every case.
Options: --model NAME (repeatable), --size tiny|medium, --rounds N,
--block N, --profile-runs N, --cluster, --no-probes, --let-cpus-sleep.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

IN_PROCESS_DEVICES = 2
PLANS = ("none", "xla", "buckets")
BUCKETS = 3
# Names of calibrate's probes, timed with the plans (unless --no-probes).
PROBE, IN_STEP, IN_STEP_NONE = "probe:compute", "probe:all-reduces", "probe:no-all-reduces"
EMPTY, EMPTY_MANY = "probe:empty-step", "probe:empty-step-many"
TUPLE = "probe:tuple-all-reduce"
SEPARATE = "probe:separate-all-reduces"
LAG, LAG_NONE = "probe:all-reduces-more-kernels", "probe:no-all-reduces-more-kernels"


def _executable_module(executable):
    from disco_xla.hlo.graph import HloModule

    data = executable.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto()
    return HloModule.from_bytes(data, "<compiled>")


def step_buffers(module) -> int:
    """The step's argument and result buffers: the leaves of its entry
    computation's parameters and of its root (what the host hands over and back
    each step; the profile's step_buffer_s is the cost of each)."""
    entry = module.entry
    parameters = [i for i in entry.instructions if i.opcode == "parameter"]
    return sum(len(i.shape.leaves()) for i in parameters) + len(entry.root.shape.leaves())


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

    from disco_xla.driver.planning import prepared
    from disco_xla.hlo.graph import HloModule
    from disco_xla.runtime.apply import apply_plan
    from disco_xla.runtime.jax_program import kept_arguments, standing_in_for
    from disco_xla.runtime.xla_runner import ALL_REDUCE_COMBINER, NO_COMBINER

    lowered = step.fn.lower(*arguments)
    xla = lowered.compile()
    no_fusion_no_combiner = {"xla_disable_hlo_passes": f"{ALL_REDUCE_COMBINER},fusion"}
    none = lowered.compile(compiler_options=no_fusion_no_combiner)
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


def compiled_zoo_step(model: str, devices: int, batch_per_device: int):
    """A call, blocked on, of XLA's own compile of the tiny `jit(shard_map)`
    training step of zoo `model` over this process's first `devices` CPU devices,
    `batch_per_device` examples each (set `jax_num_cpu_devices` first)."""
    import jax
    from jax.sharding import Mesh
    from measure_speedup import _zoo_size

    from disco_xla.zoo.jax_steps import AXIS, build_jax_step

    with _zoo_size(model, "tiny") as size:
        step = build_jax_step(model, size, devices, batch_per_device * devices, "shard_map")
    mesh = Mesh(np.array(jax.devices()[:devices]), (AXIS,))
    arguments = _arguments(step, mesh)
    compiled = step.fn.lower(*arguments).compile()
    return lambda: jax.block_until_ready(compiled(*arguments))


def _arguments(step, mesh):
    from measure_speedup import _global_arguments

    from disco_xla.zoo.jax_steps import AXIS

    return _global_arguments(step, mesh, AXIS)


def _measure_rotating(
    programs: dict, traced: set, rounds: int, block: int, traced_rounds: int, profile
) -> tuple[dict[str, list[float]], dict[str, dict[str, list[float]]]]:
    """(step times, kernel samples) of each program, measured in the same rounds,
    as a training loop runs steps: each round runs every program (in the order
    rotated by the round) for one untimed step and then `block` timed steps, and
    in the first `traced_rounds` rounds traces one more step of each program in
    `traced` (`profile` is `profile_kernel_times`; a round's kernel time is the
    mean over the devices). A step that follows another program's finds its
    buffers out of cache (on resnet50 and gpt2_small that made `buckets` 20-25%
    slower), and this machine's speed drifts within minutes, so the step times,
    kernel times and probes are taken together. Samples: {program: {instruction:
    [seconds per traced round]}}."""
    import time

    import jax

    names = list(programs)
    for name in names:
        jax.block_until_ready(programs[name]())
    times: dict[str, list[float]] = {name: [] for name in names}
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in traced}
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            jax.block_until_ready(programs[name]())
            for _ in range(block):
                started = time.perf_counter()
                jax.block_until_ready(programs[name]())
                times[name].append(time.perf_counter() - started)
            if name in traced and round_index < traced_rounds:
                found = profile(programs[name], repeats=1, statistic=statistics.mean)
                for instruction, seconds in found.items():
                    samples[name].setdefault(instruction, []).append(seconds)
    return times, samples


def _simulated(compiled, graph, samples: dict, statistic: str, profile, comm_cost=None):
    """(simulation, its cost model) of one compiled plan, with a table of each
    kernel's `statistic` ('mean' or 'median') over its profiled `samples`."""
    from disco_xla.profiling.kernel_times import kernel_time_table
    from disco_xla.simulator.comm import all_reduce_s
    from disco_xla.simulator.cost_models import RooflineCostModel, TableCostModel
    from disco_xla.simulator.events import simulate

    reduce = statistics.mean if statistic == "mean" else statistics.median
    table = kernel_time_table(compiled, {k: reduce(v) for k, v in samples.items()})
    cost_model = TableCostModel(table, RooflineCostModel(profile))
    result = simulate(
        graph, profile, cost_model, comm_cost or all_reduce_s, step_buffers=step_buffers(compiled)
    )
    return result, cost_model


def traced_comm_cost(graph, samples: dict):
    """A communication cost (`CommCostFn`) that gives each all-reduce of `graph`
    its traced duration: the mean over the traced rounds of each communication
    task's instruction (by its byte count; tasks of one size share their mean),
    the profile's own model for any size the trace did not show. A traced
    duration holds everything the collective waited for, the other workers
    included, so it goes with a profile whose worker lag and tuple tensor time are
    0. A diagnostic: what the simulation gives when only its collective costs are
    taken from the measurement."""
    from disco_xla.simulator.comm import all_reduce_s

    by_size: dict[int, list[float]] = {}
    for name, size, _ in graph.communications:
        if name in samples:
            by_size.setdefault(size, []).append(statistics.mean(samples[name]))
    table = {size: statistics.mean(seconds) for size, seconds in by_size.items()}

    def cost(size_bytes, profile):
        found = table.get(size_bytes)
        return all_reduce_s(size_bytes, profile) if found is None else found

    return cost


def _placements(mesh):
    """(place, place_split) for calibrate's probes: a replicated global array, and
    one split over the workers, each from this worker's local array."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P(mesh.axis_names[0]))
    if jax.process_count() > 1:
        return (
            lambda x: jax.make_array_from_process_local_data(replicated, x),
            lambda x: jax.make_array_from_process_local_data(split, x),
        )
    devices = mesh.devices.size
    return (
        lambda x: jax.device_put(x, replicated),
        lambda x: jax.device_put(np.concatenate([x] * devices), split),
    )


def _probes(mesh) -> dict:
    """`disco-xla calibrate`'s probes of the machine-speed terms of a profile, to
    be timed with a step's plans: the empty steps, the compute probe, the in-step
    all-reduce probe (with and without its all-reduces, and with each as a tuple
    of tensors or as that many separate all-reduces)."""
    from disco_xla.profiling import calibrate

    place, place_split = _placements(mesh)
    empty = calibrate.empty_steps(mesh, place)
    return {
        EMPTY: empty[1],
        EMPTY_MANY: empty[calibrate.STEP_PAIRS],
        PROBE: calibrate.compute_probe(mesh, place, place_split),
        IN_STEP: calibrate.in_step_probe(mesh, place_split, "all-reduce"),
        IN_STEP_NONE: calibrate.in_step_probe(mesh, place_split, None),
        LAG: calibrate.in_step_probe(mesh, place_split, "all-reduce", calibrate.IN_STEP_LAG_BYTES),
        LAG_NONE: calibrate.in_step_probe(mesh, place_split, None, calibrate.IN_STEP_LAG_BYTES),
        TUPLE: calibrate.in_step_probe(mesh, place_split, calibrate.TUPLE_ALL_REDUCE),
        SEPARATE: calibrate.in_step_probe(mesh, place_split, calibrate.SEPARATE_ALL_REDUCES),
    }


def with_probes(profile, times: dict, probe_kernel_s: float):
    """`profile` with the terms that `disco-xla calibrate` measures on its probes
    taken from the probes timed now, in the same rounds as the plans: this
    machine's speed drifted by 1.8x within minutes (other virtual machines
    share its host), so a profile calibrated minutes before describes another
    machine. The terms: the host's step costs (empty steps), the kernel time
    scale (compute probe), the in-step all-reduce time (by which every
    all-reduce point moves), the worker lag (the in-step probe with more kernels)
    and each tuple tensor's time, as its share of a separate all-reduce's
    (`calibrate.StepCosts`, `calibrate.in_step_points`, `calibrate.tuple_element_share`).
    The all-reduce points' size-dependent part and the device rates stay the
    profile's."""
    import dataclasses

    from disco_xla.profiling import calibrate

    def median(name):
        return statistics.median(times[name])

    small = calibrate.in_step_from(median(IN_STEP), median(IN_STEP_NONE))
    step = calibrate.StepCosts.from_times(
        median(EMPTY),
        median(EMPTY_MANY),
        median(PROBE),
        probe_kernel_s,
        small[0],
        calibrate.worker_lag(small, calibrate.in_step_from(median(LAG), median(LAG_NONE))),
    )
    points = profile.all_reduce_points
    if points:
        points = tuple(calibrate.in_step_points(list(points), step))
    return dataclasses.replace(
        profile,
        step_overhead_s=step.step_overhead_s,
        step_buffer_s=step.step_buffer_s,
        kernel_time_scale=step.kernel_time_scale,
        worker_lag=step.worker_lag,
        all_reduce_points=points,
        tuple_all_reduce_element_s=calibrate.tuple_element_seconds(
            calibrate.tuple_element_share(median(IN_STEP), median(TUPLE), median(SEPARATE)), step
        ),
    )


def validate_model(name: str, size: str, workers: int, args, profile) -> list[dict]:
    import dataclasses

    import jax
    from jax.sharding import Mesh
    from measure_speedup import _local_leaves, _zoo_size

    from disco_xla.costmodel.network import GnnCostModel
    from disco_xla.costmodel.weights import default_model_directory
    from disco_xla.plan import Plan
    from disco_xla.profiling.kernel_times import profile_kernel_times
    from disco_xla.runtime.output_comparison import compare_outputs
    from disco_xla.simulator.cost_models import RooflineCostModel
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
    runs = {p: run for p, (run, _) in programs.items()}
    probes = {} if args.no_probes else _probes(mesh)
    traced = set(runs) | ({PROBE} if probes else set())
    times, samples = _measure_rotating(
        {**runs, **probes}, traced, args.rounds, args.block, args.profile_runs, profile_kernel_times
    )
    if probes:
        probe_kernel_s = sum(statistics.mean(v) for v in samples[PROBE].values())
        profile = with_probes(profile, times, probe_kernel_s)
    # What each model term contributes: the same simulation without it.
    ablations = {
        "no_step_costs": dataclasses.replace(profile, step_overhead_s=0.0, step_buffer_s=0.0),
        "no_kernel_time_scale": dataclasses.replace(profile, kernel_time_scale=1.0),
    }
    traced_profile = dataclasses.replace(profile, worker_lag=0.0, tuple_all_reduce_element_s=0.0)
    gnn = GnnCostModel.load(default_model_directory())
    rows = []
    for plan_name, (_, compiled) in programs.items():
        graph = build_task_graph(compiled, Plan.unfused(compiled))
        found = samples[plan_name]
        result, cost_model = _simulated(compiled, graph, found, args.kernel_statistic, profile)
        other = "median" if args.kernel_statistic == "mean" else "mean"
        without = {
            term: _simulated(compiled, graph, found, args.kernel_statistic, changed)[0]
            for term, changed in ablations.items()
        }
        without[f"{other}_kernel_times"] = _simulated(compiled, graph, found, other, profile)[0]
        without["traced_collectives"] = _simulated(
            compiled,
            graph,
            found,
            args.kernel_statistic,
            traced_profile,
            traced_comm_cost(graph, found),
        )[0]
        # The same program with predicted instead of measured kernel times: the
        # iteration-time error of the GNN (issue 5) and of the roofline.
        for label, predicted in (("gnn", gnn), ("roofline", RooflineCostModel(profile))):
            without[f"{label}_cost_model"] = simulate(
                graph, profile, predicted, step_buffers=step_buffers(compiled)
            )
        measured_s = statistics.median(times[plan_name])
        rows.append(
            {
                "step": f"{name} ({size})",
                "plan": plan_name,
                "measured_ms": measured_s * 1e3,
                "simulated_ms": result.iteration_s * 1e3,
                "error": result.iteration_s / measured_s - 1,
                # The simulated iteration's parts: busy kernels and copies, busy
                # collectives, and the host's cost of the step (profile terms).
                "simulated_compute_ms": result.compute_s * 1e3,
                "simulated_comm_ms": result.comm_s * 1e3,
                "simulated_step_ms": (
                    profile.step_overhead_s + profile.step_buffer_s * step_buffers(compiled)
                )
                * 1e3,
                "kernels": len(graph.kernels),
                "all_reduces": result.collectives,
                "equal_to_xla": equal[plan_name],
                "table_misses": cost_model.misses,
                "load": load,
                "kernel_time_scale": profile.kernel_time_scale,
                "worker_lag": profile.worker_lag,
                "step_overhead_s": profile.step_overhead_s,
                "step_buffer_s": profile.step_buffer_s,
                "tuple_all_reduce_element_s": profile.tuple_all_reduce_element_s,
                "least_all_reduce_point_s": min(
                    (seconds for _, seconds in profile.all_reduce_points), default=None
                ),
                "simulated_ms_ablated": {t: r.iteration_s * 1e3 for t, r in without.items()},
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help="zoo model (repeatable)")
    parser.add_argument("--size", default="tiny", choices=("tiny", "medium"))
    parser.add_argument("--cluster", help="profile (default: the runtime's own)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--block", type=int, default=10, help="timed steps of a plan in a row, each round"
    )
    parser.add_argument("--profile-runs", type=int, default=5)
    parser.add_argument("--batch-per-worker", type=int, default=4)
    parser.add_argument(
        "--kernel-statistic",
        choices=("mean", "median"),
        default="mean",
        help="of each kernel's profiled durations (default: mean)",
    )
    parser.add_argument(
        "--no-probes",
        action="store_true",
        help="take every profile term from the profile as calibrated before, instead of "
        "from calibrate's probes timed in the same rounds as the plans",
    )
    parser.add_argument(
        "--let-cpus-sleep",
        action="store_true",
        help="do not hold the CPUs' wake-up latency at 0 while measuring",
    )
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
    profile = load_profile(cluster, workers)  # its figures at this worker count
    from disco_xla.timing import cpus_kept_awake

    rows = []
    with cpus_kept_awake() if not args.let_cpus_sleep else contextlib.nullcontext(False) as awake:
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
        "cpus_kept_awake": awake,
    }
    if args.json:
        print(json.dumps({**summary, "rows": rows}))
        return 0
    print(f"runtime: {runtime}; profile {cluster}; idle CPUs kept polling: {awake}")
    ablated = list(rows[0]["simulated_ms_ablated"]) if rows else []
    print(
        "| step | plan | measured ms | simulated ms | error | "
        + "".join(f"{term} ms (error) | " for term in ablated)
        + "kernels | all-reduces | load |"
    )
    print("| --- | --- | ---: | ---: | ---: | " + "---: | " * len(ablated) + "---: | ---: | ---: |")
    for row in rows:
        others = "".join(
            f"{ms:.2f} ({ms / row['measured_ms'] - 1:+.0%}) | "
            for ms in row["simulated_ms_ablated"].values()
        )
        print(
            f"| {row['step']} | {row['plan']} | {row['measured_ms']:.2f} | "
            f"{row['simulated_ms']:.2f} | {row['error']:+.0%} | {others}{row['kernels']} | "
            f"{row['all_reduces']} | {row['load']:.1f} |"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
