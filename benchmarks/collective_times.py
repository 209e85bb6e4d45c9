"""How long a zoo step's collectives take, one by one, in profiler traces of its
plans, against what the step takes: a diagnostic for the simulator's validation
(issue 4).

For each plan of `validate_simulator.py` (`none`, `xla`, `buckets`), the step is
timed untraced (median of --runs), then --steps steps are traced, and each
traced step gives the summed durations of its collectives and of its other
kernels on one device, and the collectives that took longer than --long-ms
("long": a collective of a few KB takes well under a millisecond here). With
several devices in one process, it also gives the step's kernel time as if each
phase between collectives took as long as on its slowest device, over the
devices' mean (`slower_device_ratios`): a collective waits for the last device.
The idle CPUs are kept polling (`disco_xla.timing.cpus_kept_awake`). Rows are
per plan: medians over the traced steps (and devices), with the range.

    .venv/bin/python benchmarks/collective_times.py MODEL           # 2 devices, one process
    disco-xla launch -n 2 benchmarks/collective_times.py MODEL      # 2 gloo processes
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

IN_PROCESS_DEVICES = 2


def _kernels_by_run_and_device(events) -> dict:
    """{traced run: {device: [(start, instruction, seconds)]}} of the traced
    (name, stats, seconds) events that are kernels (they name an HLO op)."""
    runs: dict = {}
    for _, stats, seconds in events:
        name = stats.get("hlo_op")
        if name:
            device = runs.setdefault(stats.get("run_id"), {}).setdefault(
                stats.get("device_ordinal"), []
            )
            device.append((stats.get("start_ns", 0), name, seconds))
    return runs


def per_step_times(events, collectives: set[str], long_s: float) -> list[dict]:
    """From traced (name, stats, seconds) events: for each (traced run, device),
    the summed seconds of its collectives and of its other kernels, and the
    count and summed seconds of its collectives longer than `long_s`."""
    steps = []
    runs = _kernels_by_run_and_device(events)
    for run in sorted(runs, key=str):
        for device in sorted(runs[run], key=str):
            step = {"collective_s": 0.0, "kernel_s": 0.0, "long": 0, "long_s": 0.0}
            for _, name, seconds in runs[run][device]:
                if name in collectives:
                    step["collective_s"] += seconds
                    if seconds > long_s:
                        step["long"] += 1
                        step["long_s"] += seconds
                else:
                    step["kernel_s"] += seconds
            steps.append(step)
    return steps


def slower_device_ratios(events, collectives: set[str]) -> list[float]:
    """For each traced run that holds two or more devices (one process): the
    step's kernel time if every phase between collectives took as long as on
    its slowest device, over the devices' mean kernel time. Each collective
    waits for the last device to reach it, so a step follows its slowest device
    phase by phase; a per-device simulation with mean kernel times gives the
    mean. Phases are the kernels of a device, in the order they started, cut at
    each collective."""
    ratios = []
    for devices in _kernels_by_run_and_device(events).values():
        phases = []
        for kernels in devices.values():
            phase = [0.0]
            for _, name, seconds in sorted(kernels):
                if name in collectives:
                    phase.append(0.0)
                else:
                    phase[-1] += seconds
            phases.append(phase)
        if len(phases) < 2 or len({len(p) for p in phases}) != 1:
            continue
        slowest = sum(max(step) for step in zip(*phases, strict=True))
        mean = sum(sum(p) for p in phases) / len(phases)
        if mean > 0:
            ratios.append(slowest / mean)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--steps", type=int, default=10, help="traced steps of each plan")
    parser.add_argument("--runs", type=int, default=50, help="untraced steps of each plan")
    parser.add_argument("--long-ms", type=float, default=1.0)
    parser.add_argument("--batch-per-worker", type=int, default=4)
    args = parser.parse_args()

    import jax

    from disco_xla.runtime.launch import RANK_VARIABLE

    distributed = RANK_VARIABLE in os.environ  # run by `disco-xla launch`
    if not distributed:
        jax.config.update("jax_num_cpu_devices", IN_PROCESS_DEVICES)
    from jax.sharding import Mesh
    from measure_speedup import _zoo_size
    from validate_simulator import _arguments, _programs

    from disco_xla.timing import cpus_kept_awake, traced_events
    from disco_xla.zoo.jax_steps import AXIS, build_jax_step

    workers = jax.process_count() if distributed else IN_PROCESS_DEVICES
    with _zoo_size(args.model, "tiny") as size:
        step = build_jax_step(
            args.model, size, workers, args.batch_per_worker * workers, "shard_map"
        )
    mesh = Mesh(np.array(jax.devices()[:workers]), (AXIS,))
    programs = _programs(step, _arguments(step, mesh))
    rows = []
    with cpus_kept_awake() as awake:
        for plan, (run, compiled) in programs.items():
            collectives = {a.name for a in compiled.all_reduces}
            for _ in range(5):
                jax.block_until_ready(run())
            seconds = []
            for _ in range(args.runs):
                started = time.perf_counter()
                jax.block_until_ready(run())
                seconds.append(time.perf_counter() - started)
            events = traced_events(
                lambda run=run: jax.block_until_ready(run()), args.steps, ("/host:CPU",)
            )
            rows.append(
                (
                    plan,
                    len(collectives),
                    statistics.median(seconds),
                    per_step_times(events, collectives, args.long_ms * 1e-3),
                    slower_device_ratios(events, collectives),
                )
            )
    if jax.process_index() != 0:
        return 0
    runtime = f"{workers} gloo processes" if distributed else f"{workers} devices, one process"
    print(f"{args.model} (tiny), {runtime}; idle CPUs kept polling: {awake}")
    print(
        f"| plan | collectives | step ms (untraced) | traced: collectives ms a step | "
        f"other kernels ms a step | collectives over {args.long_ms:g} ms a step | "
        "their ms a step | kernels, slowest device a phase / mean device |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def cell(values, digits=2):
        low, mid, high = min(values), statistics.median(values), max(values)
        return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"

    for plan, count, step_s, steps, ratios in rows:
        print(
            f"| {plan} | {count} | {step_s * 1e3:.2f} | "
            f"{cell([s['collective_s'] * 1e3 for s in steps])} | "
            f"{cell([s['kernel_s'] * 1e3 for s in steps])} | "
            f"{cell([s['long'] for s in steps], 0)} | "
            f"{cell([s['long_s'] * 1e3 for s in steps])} | "
            f"{cell(ratios) if ratios else '-'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
