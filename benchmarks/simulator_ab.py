"""Paired timing of the simulator: this tree's against other copies of
`disco_xla/simulator/events.py` (and of `incremental.py`), alternating, so that a
loaded machine slows both alike.

1. The 50,000-kernel full simulation (`simulator_speed.py`'s graph) under both
   execution models, `a100-2x8-100g` (gpu-streams) and `cpu-local` (cpu-threads),
   median of --rounds.
2. With --incremental PATH: the search rate on full-size ResNet-50
   (`simulator_speed.py`'s setting: XLA's fusion, `a100-2x8-100g`, --evaluations
   evaluations from seed 0), this tree's search against the same search code run
   on the other events.py and incremental.py (and, with --cost-models PATH, the
   other roofline), median of --search-rounds. Both must find the same plan time
   (the evaluations are exact). The other incremental.py must offer the
   `PlanState` methods the moves of `search/moves.py` call (`evaluate_fuse`,
   `evaluate_split`, `evaluate_buckets` and the `*_plan` methods).

    git show HEAD:disco_xla/simulator/events.py > /tmp/events_before.py
    git show HEAD:disco_xla/simulator/incremental.py > /tmp/incremental_before.py
    git show HEAD:disco_xla/simulator/cost_models.py > /tmp/cost_models_before.py
    .venv/bin/python benchmarks/simulator_ab.py /tmp/events_before.py \\
        [--incremental /tmp/incremental_before.py --cost-models /tmp/cost_models_before.py] \\
        [--rounds 7] [--search-rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import zoo_cache  # noqa: E402


def load_file(name: str, path: str, replacing: dict[str, object] | None = None):
    """The module in `path`, imported as `name` while `replacing` stands in for
    the modules it names (so that it imports the other copies)."""
    saved = {key: sys.modules.get(key) for key in replacing or {}}
    sys.modules.update(replacing or {})
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    return module


def full_simulation(before, rounds: int, kernels: int) -> None:
    from benchmarks.ir_scale import generate_module
    from disco_xla.hlo.graph import HloModule
    from disco_xla.plan import Plan
    from disco_xla.simulator import events as after
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile

    module = HloModule.from_bytes(generate_module(kernels * 5 // 4 + 8), "generated")
    graph = build_task_graph(module, Plan.unfused(module))
    for name in ("a100-2x8-100g", "cpu-local"):
        profile = load_profile(name)
        cost_model = RooflineCostModel(profile)
        times: dict[str, list[float]] = {"before": [], "after": []}
        for round_index in range(rounds):
            pair = (("before", before), ("after", after))
            for label, simulator in pair if round_index % 2 else pair[::-1]:
                start = time.perf_counter()
                simulator.simulate(graph, profile, cost_model)
                times[label].append(time.perf_counter() - start)
        old, new = statistics.median(times["before"]), statistics.median(times["after"])
        label = f"{name} ({profile.execution}), {len(graph.kernels)} kernels"
        print(
            f"{label}: before {old * 1e3:.0f} ms, after {new * 1e3:.0f} ms, "
            f"after/before {new / old:.2f} (median of {rounds})"
        )


def search_rate(
    events_before,
    incremental_path: str,
    cost_models_path: str | None,
    rounds: int,
    evaluations: int,
) -> None:
    import disco_xla.search.backtracking as backtracking_after
    from disco_xla.search.xla_fusion import xla_fusion_plan
    from disco_xla.simulator import cost_models
    from disco_xla.simulator.profiles import load_profile

    incremental_before = load_file(
        "incremental_before",
        incremental_path,
        {"disco_xla.simulator.events": events_before},
    )
    backtracking_before = load_file(
        "backtracking_before",
        backtracking_after.__file__,
        {
            "disco_xla.simulator.events": events_before,
            "disco_xla.simulator.incremental": incremental_before,
        },
    )
    module, compiled, _ = zoo_cache.captured_and_compiled("resnet50")
    profile = load_profile("a100-2x8-100g")
    cost_models_before = (
        load_file("cost_models_before", cost_models_path) if cost_models_path else cost_models
    )
    cost_model = {
        "before": cost_models_before.RooflineCostModel(profile),
        "after": cost_models.RooflineCostModel(profile),
    }
    plan = xla_fusion_plan(module, compiled)
    rates: dict[str, list[float]] = {"before": [], "after": []}
    found: dict[str, set[float]] = {"before": set(), "after": set()}
    for round_index in range(rounds):
        pair = (("before", backtracking_before), ("after", backtracking_after))
        for label, backtracking in pair if round_index % 2 else pair[::-1]:
            result = backtracking.search(
                module,
                profile,
                cost_model[label],
                [plan],
                max_evaluations=evaluations,
                budget_s=600,
            )
            rates[label].append(result.evaluations / result.search_s)
            found[label].add(result.iteration_s)
    old, new = statistics.median(rates["before"]), statistics.median(rates["after"])
    print(
        f"search on ResNet-50 (a100-2x8-100g, {evaluations} evaluations): before "
        f"{old:.0f} evaluations/s, after {new:.0f} evaluations/s, after/before "
        f"{new / old:.2f} (median of {rounds}); best plan {sorted(found['after'])[0] * 1e3:.3f} ms"
    )
    if found["before"] != found["after"]:
        print(f"the two searches found different plans: {found}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="path of the other events.py")
    parser.add_argument("--incremental", help="path of the other incremental.py (search rate)")
    parser.add_argument(
        "--cost-models", help="path of the other cost_models.py (the search's roofline)"
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--search-rounds", type=int, default=5)
    parser.add_argument("--evaluations", type=int, default=5000)
    parser.add_argument("--kernels", type=int, default=50_000)
    args = parser.parse_args()
    zoo_cache.use_devices(8)
    before = load_file("events_before", args.before)
    full_simulation(before, args.rounds, args.kernels)
    if args.incremental:
        search_rate(
            before, args.incremental, args.cost_models, args.search_rounds, args.evaluations
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
