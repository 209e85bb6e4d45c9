"""The `disco-xla` command line.

Bad input ends with one line on stderr naming the file and the problem, and exit
code 2. `--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator

from disco_xla.errors import DiscoInputError

EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 1


def _use_devices(module) -> None:
    import jax

    from disco_xla.runtime.xla_runner import devices_needed

    jax.config.update("jax_num_cpu_devices", devices_needed(module))


def _load_for_planning(path: str):
    """The module at `path` as plans are made for it: a module that XLA's SPMD
    partitioner splits (a sharded `jax.jit` step dumped before optimisation)
    is partitioned first, by XLA, since its all-reduces exist only after that."""
    from disco_xla.hlo_passes.hlo_io import load_module

    module = load_module(path)
    if not module.needs_partitioning:
        return module
    from disco_xla.runtime.xla_runner import partition_module

    _use_devices(module)
    try:
        return partition_module(module)
    except Exception as error:  # noqa: BLE001 - XLA's own errors, one line
        raise DiscoInputError(
            path, f"XLA's SPMD partitioner cannot split it here ({_first_line(error)})"
        ) from None


def _first_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200]


def _inspect(args: argparse.Namespace) -> int:
    from disco_xla.hlo_passes.hlo_io import load_module
    from disco_xla.hlo_passes.summary import format_summary, summarize

    summary = summarize(load_module(args.file, args.module))
    print(json.dumps(summary) if args.json else format_summary(summary))
    return 0


def _convert(args: argparse.Namespace) -> int:
    from disco_xla.hlo_passes.hlo_io import load_module, save_module

    module = load_module(args.input, args.module)
    save_module(module, args.output)
    print(f"wrote {args.output} ({module.name}, {module.instruction_count} instructions)")
    return 0


def _capture(args: argparse.Namespace) -> int:
    from disco_xla.zoo import ZOO, zoo_entry

    if args.list:
        for entry in ZOO:
            print(f"{entry.framework:<4} {entry.name:<18} {entry.description}")
        return 0
    if not args.model or not args.output:
        raise DiscoInputError("capture", "--model and -o/--output are required (or --list)")
    try:
        zoo_entry(args.model, args.framework)
    except KeyError:
        names = sorted(e.name for e in ZOO if e.framework == args.framework)
        raise DiscoInputError(
            args.model, f"no {args.framework} model of this name; choose from {', '.join(names)}"
        ) from None
    if args.replicas < 1:
        raise DiscoInputError(args.model, f"--replicas must be at least 1, not {args.replicas}")
    if args.model == "llama" and args.mode != "sharded":
        raise DiscoInputError(
            args.model,
            "is written for jax.jit over a mesh of data and FSDP axes: use --mode sharded",
        )
    if args.batch is not None and args.batch % args.replicas:
        raise DiscoInputError(
            args.model, f"the batch {args.batch} must split evenly over {args.replicas} replicas"
        )
    if args.precision != "f32":
        from disco_xla.zoo.jax_steps import BF16_MODELS

        if args.framework != "jax" or args.model not in BF16_MODELS:
            raise DiscoInputError(
                args.model,
                "--precision bf16 applies to the JAX transformers (llama is bf16 as written; "
                "the CNNs' batch norm needs f32)",
            )
    import jax

    # The capture runs on this many host CPU devices; no GPU, weights or data needed.
    jax.config.update("jax_num_cpu_devices", args.replicas)
    from disco_xla.hlo_passes.hlo_io import save_module
    from disco_xla.progress import StageProgress
    from disco_xla.zoo import capture_model

    start = time.perf_counter()
    with StageProgress(["build", "lower", "write"], quiet=args.json) as progress:
        captured = capture_model(
            args.model,
            args.framework,
            args.replicas,
            args.size,
            args.batch,
            args.mode,
            on_stage=progress.stage,
            precision=args.precision,
        )
        progress.stage("write")
        save_module(captured.module, args.output)
    module = captured.module
    gradients = module.gradient_all_reduces
    report = {
        "model": args.model,
        "framework": args.framework,
        "size": args.size,
        "replicas": args.replicas,
        "output": args.output,
        "parameters": captured.parameter_count,
        "parameter_tensors": captured.parameter_tensors,
        "gradient_all_reduces": len(gradients),
        "gradient_bytes": sum(a.bytes for a in gradients),
        "instructions": module.instruction_count,
        "capture_s": round(time.perf_counter() - start, 3),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"wrote {args.output}: {args.framework} {args.model} ({args.size}), "
            f"{captured.parameter_count:,} parameters, {module.instruction_count} instructions, "
            f"{len(gradients)} gradient all-reduces for {captured.parameter_tensors} parameter "
            f"tensors, {report['capture_s']:.1f} s"
        )
    return 0


@contextlib.contextmanager
def _cpus_awake_if_asked(args: argparse.Namespace, command: str) -> Iterator[bool]:
    """`timing.cpus_kept_awake` around a measurement when --keep-cpus-awake asks
    for it (a one-line error where it cannot be held); yields whether it is held."""
    if not args.keep_cpus_awake:
        yield False
        return
    from disco_xla.timing import CPU_LATENCY_DEVICE, cpus_kept_awake

    with cpus_kept_awake() as held:
        if not held:
            raise DiscoInputError(
                command, f"--keep-cpus-awake needs write access to {CPU_LATENCY_DEVICE}"
            )
        yield True


def _add_keep_cpus_awake(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-cpus-awake",
        action="store_true",
        help="hold the CPUs' wake-up latency at 0 while measuring (Linux PM QoS; needs "
        "write access to /dev/cpu_dma_latency), for runs made under the same setting",
    )


def _calibrate(args: argparse.Namespace) -> int:
    if (args.devices or 0) < 0 or (args.processes is not None and args.processes < 2):
        raise DiscoInputError("calibrate", "--processes needs at least 2 processes")
    workers = args.processes or args.devices
    if workers < 2:
        raise DiscoInputError("calibrate", "an all-reduce needs at least 2 devices")
    if not 4096 <= args.max_bytes <= 2**31:
        raise DiscoInputError("calibrate", "--max-bytes must be between 4096 and 2 GiB")
    import jax
    import yaml

    jax.config.update("jax_num_cpu_devices", max(workers, 1) if not args.processes else 1)
    from disco_xla.simulator import calibrate

    sizes = [s for s in calibrate.SIZES_BYTES if s <= args.max_bytes]
    quiet = args.json or not sys.stderr.isatty()
    from tqdm import tqdm

    probes = sum(map(len, calibrate.sizes_by_kind(sizes).values()))
    with (
        _cpus_awake_if_asked(args, "calibrate") as awake,
        tqdm(total=probes + 1, disable=quiet, desc="calibrating", leave=False) as bar,
    ):
        if args.processes:
            runtime = "multi-process jax.distributed, gloo on loopback"
            collective_steps, tuple_element_s, step = calibrate.measure_multi_process(
                args.processes, sizes, args.repeats
            )
            bar.update(probes)
        else:
            runtime = "one process, N CPU devices"
            collective_steps, tuple_element_s, step = calibrate.measure_in_process(
                workers, sizes, args.repeats, lambda: bar.update(1)
            )
        flops, bandwidth = calibrate.measure_device()
        bar.update(1)
    if awake:
        runtime += ", idle CPUs kept polling (--keep-cpus-awake)"
    # The points become what each collective adds to a step (`in_step_points`).
    measured = collective_steps.pop("all-reduce")
    fit = calibrate.fit_ring_model(calibrate.in_step_points(measured, step), workers)
    collectives = {
        kind: calibrate.in_step_points(points, step, kind)
        for kind, points in collective_steps.items()
    }
    profile = calibrate.cpu_profile(
        fit,
        workers,
        runtime,
        flops,
        bandwidth,
        tuple_element_s,
        step,
        measured,
        collectives,
        collective_steps,
    )
    from disco_xla.profiling.boundary_cost import measure_fusion_boundary_s
    from disco_xla.simulator.profiles import profile_from_dict

    boundary = measure_fusion_boundary_s(profile_from_dict(profile, "calibrate"))
    profile["fusion_boundary_s"] = boundary.fusion_boundary_s
    try:
        with open(args.output, "w") as file:
            file.write(
                "# Written by `disco-xla calibrate`: every figure was measured on this machine.\n"
            )
            yaml.safe_dump(profile, file, sort_keys=False)
    except OSError as error:
        raise DiscoInputError(args.output, f"cannot write it ({error.strerror})") from None
    report = {
        "runtime": runtime,
        "workers": workers,
        "alpha_s": fit.alpha_s,
        "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
        "max_relative_residual": fit.max_relative_residual,
        "points": fit.points,
        "collective_points": {
            kind: [{"bytes": size, "in_step_s": seconds} for size, seconds in points]
            for kind, points in collectives.items()
        },
        "peak_flops_f32": flops,
        "memory_bandwidth_bytes_per_s": bandwidth,
        "tuple_all_reduce_element_s": tuple_element_s,
        "step_overhead_s": step.step_overhead_s,
        "step_buffer_s": step.step_buffer_s,
        "empty_step_s": step.empty_step_s,
        "kernel_time_scale": step.kernel_time_scale,
        "all_reduce_in_step_s": step.all_reduce_in_step_s,
        "collective_in_step_s": step.collective_in_step_s,
        "worker_lag": step.worker_lag,
        "fusion_boundary_s": boundary.fusion_boundary_s,
        "fusion_boundary_probe": boundary.__dict__,
        "profile": args.output,
    }
    if args.json:
        print(json.dumps(report))
    else:
        _print_calibration(report)
    return 0


def _print_calibration(report: dict) -> None:
    """`disco-xla calibrate`'s report as text."""
    print(f"all-reduce over {report['workers']} workers ({report['runtime']}):")
    alpha_us, bandwidth_gb_s = report["alpha_s"] * 1e6, report["bandwidth_bytes_per_s"] / 1e9
    print(f"  alpha {alpha_us:.1f} us per step, B {bandwidth_gb_s:.3f} GB/s")
    for point in report["points"]:
        print(
            f"  {point['bytes']:>11,} B  measured {point['measured_s'] * 1e3:9.3f} ms  "
            f"fitted {point['fitted_s'] * 1e3:9.3f} ms  ({point['relative_residual']:+.0%})"
        )
    for kind, points in report["collective_points"].items():
        times = ", ".join(f"{p['bytes']:,} B {p['in_step_s'] * 1e3:.3f} ms" for p in points)
        print(f"  {kind}: {times}")
    element_us = report["tuple_all_reduce_element_s"] * 1e6
    print(f"  each tensor of a tuple all-reduce adds {element_us:.1f} us")
    print(
        f"  a step costs {report['step_overhead_s'] * 1e6:.1f} us + "
        f"{report['step_buffer_s'] * 1e6:.2f} us per argument or result "
        f"(an empty step: {report['empty_step_s'] * 1e6:.1f} us)"
    )
    if report["all_reduce_in_step_s"] is not None:
        print(
            f"  a 4 KB all-reduce adds {report['all_reduce_in_step_s'] * 1e6:.1f} us to a "
            "computing step (the points above are as they add to one)"
        )
    print(f"  kernels take {report['kernel_time_scale']:.2f}x their profiled time on shared cores")
    print(
        f"  at a collective the slowest worker is {report['worker_lag']:.2f} of the kernel "
        "time since the workers last met behind"
    )
    boundary = report["fusion_boundary_probe"]
    print(
        f"  a kernel boundary costs {boundary['fusion_boundary_s'] * 1e6:.2f} us beyond its "
        f"modelled kernel ({boundary['boundaries']} boundaries: {boundary['xla_s'] * 1e3:.3f} ms "
        f"-> {boundary['split_s'] * 1e3:.3f} ms, "
        f"modelled +{boundary['modelled_extra_s'] * 1e3:.3f} ms)"
    )
    flops, bandwidth = report["peak_flops_f32"], report["memory_bandwidth_bytes_per_s"]
    print(f"  f32 matmul {flops / 1e9:.1f} GFLOP/s, memory {bandwidth / 1e9:.1f} GB/s")
    print(f"wrote {report['profile']}")


def _others(count: int) -> str:
    """' and N other collectives' when there are any."""
    if not count:
        return ""
    return f" and {count} other collective{'s' if count != 1 else ''}"


def _simulate(args: argparse.Namespace) -> int:
    from disco_xla.plan import Plan, verify_plan
    from disco_xla.search.baselines import BASELINES, baseline
    from disco_xla.simulator.cost_models import TableCostModel, make_cost_model
    from disco_xla.simulator.events import chrome_trace, plot_gantt, simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    module = _load_for_planning(args.file)
    profile = load_profile(args.cluster)
    cost_model = make_cost_model(args.cost_model, profile, args.table)
    note = ""
    if args.plan in BASELINES:
        compiled = {}
        if args.plan != "none":
            from disco_xla.runtime.xla_runner import compile_module

            _use_devices(module)
            compiled = {
                "compiled_combined": compile_module(module),
                "compiled_separate": compile_module(module, ["cpu-all-reduce-combiner"]),
            }
        chosen = baseline(
            args.plan,
            module,
            compiled.get("compiled_combined"),
            compiled.get("compiled_separate"),
            profile,
            cost_model,
        )
        module, plan, note = chosen.module, chosen.plan, chosen.note
        task_graph = chosen.task_graph  # run as the baseline runs (tuples, blocking)
    else:
        try:
            with open(args.plan) as file:
                text = file.read()
        except OSError as error:
            raise DiscoInputError(args.plan, f"cannot read the plan ({error.strerror})") from None
        plan = Plan.from_json(text, args.plan)

        def task_graph():
            return build_task_graph(module, plan)

    verify_plan(plan, module, source=args.plan)
    result = simulate(task_graph(), profile, cost_model)
    summary = {"plan": args.plan, "plan_note": note, "cluster": profile.name, **result.summary()}
    if isinstance(cost_model, TableCostModel):
        summary["table_misses"] = cost_model.misses
    if args.trace:
        with open(args.trace, "w") as file:
            json.dump(chrome_trace(result), file)
    if args.plot:
        plot_gantt({args.plan: result}, args.plot)
    if args.json:
        print(json.dumps(summary))
        return 0
    milli = 1e3
    print(
        f"{module.name} on {profile.name} ({profile.workers} workers, {summary['execution']}), "
        f"plan {args.plan}, cost model {summary['cost_model']}"
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
    return 0


def _optimize(args: argparse.Namespace) -> int:
    if args.budget_s <= 0 or args.max_evals <= 0:
        raise DiscoInputError("optimize", "--budget-s and --max-evals must be positive")
    if args.alpha < 1:
        raise DiscoInputError("optimize", "--alpha must be at least 1")
    if args.candidates < 1 or args.measure_budget_s <= 0:
        raise DiscoInputError(
            "optimize", "--candidates must be at least 1 and --measure-budget-s positive"
        )
    from tqdm import tqdm

    from disco_xla.runtime.xla_runner import compile_module
    from disco_xla.search.compare import compare_plans, comparison_summary, format_table
    from disco_xla.simulator.cost_models import make_cost_model
    from disco_xla.simulator.profiles import load_profile

    module = _load_for_planning(args.file)
    profile = load_profile(args.cluster)
    cost_model = make_cost_model(args.cost_model, profile, args.table)
    _use_devices(module)
    # XLA's fusion, with its all-reduce combiner off: every baseline starts from it.
    separate = compile_module(module, ["cpu-all-reduce-combiner"])
    quiet = args.json or not sys.stderr.isatty()
    bars = []

    def on_search(label: str):
        bar = tqdm(total=args.max_evals, disable=quiet, desc=label, leave=False)
        bars.append(bar)

        def progress(evaluations: int, best_s: float) -> None:
            bar.update(evaluations - bar.n)
            bar.set_postfix_str(f"best {best_s * 1e3:.3f} ms")

        return progress

    try:
        comparison = compare_plans(
            module,
            separate,
            profile,
            cost_model,
            alpha=args.alpha,
            budget_s=args.budget_s,
            max_evaluations=args.max_evals,
            seed=args.seed,
            on_search=on_search,
            keep=args.candidates,
        )
    finally:
        for bar in bars:
            bar.close()
    best = comparison.found
    plan_path = args.output if args.output.endswith(".json") else args.output + ".plan.json"
    try:
        with open(plan_path, "w") as file:
            file.write(best.plan.to_json())
    except OSError as error:
        raise DiscoInputError(plan_path, f"cannot write it ({error.strerror})") from None
    written = None
    if plan_path != args.output:  # -o names a module: search and apply in one go
        written = _write_checked(module, best.plan, plan_path, args, comparison)
        if written.plan is not None and written.plan != best.plan:
            # Measured faster than the search's first choice: its plan is the one kept.
            with open(plan_path, "w") as file:
                file.write(written.plan.to_json())
    if args.report:
        from disco_xla.report import write_report

        write_report(args.report, module, profile, comparison.results, best.plan)
    report = {
        **comparison_summary(comparison),
        "cost_model": cost_model.name,
        "cluster": profile.name,
        "plan": plan_path,
    }
    if written is not None:
        report["measured"] = written.measured()
        report["written"] = written.written
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"{module.name} on {profile.name}, cost model {cost_model.name}: "
        f"{best.evaluations} plans evaluated in {best.search_s:.1f} s; every plan below is "
        "simulated over the captured module (XLA's kernels mapped back onto it)"
    )
    print(format_table(comparison))
    print(f"wrote {plan_path}")
    if written is not None:
        print(_written_line(args.output, written))
        _print_candidates(written)
    return 0


def _write_checked(module, plan, plan_source: str, args: argparse.Namespace, comparison=None):
    """Rewrite `module` for `plan`, checked on this machine (unless --no-check),
    and save the program `planning.checked_rewrite` chose to `args.output`.
    With the search's `comparison`, its next best plans and the best baseline
    are measured beside the plan (--candidates)."""
    from disco_xla.hlo_passes.hlo_io import save_module
    from disco_xla.planning import checked_rewrite, measured_alternatives

    if args.rounds < 1:
        raise DiscoInputError(args.file, "--rounds must be at least 1")
    alternatives, simulated = {}, {}
    if comparison is not None:
        baselines = {
            name: (baseline.plan, comparison.results[name].iteration_s)
            for name, baseline in comparison.baselines.items()
        }
        alternatives, simulated = measured_alternatives(
            comparison.found.top_plans, baselines, args.candidates
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
    save_module(written.module, args.output)
    return written


def _written_line(path: str, written) -> str:
    """One line: what was written to `path`, and why."""
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
    return f"wrote {path}: {what}; {written.why}"


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


def _load_plan(path: str):
    from disco_xla.plan import Plan

    try:
        with open(path) as file:
            return Plan.from_json(file.read(), path)
    except OSError as error:
        raise DiscoInputError(path, f"cannot read the plan ({error.strerror})") from None


def _apply(args: argparse.Namespace) -> int:

    module = _load_for_planning(args.file)
    plan = _load_plan(args.plan)
    _use_devices(module)
    written = _write_checked(module, plan, args.plan, args)
    if args.json:
        print(json.dumps({"written": written.written, "measured": written.measured()}))
        return 0
    print(_written_line(args.output, written))
    return 0


def _verify(args: argparse.Namespace) -> int:

    original = _load_for_planning(args.original)
    rewritten = _load_for_planning(args.rewritten)
    from disco_xla.runtime.xla_runner import devices_needed

    for path, module in ((args.original, original), (args.rewritten, rewritten)):
        needed = devices_needed(module)
        if needed != args.devices:
            raise DiscoInputError(path, f"the module runs on {needed} devices, not {args.devices}")
    _use_devices(original)
    from disco_xla.runtime.apply import RewriteError, verify_rewrite

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


def _launch(args: argparse.Namespace) -> int:
    from disco_xla.runtime.launch import launch, launch_horovod

    if args.timeout_s is not None and args.timeout_s <= 0:
        raise DiscoInputError("launch", "--timeout-s must be positive")
    run = launch_horovod if args.engine == "horovod" else launch
    return run(args.script, args.arguments, args.processes, args.timeout_s)


def _module_and_model_names(path: str) -> tuple[str, str]:
    """'build/gpt2_small.medium.hlo.pb' -> ('gpt2_small.medium', 'gpt2_small')."""
    import os

    name = os.path.basename(path)
    for suffix in (".gz", ".pb", ".txt", ".hlo"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name, name.split(".")[0]


def _profile(args: argparse.Namespace) -> int:
    if args.plans < 1 or args.repeats < 1:
        raise DiscoInputError("profile", "--plans and --repeats must be at least 1")
    from disco_xla.hlo_passes.hlo_io import load_module
    from disco_xla.runtime.xla_runner import devices_needed

    modules = [(path, load_module(path)) for path in args.files]
    import jax

    jax.config.update("jax_num_cpu_devices", max(devices_needed(m) for _, m in modules))
    from tqdm import tqdm

    from disco_xla.profiling.dataset import from_samples, save_dataset
    from disco_xla.profiling.sample_plans import profile_module

    start = time.perf_counter()
    samples = []
    quiet = args.json or not sys.stderr.isatty()
    with (
        _cpus_awake_if_asked(args, "profile") as awake,
        tqdm(total=len(modules) * (args.plans + 1), disable=quiet, leave=False) as bar,
    ):
        for path, module in modules:
            module_name, model = _module_and_model_names(path)

            def step(kind: str, bar=bar, module_name=module_name) -> None:
                bar.set_description_str(f"{module_name} {kind}")
                bar.update(1)

            samples += profile_module(
                module,
                module_name,
                model,
                args.plans,
                args.repeats,
                args.seed,
                on_plan=step,
                platform=args.platform,
            )
    dataset = from_samples(samples)
    save_dataset(dataset, args.out)
    report = {
        "samples": len(dataset),
        "with_kernels": int((dataset.kernel_count > 0).sum()),
        "distinct_kernels": len(set(dataset.structural_hash.tolist())),
        "modules": len(modules),
        "plans_per_module": args.plans,
        "cpus_kept_awake": awake,
        "seconds": round(time.perf_counter() - start, 1),
        "out": args.out,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"wrote {args.out}: {report['samples']} kernel samples "
            f"({report['distinct_kernels']} distinct) from {len(modules)} modules x "
            f"{args.plans} plans + XLA's compile, {report['seconds']:.0f} s"
        )
    return 0


def _train_cost_model(args: argparse.Namespace) -> int:
    from disco_xla.profiling.dataset import load_datasets
    from disco_xla.profiling.train_cost_model import train_and_save

    dataset = load_datasets(args.datasets)
    report = train_and_save(
        dataset,
        args.out,
        epochs=args.epochs,
        seed=args.seed,
        hold_out_model=args.hold_out,
        verbose=not args.json and sys.stderr.isatty(),
    )
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"wrote {args.out}: trained on {report['train_samples']} kernels, "
            f"validation MAPE {report['validation_mape']:.1%} after {report['epochs']} epochs, "
            f"{report['seconds']:.0f} s"
        )
    return 0


def _eval_cost_model(args: argparse.Namespace) -> int:
    from disco_xla.profiling.dataset import load_datasets
    from disco_xla.profiling.train_cost_model import evaluate
    from disco_xla.simulator.gnn import GnnCostModel
    from disco_xla.simulator.profiles import load_profile

    model = GnnCostModel.load(args.model)
    dataset = load_datasets(args.datasets)
    report = evaluate(model, dataset, load_profile(args.cluster), args.only_model)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['samples']} kernels ({args.only_model or 'all models'}), model {args.model}")
    print("{:<10}{:>9}{:>13}{:>14}".format("", "MAPE", "median APE", "Kendall tau"))
    for name in ("gnn", "roofline"):
        row = report[name]
        print(f"{name:<10}{row['mape']:>9.1%}{row['median_ape']:>13.1%}{row['kendall_tau']:>14.3f}")
    return 0


def _add_write_checks(parser: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", help="show a traceback on errors")
    parser = argparse.ArgumentParser(
        prog="disco-xla",
        description="Joint op-fusion and all-reduce bucketing for data-parallel XLA programs.",
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect", parents=[common], help="summarise an HLO module: sizes, all-reduces, FLOPs"
    )
    inspect.add_argument("file", help="HLO module (.pb, .hlo.pb, .txt, .hlo, .gz) or XLA dump dir")
    inspect.add_argument(
        "--module", help="in a dump directory, the module whose file name contains this"
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.set_defaults(run=_inspect)

    convert = commands.add_parser(
        "convert", parents=[common], help="convert between HLO formats, chosen by extension"
    )
    convert.add_argument("input")
    convert.add_argument("output", help="a .pb, .hlo.pb, .txt or .hlo path, optionally .gz")
    convert.add_argument(
        "--module", help="in a dump directory, the module whose file name contains this"
    )
    convert.set_defaults(run=_convert)

    capture = commands.add_parser(
        "capture", parents=[common], help="capture a zoo model's data-parallel training step"
    )
    capture.add_argument("--list", action="store_true", help="list the models")
    capture.add_argument("--model", help="a name from --list")
    capture.add_argument("--framework", choices=["jax", "tf"], default="jax")
    capture.add_argument("--replicas", type=int, default=2, help="data-parallel devices")
    capture.add_argument("--size", choices=["tiny", "full"], default="tiny")
    capture.add_argument("--batch", type=int, help="global batch (default 2 per replica)")
    capture.add_argument(
        "--mode",
        choices=["pmap", "shard_map", "sharded"],
        default="pmap",
        help="JAX: pmap, jit+shard_map, or jit with sharded arguments (captured after "
        "XLA's SPMD partitioning)",
    )
    capture.add_argument(
        "--precision",
        choices=["f32", "bf16"],
        default="f32",
        help="JAX: bf16 computes with bf16 copies of f32 parameters and all-reduces "
        "bf16 gradients (mixed precision)",
    )
    capture.add_argument("-o", "--output", help="where to write the module (.pb, .txt, ...)")
    capture.add_argument("--json", action="store_true", help="print one JSON object, no progress")
    capture.set_defaults(run=_capture)

    calibrate = commands.add_parser(
        "calibrate", parents=[common], help="measure all-reduce times and fit alpha and B"
    )
    where = calibrate.add_mutually_exclusive_group()
    where.add_argument("--devices", type=int, default=2, help="CPU devices in this process")
    where.add_argument("--processes", type=int, help="jax.distributed processes on loopback")
    calibrate.add_argument("--max-bytes", type=int, default=256 * 2**20, help="largest message")
    calibrate.add_argument("--repeats", type=int, default=5, help="timed runs per size")
    calibrate.add_argument("--json", action="store_true", help="print one JSON object")
    _add_keep_cpus_awake(calibrate)
    calibrate.add_argument("-o", "--output", default="cpu-local.yaml", help="profile to write")
    calibrate.set_defaults(run=_calibrate)

    simulate = commands.add_parser(
        "simulate", parents=[common], help="simulate one training iteration of a plan"
    )
    simulate.add_argument("file", help="HLO module of a data-parallel training step")
    simulate.add_argument("--cluster", required=True, help="profile name or YAML path")
    simulate.add_argument(
        "--plan",
        default="none",
        help="a baseline (none, xla, xla-overlap, xla-nocombine, horovod, horovod-legacy, "
        "ddp, mgwfbp) or a PLAN.json",
    )
    simulate.add_argument("--cost-model", choices=["roofline", "table", "gnn"], default="roofline")
    simulate.add_argument("--table", help="measured kernel times (JSON) for --cost-model table")
    simulate.add_argument("--json", action="store_true", help="print one JSON object")
    simulate.add_argument("--trace", help="write a Chrome/Perfetto trace JSON here")
    simulate.add_argument("--plot", help="write a PNG Gantt chart here")
    simulate.set_defaults(run=_simulate)

    optimize = commands.add_parser(
        "optimize", parents=[common], help="search for the plan with the lowest simulated time"
    )
    optimize.add_argument("file")
    optimize.add_argument("--cluster", required=True, help="profile name or YAML path")
    optimize.add_argument("--budget-s", type=float, default=60.0, help="search time budget")
    optimize.add_argument("--max-evals", type=int, default=1000, help="plans to simulate at most")
    optimize.add_argument(
        "--alpha", type=float, default=1.05, help="keep children below alpha x best"
    )
    optimize.add_argument("--seed", type=int, default=0)
    optimize.add_argument("--cost-model", choices=["roofline", "table", "gnn"], default="roofline")
    optimize.add_argument("--table", help="measured kernel times (JSON) for --cost-model table")
    optimize.add_argument(
        "-o",
        "--output",
        required=True,
        help="PLAN.json, or a module path (.pb, .txt, ...) to search and apply in one go",
    )
    optimize.add_argument(
        "--candidates",
        type=int,
        default=4,
        help="with -o MODULE: measure the search's best K plans, the first one's buckets "
        "alone and the best baseline, and write the fastest (default 4)",
    )
    optimize.add_argument(
        "--measure-budget-s",
        type=float,
        default=60.0,
        help="the most the timed rounds of that measurement may take (default 60)",
    )
    optimize.add_argument("--report", help="write an HTML report here")
    optimize.add_argument("--json", action="store_true")
    _add_write_checks(optimize)
    optimize.set_defaults(run=_optimize)

    apply = commands.add_parser(
        "apply",
        parents=[common],
        help="rewrite a module to run a plan (run against the original; never slower or different)",
    )
    apply.add_argument("file")
    apply.add_argument("plan", help="PLAN.json for this module")
    apply.add_argument("-o", "--output", required=True)
    apply.add_argument("--json", action="store_true", help="print one JSON object")
    _add_write_checks(apply)
    apply.set_defaults(run=_apply)

    verify = commands.add_parser(
        "verify", parents=[common], help="run an original and a rewritten module side by side"
    )
    verify.add_argument("original")
    verify.add_argument("rewritten")
    verify.add_argument("--devices", type=int, required=True, help="CPU devices to run on")
    verify.add_argument("--rounds", type=int, default=5, help="paired timing rounds")
    verify.add_argument("--json", action="store_true")
    verify.set_defaults(run=_verify)

    launch = commands.add_parser(
        "launch",
        parents=[common],
        help="run a script as N jax.distributed processes on this machine (loopback)",
    )
    launch.add_argument("-n", "--processes", type=int, required=True, help="processes (ranks)")
    launch.add_argument("--timeout-s", type=float, help="stop every rank after this long")
    launch.add_argument(
        "--engine",
        choices=["jax", "horovod"],
        default="jax",
        help="jax.distributed ranks, or horovodrun (gloo) from .venv-horovod",
    )
    launch.add_argument("script", help="a Python script; it runs unchanged on every rank")
    launch.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's arguments")
    launch.set_defaults(run=_launch)
    profile = commands.add_parser(
        "profile", parents=[common], help="measure sampled fused kernels: the GNN's data set"
    )
    profile.add_argument("files", nargs="+", help="HLO modules (model name: file name to '.')")
    profile.add_argument("--plans", type=int, default=8, help="sampled plans per module")
    profile.add_argument("--repeats", type=int, default=5, help="profiled steps per plan")
    _add_keep_cpus_awake(profile)
    profile.add_argument("--seed", type=int, default=0)
    profile.add_argument(
        "--platform", choices=["cpu", "gpu"], default="cpu", help="where to run the kernels"
    )
    profile.add_argument("--out", required=True, help="data set to write (.npz)")
    profile.add_argument("--json", action="store_true", help="print one JSON object")
    profile.set_defaults(run=_profile)

    train = commands.add_parser(
        "train-cost-model", parents=[common], help="train the GNN kernel cost model"
    )
    train.add_argument("datasets", nargs="+", help="data sets from `disco-xla profile`")
    train.add_argument("--out", required=True, help="model directory to write")
    train.add_argument("--epochs", type=int, default=60, help="at most this many epochs")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--hold-out", help="leave this model's kernels out of training")
    train.add_argument("--json", action="store_true", help="print one JSON object")
    train.set_defaults(run=_train_cost_model)

    evaluate = commands.add_parser(
        "eval-cost-model", parents=[common], help="GNN and roofline errors on a data set"
    )
    evaluate.add_argument("datasets", nargs="+", help="data sets from `disco-xla profile`")
    evaluate.add_argument("--model", required=True, help="model directory")
    evaluate.add_argument("--only-model", help="evaluate this model's kernels only")
    evaluate.add_argument(
        "--cluster", default="cpu-local", help="profile of the roofline shown beside the GNN"
    )
    evaluate.add_argument("--json", action="store_true", help="print one JSON object")
    evaluate.set_defaults(run=_eval_cost_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except DiscoInputError as error:
        if args.verbose:
            traceback.print_exc()
        print(f"disco-xla: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("disco-xla: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`disco-xla inspect ... | head`): not our error.
        # Point stdout at nothing so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as error:  # noqa: BLE001 - one line unless --verbose
        if args.verbose:
            traceback.print_exc()
        message = " ".join(str(error).split())[:500]
        print(
            f"disco-xla: internal error: {type(error).__name__}: {message} "
            "(run with --verbose for a traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL_ERROR


if __name__ == "__main__":
    sys.exit(main())
