"""XLA's fusion mapped onto the zoo's full-size captures, against XLA's own kernels.

For each model (8 replicas, as `search_table.py` uses them, cached under build/):
the compiled module's kernels, the groups of the op_name mapping
(`xla_fusion_groups`), the groups of the plan the baselines use (`xla_fusion_plan`,
with unconnected groups cut apart), and the largest group of each.

    .venv/bin/python benchmarks/xla_fusion_mapping.py [--models ...]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import zoo_cache  # noqa: E402
from benchmarks.search_table import MODELS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--replicas", type=int, default=8)
    args = parser.parse_args()
    zoo_cache.use_devices(args.replicas)
    from disco_xla.plan import compute_instructions
    from disco_xla.search.xla_fusion import xla_fusion_groups, xla_fusion_plan

    print("| model | XLA's kernels | mapped groups | largest | after the cut | largest |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for model in args.models:
        module, compiled, _ = zoo_cache.captured_and_compiled(model, args.replicas)
        joined = xla_fusion_groups(module, compiled)
        cut = xla_fusion_plan(module, compiled).fusion_groups
        print(
            f"| {model} | {len(compute_instructions(compiled))} | {len(joined)} | "
            f"{max(map(len, joined))} | {len(cut)} | {max(map(len, cut))} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
