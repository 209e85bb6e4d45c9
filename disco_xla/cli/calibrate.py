"""`disco-xla calibrate`: measure the collectives, kernels and steps of this
machine and write a cluster profile (`profiling/calibrate.py` does the
measuring and fitting; this module checks the flags, writes the profile and
reports what was measured)."""

from __future__ import annotations

import argparse
import json
import sys
from itertools import takewhile

import jax
import yaml
from tqdm import tqdm

from disco_xla.cli.shared import add_keep_cpus_awake, cpus_awake_if_asked
from disco_xla.errors import DiscoInputError
from disco_xla.profiling import calibrate, calibrate_horovod, calibrate_processes, cpu_profile
from disco_xla.profiling.boundary_cost import measure_fusion_boundary_s
from disco_xla.simulator.profiles import SECTION_KEYS, profile_data, profile_from_dict

PROFILE_HEADER = "# Written by `disco-xla calibrate`: every figure was measured on this machine.\n"


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "calibrate", parents=[common], help="measure all-reduce times and fit alpha and B"
    )
    parser.add_argument(
        "--engine",
        choices=["jax", "horovod"],
        default="jax",
        help="the runtime to time: JAX's collectives (default), or Horovod's on "
        "--processes ranks (.venv-horovod), for the Horovod runtime's profile",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--devices", type=int, help="CPU devices in this process (default 2; JAX only)"
    )
    where.add_argument("--processes", type=int, help="jax.distributed processes on loopback")
    parser.add_argument("--max-bytes", type=int, default=256 * 2**20, help="largest message")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per size")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_keep_cpus_awake(parser)
    written = parser.add_mutually_exclusive_group()
    written.add_argument(
        "-o", "--output", help="profile to write (cpu-local.yaml, or horovod-local.yaml)"
    )
    written.add_argument(
        "--add-to",
        metavar="PROFILE",
        help="add the figures to this profile (a YAML path) as its section for this worker "
        "count (other_worker_counts), instead of writing a profile",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    workers = _checked_workers(args)
    if args.add_to:
        _check_add_to(args, workers)
    if args.engine == "horovod":
        return _run_horovod(args, workers)
    args.output = args.output or "cpu-local.yaml"
    # The CPU device count, before anything starts JAX's backend.
    jax.config.update("jax_num_cpu_devices", max(workers, 1) if not args.processes else 1)
    runtime, collective_steps, tuple_share, step, flops, bandwidth = _measure(args, workers)
    tuple_element_s = calibrate.tuple_element_seconds(tuple_share, step)
    # The points become what each collective adds to a step (`in_step_points`).
    measured = collective_steps.pop("all-reduce")
    fit = cpu_profile.fit_ring_model(calibrate.in_step_points(measured, step), workers)
    collectives = {
        kind: calibrate.in_step_points(points, step, kind)
        for kind, points in collective_steps.items()
    }
    profile = cpu_profile.cpu_profile(
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
    boundary = measure_fusion_boundary_s(profile_from_dict(profile, "calibrate"))
    profile["fusion_boundary_s"] = boundary.fusion_boundary_s
    if args.add_to:
        args.output = args.add_to
        profile = _with_section(args.add_to, profile, workers)
    _write_profile(args.output, profile, _leading_comments(args.add_to))
    report = {
        "runtime": runtime,
        "workers": workers,
        **_fit_report(fit, collectives),
        **_device_report(flops, bandwidth, tuple_element_s, step),
        "tuple_all_reduce_share": tuple_share,
        "fusion_boundary_s": boundary.fusion_boundary_s,
        "fusion_boundary_probe": boundary.__dict__,
        "profile": args.output,
        "added_at_workers": workers if args.add_to else None,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print_calibration(report)
    return 0


def _run_horovod(args: argparse.Namespace, workers: int) -> int:
    """`calibrate --engine horovod`: the Horovod probe on `workers` ranks, this
    machine's compute figures, and the profile they make."""
    jax.config.update("jax_num_cpu_devices", 1)
    sizes = [s for s in calibrate.SIZES_BYTES if s <= args.max_bytes]
    quiet = args.json or not sys.stderr.isatty()
    with tqdm(total=2, disable=quiet, desc="calibrating Horovod", leave=False) as bar:
        figures = calibrate_horovod.measure_horovod(workers, sizes, args.repeats)
        bar.update(1)
        flops, bandwidth = calibrate.measure_device()
        bar.update(1)
    profile = calibrate_horovod.horovod_profile(figures, flops, bandwidth)
    profile_from_dict(profile, "calibrate")
    runtime = profile["calibration"]["runtime"]
    args.output = args.add_to or args.output or "horovod-local.yaml"
    if args.add_to:
        profile = _with_section(args.add_to, profile, workers)
    _write_profile(args.output, profile, _leading_comments(args.add_to))
    once, per_response, per_tensor = calibrate_horovod.response_costs(figures)
    fit = calibrate_horovod.response_fit(figures)
    report = {
        "engine": "horovod",
        "workers": workers,
        "step_once_s": once,
        "response_s": per_response,
        "tensor_in_response_s": per_tensor,
        "alpha_s": fit.alpha_s,
        "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
        "points": fit.points,
        "peak_flops_f32": flops,
        "memory_bandwidth_bytes_per_s": bandwidth,
        "profile": args.output,
        "added_at_workers": workers if args.add_to else None,
    }
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"Horovod all-reduce over {workers} ranks ({runtime}):")
    print(
        f"  a step pays {once * 1e3:.3f} ms once, each response {per_response * 1e3:.3f} ms, "
        f"each further tensor of a response {per_tensor * 1e6:.1f} us"
    )
    for point in fit.points:
        print(f"  {point['bytes']:>11,} B  adds {point['measured_s'] * 1e3:9.3f} ms")
    print(
        f"  fitted: alpha {fit.alpha_s * 1e6:.1f} us, B {fit.bandwidth_bytes_per_s / 1e9:.3f} GB/s"
    )
    verb = (
        f"added to {args.output} for {workers} workers" if args.add_to else f"wrote {args.output}"
    )
    print(verb)
    return 0


def _checked_workers(args: argparse.Namespace) -> int:
    """The number of workers the flags ask for; a one-line error where they cannot."""
    if (args.devices or 0) < 0 or (args.processes is not None and args.processes < 2):
        raise DiscoInputError("calibrate", "--processes needs at least 2 processes")
    if args.engine == "horovod" and args.devices is not None:
        raise DiscoInputError("calibrate", "--engine horovod runs ranks: use --processes N")
    workers = args.processes or (2 if args.devices is None else args.devices)
    if workers < 2:
        raise DiscoInputError("calibrate", "an all-reduce needs at least 2 devices")
    if not 4096 <= args.max_bytes <= 2**31:
        raise DiscoInputError("calibrate", "--max-bytes must be between 4096 and 2 GiB")
    return workers


def _measure(args: argparse.Namespace, workers: int) -> tuple:
    """(runtime, collective steps, a tuple tensor's share of a separate
    all-reduce, step costs, peak f32 FLOP/s, memory bandwidth): every probe of
    `profiling.calibrate`, with a progress bar on a terminal."""
    sizes = [s for s in calibrate.SIZES_BYTES if s <= args.max_bytes]
    quiet = args.json or not sys.stderr.isatty()
    probes = sum(map(len, calibrate.sizes_by_kind(sizes).values()))
    with (
        cpus_awake_if_asked(args, "calibrate") as awake,
        tqdm(total=probes + 1, disable=quiet, desc="calibrating", leave=False) as bar,
    ):
        if args.processes:
            runtime = "multi-process jax.distributed, gloo on loopback"
            collective_steps, tuple_share, step = calibrate_processes.measure_multi_process(
                args.processes, sizes, args.repeats
            )
            bar.update(probes)
        else:
            runtime = "one process, N CPU devices"
            collective_steps, tuple_share, step = calibrate.measure_in_process(
                workers, sizes, args.repeats, lambda: bar.update(1)
            )
        flops, bandwidth = calibrate.measure_device()
        bar.update(1)
    if awake:
        runtime += ", idle CPUs kept polling (--keep-cpus-awake)"
    return runtime, collective_steps, tuple_share, step, flops, bandwidth


def _check_add_to(args: argparse.Namespace, workers: int) -> None:
    """Before measuring: the profile to add to is readable, one-node, and not
    calibrated at this count as its own."""
    data = profile_data(args.add_to)
    if data["topology"].get("nodes") != 1:
        raise DiscoInputError(args.add_to, "figures by worker count need a one-node profile")
    if data["topology"].get("devices_per_node") == workers:
        raise DiscoInputError(
            args.add_to, f"calibrated at {workers} workers itself; write it anew with -o"
        )


def _with_section(path: str, measured: dict, workers: int) -> dict:
    """The profile at `path` with `measured` (a whole calibrated profile) as its
    section for `workers` (`profiles.SECTION_KEYS`), replacing any there."""
    data = profile_data(path)
    sections = dict(data.get("other_worker_counts") or {})
    sections[workers] = {key: measured[key] for key in SECTION_KEYS if key in measured}
    data["other_worker_counts"] = dict(sorted(sections.items()))
    profile_from_dict(data, path)
    return data


def _leading_comments(path: str | None) -> str:
    """The comment lines a profile opens with (its provenance), kept when a
    section is added to it; the calibrate header for a new profile."""
    if not path:
        return PROFILE_HEADER
    with open(path) as file:
        opening = takewhile(lambda line: line.startswith("#") or not line.strip(), file)
        return "".join(line for line in opening if line.startswith("#"))


def _write_profile(path: str, profile: dict, header: str = PROFILE_HEADER) -> None:
    try:
        with open(path, "w") as file:
            file.write(header)
            yaml.safe_dump(profile, file, sort_keys=False)
    except OSError as error:
        raise DiscoInputError(path, f"cannot write it ({error.strerror})") from None


def _fit_report(fit, collectives: dict) -> dict:
    """The ring model's fit and the other collectives' in-step points, as reported."""
    return {
        "alpha_s": fit.alpha_s,
        "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
        "max_relative_residual": fit.max_relative_residual,
        "points": fit.points,
        "collective_points": {
            kind: [{"bytes": size, "in_step_s": seconds} for size, seconds in points]
            for kind, points in collectives.items()
        },
    }


def _device_report(flops: float, bandwidth: float, tuple_element_s: float, step) -> dict:
    """The device's and the step's measured costs, as reported."""
    return {
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
    }


def print_calibration(report: dict) -> None:
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
    print(
        f"  each tensor of a tuple all-reduce adds {element_us:.1f} us "
        f"({report['tuple_all_reduce_share']:.2f} of a separate all-reduce)"
    )
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
    if report["added_at_workers"]:
        print(f"added to {report['profile']} for {report['added_at_workers']} workers")
    else:
        print(f"wrote {report['profile']}")
