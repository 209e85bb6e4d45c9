"""How much of a step's wall time its traced kernel times account for, with and
without the asynchronous thunks' completion (`timing.thunk_seconds`).

For each captured module (a `.hlo.pb`, e.g. from `collect_cost_model_data.sh`),
XLA's own compile on the module's devices (combiner off, as `disco-xla profile`
runs it): the step's median wall time, and the traced per-device sum of the
thunks' times, (a) each thunk's own event, as the profiling data set took them
before session 27, and (b) each asynchronous thunk until its completion event;
and how many thunks a run the completion lengthened by more than half.

    .venv/bin/python benchmarks/traced_kernel_share.py build/cc-first/modules/*.tiny.hlo.pb
"""

from __future__ import annotations

import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    import jax

    from disco_xla.hlo.hlo_io import load_module

    counts = load_module(args.modules[0]).device_counts()
    jax.config.update("jax_num_cpu_devices", counts["num_replicas"] * counts["num_partitions"])
    from disco_xla.profiling.sample_plans import _program
    from disco_xla.runtime.xla_runner import random_arguments
    from disco_xla.timing import median_seconds, summed_per_run, thunk_seconds, traced_events

    print(
        "| module | step ms (untraced) | thunks' own events, ms a device | "
        "with completions, ms a device | own / step | with completions / step | "
        "asynchronous thunks a run |"
    )
    print("|---|---|---|---|---|---|---|")
    for path in args.modules:
        module = load_module(path)
        program = _program(module, "cpu")
        run = program.device_runner(random_arguments(program.parameters, 0))

        def blocking(run=run):
            return jax.block_until_ready(run())

        step_s = median_seconds(blocking, args.runs, warmup=1)
        events = traced_events(blocking, args.runs, ("/host:CPU",))
        completed = thunk_seconds(events)
        own_s, with_s = summed_per_run(events), summed_per_run(completed)
        late = (
            sum(
                1
                for (_, _, a), (_, _, b) in zip(events, completed, strict=True)
                if b > 1.5 * a + 1e-6
            )
            / args.runs
        )
        name = os.path.basename(path).removesuffix(".hlo.pb")
        print(
            f"| {name} | {step_s * 1e3:.1f} | {own_s * 1e3:.1f} | {with_s * 1e3:.1f} | "
            f"{own_s / step_s:.2f} | {with_s / step_s:.2f} | {late:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
