"""Run a benchmark's per-model measurement on N `jax.distributed` processes on
loopback: this process captures each model's module (on as many CPU devices as
there are ranks) and saves it; `disco-xla launch` starts the ranks, each of which
loads the modules and measures them in the same order; rank 0 writes the rows.

A benchmark calls `rows_on_processes` from its main process and `worker_rows`
from the rank it is launched as (its `--worker DIRECTORY` option)."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable


def rows_on_processes(
    script: str,
    models: list[str],
    capture: Callable[[str], object],
    forwarded: list[str],
    processes: int,
    timeout_s: float = 3600,
) -> list[dict]:
    """Capture every model here, run `script --worker DIR --models ... *forwarded`
    on `processes` ranks, and return the rows rank 0 wrote."""
    from disco_xla.hlo.hlo_io import save_module
    from disco_xla.runtime.launch import launch

    with tempfile.TemporaryDirectory() as directory:
        for index, name in enumerate(models):
            save_module(capture(name), os.path.join(directory, f"{index}.hlo.pb"))
        arguments = ["--worker", directory, "--models", *models, *forwarded]
        code = launch(os.path.abspath(script), arguments, processes, timeout_s=timeout_s)
        if code:
            raise SystemExit(f"the {processes} ranks failed (exit code {code})")
        with open(os.path.join(directory, "rows.json")) as file:
            return json.load(file)


def worker_rows(directory: str, models: list[str], measure: Callable[[str, object], dict]) -> None:
    """One rank: `measure(name, module)` for each saved module, in order; rank 0
    writes the rows to DIR/rows.json."""
    import jax

    from disco_xla.hlo.hlo_io import load_module

    rows = [
        measure(name, load_module(os.path.join(directory, f"{index}.hlo.pb")))
        for index, name in enumerate(models)
    ]
    if jax.process_index() == 0:
        with open(os.path.join(directory, "rows.json"), "w") as file:
            json.dump(rows, file)


def rows_for_args(script: str, args, devices: int, measure: Callable) -> list[dict] | None:
    """The rows of a benchmark that takes --worker, --processes, --cluster,
    --plans, --rounds and --max-evals: on a worker rank, measure its models and
    return None; else on `args.processes` ranks (each model captured for
    `devices` devices), or here, one `measure(name, args)` per model."""
    if args.worker:
        worker_rows(args.worker, args.models, lambda name, module: measure(name, args, module))
        return None
    import jax

    jax.config.update("jax_num_cpu_devices", devices)
    if args.processes <= 1:
        return [measure(name, args) for name in args.models]
    from fusion_boundary_cost import captured

    if args.processes != devices:
        raise SystemExit(f"--processes: the modules are captured for {devices} devices")
    forwarded = ["--cluster", args.cluster, "--plans", str(args.plans)]
    forwarded += ["--rounds", str(args.rounds), "--max-evals", str(args.max_evals)]
    if getattr(args, "passes", 1) != 1:
        forwarded += ["--passes", str(args.passes)]
    return rows_on_processes(script, args.models, captured, forwarded, args.processes)
