"""What running a step through disco-xla's `RewrittenStep` costs over JAX's own call.

For each zoo model, the unchanged `jit(shard_map)` training step is compiled twice
with the same passes: by JAX (`lowered.compile()`, called as JAX calls it) and
from its HLO through disco-xla's path (`runtime.jax_program.RewrittenStep`, the
program `disco_xla.jit` runs). Both are timed paired and rotating on 2 CPU
devices of this process, each call blocked on, and the script prints the median
of each and their paired ratio. A ratio near 1 means our dispatch adds nothing.

    .venv/bin/python benchmarks/dispatch_overhead.py [--model gpt2_small ...] [--rounds 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))

DEVICES = 2


def measure(name: str, rounds: int) -> dict:
    import jax
    import numpy as np
    from jax.sharding import Mesh
    from measure_speedup import _global_arguments, _time_paired

    from disco_xla.driver.planning import prepared
    from disco_xla.hlo.graph import HloModule
    from disco_xla.runtime.jax_program import kept_arguments, standing_in_for
    from disco_xla.zoo.jax_steps import AXIS, build_jax_step

    step = build_jax_step(name, "tiny", DEVICES, 2 * DEVICES, "shard_map")
    arguments = _global_arguments(step, Mesh(np.array(jax.devices()[:DEVICES]), (AXIS,)), AXIS)
    lowered = step.fn.lower(*arguments)
    compiled = lowered.compile()
    module = prepared(
        HloModule.from_bytes(
            lowered.compiler_ir("hlo").as_serialized_hlo_module_proto(), name, "memory"
        )
    )
    ours = standing_in_for(module, lowered, compiled)
    leaves = jax.tree_util.tree_leaves(arguments)
    kept_leaves = [leaves[i] for i in kept_arguments(lowered)]
    times = _time_paired(
        {"jax": lambda: compiled(*arguments), "disco-xla": lambda: ours(kept_leaves)},
        rounds,
        warmup=3,
    )
    paired = statistics.median(a / b for a, b in zip(times["disco-xla"], times["jax"], strict=True))
    return {
        "model": name,
        "arguments": len(kept_leaves),
        "results": len(jax.tree_util.tree_leaves(lowered.out_info)),
        "jax_ms": statistics.median(times["jax"]) * 1e3,
        "disco_xla_ms": statistics.median(times["disco-xla"]) * 1e3,
        "paired_ratio": paired,
        "load": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    rows = [measure(name, args.rounds) for name in args.model or ["gpt2_small", "vgg19"]]
    if args.json:
        print(json.dumps(rows))
        return 0
    print("| model | arguments | results | JAX ms | disco-xla ms | paired ratio | load |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['model']} | {r['arguments']} | {r['results']} | {r['jax_ms']:.3f} | "
            f"{r['disco_xla_ms']:.3f} | {r['paired_ratio']:.3f} | {r['load']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
