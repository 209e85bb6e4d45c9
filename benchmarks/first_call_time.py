"""How long `disco_xla.jit`'s first call takes, beside JAX's own first call, and
where the time goes: by default (the search and compiles in the background), and
with `background=False` (all of it in the first call), each on a fresh step;
then, by default again, the first call of a fresh step whose measured choice
the `background=False` run left in the plan cache (that first call finds it
from the traced step; the second call starts the background work).

The step is a zoo model's `jax.jit` over sharded arguments on N host CPU devices
(the main case). JAX's first call compiles the step. By default disco-xla's first
call lowers the step and runs JAX's program; with `background=False` it also
captures the partitioned module, searches, rewrites and compiles the candidates,
checks them against the original and times them (docs/entry-points.md). With
`--profile`, Python's profiler runs around the `background=False` first call
(it adds overhead) and the functions that took longest, by cumulative time, are
printed.

    .venv/bin/python benchmarks/first_call_time.py [--model inception_v3] [--size tiny]
        [--replicas 2] [--profile] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--cluster", default="cpu-local")
    parser.add_argument("--profile", action="store_true", help="print where the time went")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    flag = f"--xla_force_host_platform_device_count={args.replicas}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()

    import jax

    import disco_xla
    from disco_xla.zoo.jax_steps import build_jax_step

    def fresh_step():  # a new jax.jit each time: no compile is shared between runs
        return build_jax_step(
            args.model, args.size, replicas=args.replicas, global_batch=2 * args.replicas,
            mode="sharded",
        )  # fmt: skip

    step = fresh_step()
    start = time.perf_counter()
    jax.block_until_ready(step.fn(*step.args))
    jax_s = time.perf_counter() - start
    step = fresh_step()
    wrapped = disco_xla.jit(
        step.fn, cluster=args.cluster, cache_dir=tempfile.mkdtemp(), start_after=0
    )
    start = time.perf_counter()
    jax.block_until_ready(wrapped(*step.args))
    background_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(wrapped(*step.args))  # the second call starts the work
    second_s = time.perf_counter() - start
    wrapped.wait()  # the background work, before the next measurement starts
    step = fresh_step()
    cache_dir = tempfile.mkdtemp()
    wrapped = disco_xla.jit(step.fn, cluster=args.cluster, cache_dir=cache_dir, background=False)
    profiler = cProfile.Profile() if args.profile else None
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    jax.block_until_ready(wrapped(*step.args))
    if profiler:
        profiler.disable()
    disco_s = time.perf_counter() - start
    step = fresh_step()
    cached = disco_xla.jit(step.fn, cluster=args.cluster, cache_dir=cache_dir)
    start = time.perf_counter()
    jax.block_until_ready(cached(*step.args))
    cached_s = time.perf_counter() - start
    start = time.perf_counter()
    jax.block_until_ready(cached(*step.args))  # starts the work: one compile, one check
    cached_second_s = time.perf_counter() - start
    cached_status = cached.status()
    cached.wait()
    report = {
        "model": args.model,
        "size": args.size,
        "replicas": args.replicas,
        "jax_first_call_s": round(jax_s, 2),
        "disco_first_call_s": round(background_s, 2),  # the default: work in the background
        "ratio": round(background_s / jax_s, 2),
        "disco_second_call_s": round(second_s, 2),  # lowers the step, starts the thread
        "disco_first_call_all_at_once_s": round(disco_s, 1),  # background=False
        "all_at_once_ratio": round(disco_s / jax_s, 1),
        # A measured choice in the plan cache: the work starts on the second call.
        "disco_first_call_cached_s": round(cached_s, 2),
        "cached_ratio": round(cached_s / jax_s, 2),
        "disco_second_call_cached_s": round(cached_second_s, 2),
        "cached_status_after_second_call": cached_status,
        "profiled": bool(profiler),
        "status": wrapped.status(),
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps(report, indent=1))
        if profiler:
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(40)
            print(text.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
