"""Peak device memory of the program disco-xla runs, against XLA's own, for zoo
steps that donate their parameters, state and optimizer state (`jax.jit` over
sharded arrays with `donate_argnums`, as training loops write it).

The figure is XLA's own account of each compiled program's buffers on one
device (`peak_bytes`: arguments, results and temporaries, less the results that
reuse a donated argument's buffer), as `disco_xla.jit`'s `measurements()`
reports it for XLA's program and for every candidate it built. The benchmark
also checks that the program that runs consumes the same arrays as JAX's own.

    .venv/bin/python benchmarks/donated_memory.py [--models gpt2_small resnet50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def measure(model: str, size: str, replicas: int, cluster: str) -> dict:
    import jax

    import disco_xla
    from disco_xla.zoo.jax_steps import build_jax_step

    step = build_jax_step(
        model, size, replicas=replicas, global_batch=2 * replicas, mode="sharded", donate=True
    )
    wrapped = disco_xla.jit(
        step.fn, cluster=cluster, cache_dir=tempfile.mkdtemp(), background=False
    )
    copies = jax.tree_util.tree_map(lambda leaf: leaf.copy(), step.args)
    jax.block_until_ready(step.fn(*copies))  # which arrays JAX's own program consumes
    jax_consumed = [leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(copies[:3])]
    args = step.args
    for _ in range(3):  # the first call's trial, then the chosen program twice
        given = args
        outputs = jax.block_until_ready(wrapped(*args))
        args = (*outputs[:3], given[3])
    donated = jax.tree_util.tree_leaves(given[:3])
    (report,) = wrapped.measurements()
    (status,) = wrapped.status()
    chosen = next(label for label, entry in report.items() if entry["chosen"])
    original = report["original"]["peak_bytes"]
    built = {
        label: entry["peak_bytes"] / original
        for label, entry in report.items()
        if "peak_bytes" in entry and label != "original"
    }
    return {
        "model": model,
        "size": size,
        "replicas": replicas,
        "status": status,
        "chosen": chosen,
        "original_peak_bytes": original,
        "chosen_peak_ratio": round(report[chosen]["peak_bytes"] / original, 4),
        "candidate_peak_ratios": {label: round(ratio, 4) for label, ratio in built.items()},
        "consumed_as_jax_does": [leaf.is_deleted() for leaf in donated] == jax_consumed,
        "arrays_jax_consumes": f"{sum(jax_consumed)} of {len(jax_consumed)}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gpt2_small", "resnet50", "bert_base"])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--cluster", default="cpu-local-inprocess")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    flag = f"--xla_force_host_platform_device_count={args.replicas}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()
    for model in args.models:
        row = measure(model, args.size, args.replicas, args.cluster)
        print(json.dumps(row) if args.json else json.dumps(row, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
