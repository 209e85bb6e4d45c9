"""Simulator speed: a full simulation of 50,000 kernels, and incremental
re-simulation inside the search on full-size ResNet-50.

Targets (issue 4): a full simulation of a 50,000-kernel graph in under 100 ms for
both execution models; after a local plan change, re-simulation at least 10 times
faster than a full run; the search sustains 2,000 plan evaluations per second on
ResNet-50.

1. The 50,000-kernel module is `ir_scale`'s generator (blocks of dot, add, tanh,
   all-reduce, multiply) under the unfused plan: 4 kernels and one gradient
   all-reduce per block. Building the task graph (once per module and plan) is
   timed apart from the simulation itself, median of 5 runs.
2. ResNet-50 is the zoo's full-size JAX capture on 8 replicas (32 images each),
   cached under build/ by `benchmarks/zoo_cache.py`, with XLA's fusion mapped onto
   it (`xla_fusion_plan`), on `a100-2x8-100g`. A "full run" of a neighbouring plan
   is what the search did before: verify it, build its task graph, simulate it. The
   incremental evaluation is `PlanState.evaluate`, timed over the first moves the
   search would try; every evaluated move's time is compared with a full
   simulation of the same plan. Then `search` runs from the same plan for
   --evaluations evaluations.

    .venv/bin/python benchmarks/simulator_speed.py [--kernels N] [--moves N] [--evaluations N]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import zoo_cache  # noqa: E402


def fifty_thousand_kernels(kernels: int) -> None:
    from benchmarks.ir_scale import generate_module
    from disco_xla.hlo.graph import HloModule
    from disco_xla.plan import Plan
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile
    from disco_xla.timing import median_seconds

    module = HloModule.from_bytes(generate_module(kernels * 5 // 4 + 8), "generated")
    plan = Plan.unfused(module)
    start = time.perf_counter()
    graph = build_task_graph(module, plan)
    build_s = time.perf_counter() - start
    print(f"kernels {len(graph.kernels)}, collectives {len(graph.communications)}")
    print(f"task graph build (once per module and plan, index included): {build_s * 1e3:.0f} ms")
    for name in ("a100-2x8-100g", "cpu-local"):
        profile = load_profile(name)
        cost_model = RooflineCostModel(profile)
        seconds = median_seconds(lambda: simulate(graph, profile, cost_model), repeats=5, warmup=1)  # noqa: B023
        label = f"full simulation, {name} ({profile.execution})"
        print(f"{label}: {seconds * 1e3:.0f} ms (target < 100 ms)")


def resnet50_incremental(moves_to_time: int, evaluations: int) -> None:
    from disco_xla.plan import verify_plan
    from disco_xla.search.backtracking import _neighbours, search
    from disco_xla.search.xla_fusion import xla_fusion_plan
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.incremental import PlanState
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile
    from disco_xla.timing import median_seconds

    module, compiled, prepare_s = zoo_cache.captured_and_compiled("resnet50")
    profile = load_profile("a100-2x8-100g")
    cost_model = RooflineCostModel(profile)
    plan = xla_fusion_plan(module, compiled)
    print(
        f"\nResNet-50 (full, 8 replicas): {module.instruction_count} instructions, "
        f"{len(plan.fusion_groups)} fusion groups from XLA's {len(compiled.computations)} "
        f"computations; capture and compile {prepare_s:.1f} s (0 when cached)"
    )
    build_task_graph(module, plan)  # the module index, once per module

    def full_run(candidate) -> float:
        verify_plan(candidate, module)
        return simulate(build_task_graph(module, candidate), profile, cost_model).iteration_s

    full_s = median_seconds(lambda: full_run(plan), repeats=3, warmup=0)
    graph = build_task_graph(module, plan)
    simulate_s = median_seconds(lambda: simulate(graph, profile, cost_model), repeats=5, warmup=1)
    start = time.perf_counter()
    state = PlanState(module, plan, profile, cost_model)
    load_s = time.perf_counter() - start
    print(f"kernels {len(state.order)}; plan load for incremental evaluation {load_s * 1e3:.0f} ms")
    moves = list(_neighbours(state, random.Random(0)))[:moves_to_time]
    timings: dict[str, list[float]] = {}
    evaluated = []
    skipped = 0
    for move in moves:
        start = time.perf_counter()
        seconds = move.evaluate(state)
        elapsed = time.perf_counter() - start
        if seconds is None:
            skipped += 1
            timings.setdefault("refused (illegal or too far)", []).append(elapsed)
            continue
        timings.setdefault(type(move).__name__, []).append(elapsed)
        evaluated.append((move, seconds))
    mismatches = sum(
        seconds != full_run(move.child_plan(state)) for move, seconds in evaluated[:60]
    )
    mean_s = sum(sum(t) for k, t in timings.items() if not k.startswith("refused")) / max(
        len(evaluated), 1
    )
    print(f"full run of one plan (verify + task graph + simulate): {full_s * 1e3:.1f} ms")
    print(f"full simulation alone (task graph built): {simulate_s * 1e3:.1f} ms")
    for kind, values in sorted(timings.items()):
        print(f"incremental {kind}: {len(values)} moves, {sum(values) / len(values) * 1e3:.3f} ms")
    print(
        f"incremental, mean over {len(evaluated)} evaluated moves: {mean_s * 1e3:.3f} ms = "
        f"{full_s / mean_s:.0f}x faster than a full run, {simulate_s / mean_s:.1f}x faster "
        "than the simulation alone (target >= 10x)"
    )
    print(
        f"exactness: {mismatches} of {min(len(evaluated), 60)} evaluated moves "
        "differ from a full run"
    )
    settings = OptimizeSettings(max_evaluations=evaluations, budget_s=600, seed=0)
    result = search(module, profile, cost_model, [plan], settings)
    print(
        f"search from XLA's fusion: {result.evaluations} evaluations in {result.search_s:.2f} s = "
        f"{result.evaluations / result.search_s:.0f} evaluations/s (target >= 2,000); "
        f"{result.start_s * 1e3:.3f} -> {result.iteration_s * 1e3:.3f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=50_000)
    parser.add_argument("--moves", type=int, default=2000, help="moves to time one by one")
    parser.add_argument("--evaluations", type=int, default=5000, help="for the search rate")
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    zoo_cache.use_devices(8)
    fifty_thousand_kernels(args.kernels)
    if not args.skip_resnet:
        resnet50_incremental(args.moves, args.evaluations)
    return 0


if __name__ == "__main__":
    sys.exit(main())
