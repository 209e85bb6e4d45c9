"""Paired timing of the 50,000-kernel full simulation: this tree's simulator
against another copy of `disco_xla/simulator/events.py` (say, the last commit's),
on the same task graph, alternating, so that a loaded machine slows both alike.

    git show HEAD:disco_xla/simulator/events.py > /tmp/events_before.py
    .venv/bin/python benchmarks/simulator_ab.py /tmp/events_before.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="path of the other events.py")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--kernels", type=int, default=50_000)
    args = parser.parse_args()
    from benchmarks.ir_scale import generate_module
    from disco_xla.hlo_passes.graph import HloModule
    from disco_xla.plan import Plan
    from disco_xla.simulator import events as after
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    spec = importlib.util.spec_from_file_location("events_before", args.before)
    before = importlib.util.module_from_spec(spec)
    sys.modules["events_before"] = before
    spec.loader.exec_module(before)
    module = HloModule.from_bytes(generate_module(args.kernels * 5 // 4 + 8), "generated")
    graph = build_task_graph(module, Plan.unfused(module))
    for name in ("a100-2x8-100g", "cpu-local"):
        profile = load_profile(name)
        cost_model = RooflineCostModel(profile)
        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for label, simulator in (("before", before), ("after", after)):
                start = time.perf_counter()
                simulator.simulate(graph, profile, cost_model)
                times[label].append(time.perf_counter() - start)
        old, new = statistics.median(times["before"]), statistics.median(times["after"])
        label = f"{name} ({profile.execution}), {len(graph.kernels)} kernels"
        print(
            f"{label}: before {old * 1e3:.0f} ms, after {new * 1e3:.0f} ms, "
            f"after/before {new / old:.2f} (median of {args.rounds})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
