"""The FSDP step's collective plans, measured: the tiny Llama step on a data x
FSDP mesh (captured after XLA's partitioning), run on N `jax.distributed`
processes on loopback (gloo, one CPU device each), or on N devices of this one
process, against XLA's own program.

Programs, each timed in paired rounds whose order rotates
(`runtime.candidate_timing.time_candidates`), on the same random inputs:

- `xla`: XLA's own program (the reference; its all-reduce combiner on);
- `gathers-xla`: the all-gather buckets XLA:GPU's combiner would make at its
  default 30 MiB threshold (`all_gather_buckets.combined_all_gathers`), the
  rest as XLA compiles it (XLA:CPU has no all-gather combiner);
- `gathers-ordered`: every all-gather alone, in program order (the order
  dimension only: control dependencies, no concatenation);
- `prefetched`: every all-gather of a layer loop's parameters issued one trip
  ahead of its use (the prefetch dimension only, `prefetch.pipelined_all_gathers`:
  what XLA:GPU's `--xla_gpu_enable_pipelined_all_gather` does);
- `gathers-xla-prefetched`: `gathers-xla`'s buckets, those of loop parameters
  issued a trip ahead;
- `chunked`: every collective that can be split (`hlo.chunking`: the MLP's
  activation all-gathers and its down projection's all-reduce, the parameter
  all-gathers read by dots) in 2 chunks, so the MLP runs as a pipeline of 2
  (the chunk dimension only);
- `found`: `disco-xla optimize`'s plan for `--cluster` (the search, then the
  all-gather sweep), fusion and buckets;
- `found-buckets`: the found plan's buckets alone (all-reduce and all-gather),
  XLA's own fusion.

Outputs are compared on every rank (bit for bit, or equal within the rewrite
check's tolerance where enforced fusion reorders a reduction); the times are
rank 0's.

    .venv/bin/python benchmarks/fsdp_collectives.py [--processes 4] [--fsdp 4]
        [--cluster cpu-local] [--rounds 10] [--max-evals 300] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.abspath(os.path.dirname(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
PROGRAMS = (
    "gathers-xla",
    "gathers-ordered",
    "prefetched",
    "gathers-xla-prefetched",
    "chunked",
    "found",
    "found-buckets",
)


def capture(devices: int, fsdp: int):
    from disco_xla.zoo import capture_model

    return capture_model("llama", "jax", devices, mode="sharded", fsdp=fsdp).module


def measure(module, cluster: str, rounds: int, max_evaluations: int) -> dict:
    """The row of one module: every program's median step time and outputs."""
    import jax

    from disco_xla.driver.checked_rewrite import rewrite
    from disco_xla.plan import Plan, all_gathers
    from disco_xla.runtime.agreement import broadcast, gather
    from disco_xla.runtime.candidate_timing import time_candidates
    from disco_xla.search import optimize
    from disco_xla.search.all_gather_buckets import (
        XLA_GPU_ALL_GATHER_COMBINE_BYTES,
        combined_all_gathers,
    )
    from disco_xla.search.chunking import chunk_candidates
    from disco_xla.search.prefetch import pipelined_all_gathers

    found = Plan.from_json(
        broadcast(
            "fsdp_collectives/plan",
            lambda: optimize(module, cluster, max_evaluations=max_evaluations).to_json(),
        )
    )
    unfused = Plan.unfused(module)
    xla_buckets = combined_all_gathers(module, XLA_GPU_ALL_GATHER_COMBINE_BYTES)
    in_order = tuple((instr.name,) for instr in all_gathers(module))
    xla_gathers = dataclasses.replace(unfused, all_gather_buckets=xla_buckets)

    in_halves = tuple((split.collective.name, 2) for split in chunk_candidates(module, unfused))
    chunked = dataclasses.replace(unfused, chunked_collectives=in_halves)

    def prefetching(plan: Plan) -> Plan:
        return dataclasses.replace(plan, prefetched_all_gathers=pipelined_all_gathers(module, plan))

    candidates = {
        "gathers-xla": rewrite(
            module, xla_gathers, fusion=False, source="XLA's all-gather buckets"
        ),
        "gathers-ordered": rewrite(
            module,
            dataclasses.replace(unfused, all_gather_buckets=in_order),
            fusion=False,
            source="all-gathers in order",
        ),
        "prefetched": rewrite(
            module, prefetching(unfused), fusion=False, source="all-gathers a trip ahead"
        ),
        "gathers-xla-prefetched": rewrite(
            module,
            prefetching(xla_gathers),
            fusion=False,
            source="XLA's all-gather buckets, a trip ahead",
        ),
        "chunked": rewrite(module, chunked, fusion=False, source="collectives in 2 chunks"),
        "found": rewrite(module, found, source="found plan"),
        "found-buckets": rewrite(module, found, fusion=False, source="found buckets"),
    }
    xla_s, results = time_candidates(module, candidates, jax.device_count(), rounds, 0, ())
    verdicts = {
        label: gather(
            f"fsdp_collectives/{label}/equal",
            f"{int(r.outputs.equal)}{int(r.outputs.bit_equal)}",
        )
        for label, r in results.items()
    }
    row = {
        "processes": jax.process_count(),
        "devices": jax.device_count(),
        "cluster": cluster,
        "all_gathers": len(all_gathers(module)),
        "xla_all_gather_buckets": len(xla_buckets),
        "found_all_gather_buckets": len(found.all_gather_buckets),
        "found_all_reduce_buckets": len(found.all_reduce_buckets),
        "found_prefetched": len(found.prefetched_all_gathers),
        "found_chunked": len(found.chunked_collectives),
        "chunkable": len(in_halves),
        "prefetchable": len(pipelined_all_gathers(module, unfused)),
        "xla_s": xla_s,
    }
    for label in PROGRAMS:
        row[label] = {
            "measured_s": results[label].seconds,
            "speed_vs_xla": xla_s / results[label].seconds,
            "equal": all(v[0] == "1" for v in verdicts[label]),
            "bit_equal": all(v[1] == "1" for v in verdicts[label]),
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--devices", type=int, default=4, help="mesh devices (all ranks)")
    parser.add_argument("--fsdp", type=int, default=4)
    parser.add_argument("--cluster", default="cpu-local")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-evals", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", metavar="DIR", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="*", default=["llama"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    forwarded = ["--cluster", args.cluster, "--rounds", str(args.rounds)]
    forwarded += ["--max-evals", str(args.max_evals)]
    if args.worker:
        from on_processes import worker_rows

        worker_rows(
            args.worker,
            args.models,
            lambda name, module: measure(module, args.cluster, args.rounds, args.max_evals),
        )
        return
    import jax

    jax.config.update("jax_num_cpu_devices", args.devices)
    if args.processes > 1:
        from on_processes import rows_on_processes

        if args.processes != args.devices:
            raise SystemExit("--processes: one device a rank, as many as --devices")
        rows = rows_on_processes(
            __file__,
            ["llama"],
            lambda name: capture(args.devices, args.fsdp),
            forwarded,
            args.processes,
        )
    else:
        rows = [measure(capture(args.devices, args.fsdp), *forwarded_values(args))]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print(
            f"tiny Llama FSDP step, {row['devices']} devices on {row['processes']} processes, "
            f"{row['all_gathers']} all-gathers; plan for {row['cluster']}: "
            f"{row['found_all_gather_buckets']} all-gather buckets, "
            f"{row['found_all_reduce_buckets']} all-reduce buckets, "
            f"{row['found_prefetched']} of {row['prefetchable']} loop all-gathers a trip ahead, "
            f"{row['found_chunked']} of {row['chunkable']} collectives in chunks"
        )
        print(f"{'program':16s} {'measured ms':>12s} {'vs xla':>7s}  outputs")
        print(f"{'xla':16s} {row['xla_s'] * 1e3:12.3f} {1:7.2f}  reference")
        for label in PROGRAMS:
            cell = row[label]
            equal = "bit-equal" if cell["bit_equal"] else ("equal" if cell["equal"] else "DIFFER")
            print(
                f"{label:16s} {cell['measured_s'] * 1e3:12.3f} {cell['speed_vs_xla']:7.2f}  {equal}"
            )


def forwarded_values(args) -> tuple:
    return args.cluster, args.rounds, args.max_evals


if __name__ == "__main__":
    main()
