"""Time of the fusion-boundaries pass (`OutlineFusionGroups`) on TF zoo steps.

For each model (tiny, batch 2) the step's HLO is captured from TensorFlow, a plan
is searched (20 evaluations, no cache), and the pass runs on fresh copies of the
module; the median of `--repeats` runs is printed, with the module's size.
`--implementation PATH` times instead the function `outline_fusion_groups(module,
plan)` of another file (e.g. a version of the pass written out with `git show`).

    .venv/bin/python benchmarks/outline_speed.py [--models resnet50 inception_v3]
        [--repeats 3] [--implementation PATH] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _outline_function(path: str | None):
    if path is None:
        from disco_xla.hlo_passes.fusion_boundaries import OutlineFusionGroups
        from disco_xla.plan import departing_groups

        return lambda module, plan: OutlineFusionGroups(
            plan.fusion_groups, departing_groups(module, plan, None)
        ).run(module)
    spec = importlib.util.spec_from_file_location("outline_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.outline_fusion_groups


def measure(name: str, repeats: int, outline) -> dict:
    from disco_xla.driver.planning import OptimizeSettings, find_plan
    from disco_xla.hlo.graph import HloModule
    from disco_xla.runtime.xla_runner import compile_separately
    from disco_xla.zoo.tf_steps import build_tf_step

    step = build_tf_step(name, "tiny", batch=2)
    data = step.fn.experimental_get_compiler_ir(*step.args)(stage="hlo_serialized")
    module = HloModule.from_bytes(data, f"<tf:{name}>", "memory")
    settings = OptimizeSettings(max_evaluations=20, use_cache=False)
    plan = find_plan(module, settings, compile_separately).plan
    seconds = []
    for _ in range(repeats):
        copy = HloModule.from_bytes(module.to_bytes(), "copy")
        started = time.perf_counter()
        outline(copy, plan)
        seconds.append(time.perf_counter() - started)
    return {
        "model": name,
        "instructions": module.instruction_count,
        "groups": len(plan.fusion_groups),
        "groups_of_several": sum(len(g) > 1 for g in plan.fusion_groups),
        "median_s": statistics.median(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50", "inception_v3"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--implementation", default=None)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    outline = _outline_function(options.implementation)
    rows = [measure(name, options.repeats, outline) for name in options.models]
    if options.json:
        print(json.dumps(rows))
        return
    print(f"{'model':<14}{'instructions':>13}{'groups':>8}{'of several':>12}{'pass s':>9}")
    for row in rows:
        print(
            f"{row['model']:<14}{row['instructions']:>13}{row['groups']:>8}"
            f"{row['groups_of_several']:>12}{row['median_s']:>9.2f}"
        )


if __name__ == "__main__":
    main()
