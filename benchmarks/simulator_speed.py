"""Simulator speed on a 50,000-kernel training step.

Target (issue 4): a full simulation of a 50,000-kernel graph in under 100 ms.
The module is `ir_scale`'s generator (blocks of dot, add, tanh, all-reduce,
multiply), under the unfused plan: 4 kernels and one gradient all-reduce per block.
We time building the task graph (once per module and plan) apart from the
simulation itself, median of 5 runs.

    .venv/bin/python benchmarks/simulator_speed.py [--kernels N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ir_scale import generate_module  # noqa: E402
from disco_xla.hlo_passes.graph import HloModule  # noqa: E402
from disco_xla.plan import Plan  # noqa: E402
from disco_xla.simulator.cost_models import RooflineCostModel  # noqa: E402
from disco_xla.simulator.events import simulate  # noqa: E402
from disco_xla.simulator.kernels import build_task_graph  # noqa: E402
from disco_xla.simulator.profiles import load_profile  # noqa: E402
from disco_xla.timing import median_seconds  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=50_000)
    args = parser.parse_args()
    module = HloModule.from_bytes(generate_module(args.kernels * 5 // 4 + 8), "generated")
    plan = Plan.unfused(module)
    start = time.perf_counter()
    graph = build_task_graph(module, plan)
    build_s = time.perf_counter() - start
    print(f"kernels {len(graph.kernels)}, collectives {len(graph.communications)}")
    print(f"task graph build (once per module and plan): {build_s * 1e3:.0f} ms")
    for name in ("a100-2x8-100g", "cpu-local"):
        profile = load_profile(name)
        cost_model = RooflineCostModel(profile)
        seconds = median_seconds(lambda: simulate(graph, profile, cost_model), repeats=5, warmup=1)  # noqa: B023
        label = f"full simulation, {name} ({profile.execution})"
        print(f"{label}: {seconds * 1e3:.0f} ms (target < 100 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
