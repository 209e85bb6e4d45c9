"""How long a plan-cache hit takes: open the sqlite file, read one plan, parse it.

    .venv/bin/python benchmarks/plan_cache_speed.py [--plans 1000] [--reads 200]

Fills a fresh cache with `--plans` plans the size of a real one (a captured
ResNet-50-sized plan has about 7,000 instruction names), then times `--reads`
hits through the same `PlanCache.get` that `disco_xla.jit` uses, each from a new
`PlanCache` object (a new connection, as a new process would open). Prints the
median and the 95th percentile in ms. Target (issue 7): under 50 ms.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from disco_xla.driver.plan_cache import PlanCache
from disco_xla.plan import Plan


def _plan(index: int, instructions: int) -> Plan:
    names = [f"fusion.{index}.{n}" for n in range(instructions)]
    groups = tuple(tuple(names[n : n + 6]) for n in range(0, instructions, 6))
    buckets = tuple((f"all-reduce.{index}.{n}",) for n in range(160))
    return Plan(f"module{index}", f"{index:064x}", groups, buckets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=1000)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--instructions", type=int, default=7000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        cache = PlanCache(directory)
        for index in range(args.plans):
            cache.put(f"key{index}", _plan(index, args.instructions if index == 0 else 60))
        seconds = []
        for read in range(args.reads):
            started = time.perf_counter()
            plan = PlanCache(directory).get("key0")
            seconds.append(time.perf_counter() - started)
            assert plan is not None and len(plan.fusion_groups) > 1000, read
    print(
        f"{args.plans} plans cached; hit of a {args.instructions}-instruction plan: "
        f"median {np.median(seconds) * 1e3:.2f} ms, "
        f"95th percentile {np.percentile(seconds, 95) * 1e3:.2f} ms over {args.reads} reads"
    )


if __name__ == "__main__":
    main()
