"""GEMMs timed on this machine's accelerator against XLA's measured table: the
check a lent GPU runs first (issue 56, item 8).

    .venv/bin/python benchmarks/gemm_against_tables.py [--platform gpu] [--json]
        [--shapes grid|llama|tiny] [--repeats N]

Each (b, m, n, k) bf16 product runs as one jitted `jnp.einsum`, timed as the
median of `--repeats` runs after a warm-up (each run blocks until done), and is
set against `simulator.gpu_tables.GemmTable` for the architecture given
(`--arch`, default H100's `sm_90`):

- `grid`: points of the table itself (how far this device is from XLA's H100);
- `llama`: off-grid shapes of the Llama steps the published runs price (the MLP
  and attention projections of Llama2-7B at 4 x 4096 tokens a GPU, and 8192^3),
  where the table is extrapolated;
- `tiny`: small shapes, to try the script on a CPU (the table says nothing of a
  CPU: the errors there only show that it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {
    "grid": [(1, s, s, s) for s in (512, 1024, 2048, 4096)] + [(4, 4096, 4096, 4096)],
    "llama": [
        (1, 16384, 11008, 4096),  # gate and up projections: 4 x 4096 tokens
        (1, 16384, 4096, 11008),  # down projection
        (1, 16384, 4096, 4096),  # query, key, value, output
        (1, 8192, 8192, 8192),
    ],
    "tiny": [(1, 64, 64, 64), (2, 128, 64, 32)],
}


def time_gemm(b: int, m: int, n: int, k: int, repeats: int, device) -> float:
    """Median seconds of one [b, m, k] x [b, k, n] bf16 product on `device`."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0))
    lhs = jax.device_put(jax.random.normal(keys[0], (b, m, k), jnp.bfloat16), device)
    rhs = jax.device_put(jax.random.normal(keys[1], (b, k, n), jnp.bfloat16), device)
    product = jax.jit(lambda x, y: jnp.einsum("bmk,bkn->bmn", x, y))
    product(lhs, rhs).block_until_ready()  # compile and warm up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        product(lhs, rhs).block_until_ready()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def rows(platform: str, shapes: str, repeats: int, arch: str) -> list[dict]:
    import jax

    from disco_xla.simulator.gpu_tables import GemmTable

    device = jax.devices(platform)[0]
    table = GemmTable(arch)
    found = []
    for b, m, n, k in SHAPES[shapes]:
        measured = time_gemm(b, m, n, k, repeats, device)
        predicted = table.seconds(b, m, n, k, "bf16")
        found.append(
            {
                "shape": [b, m, n, k],
                "device": device.device_kind,
                "measured_s": measured,
                "table_s": predicted,
                "measured_tflop_s": 2 * b * m * n * k / measured / 1e12,
                "error": predicted / measured - 1,
            }
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", default="gpu")
    parser.add_argument("--shapes", default="grid", choices=sorted(SHAPES))
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--arch", default="sm_90", help="the table's architecture")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = rows(args.platform, args.shapes, args.repeats, args.arch)
    if args.json:
        print(json.dumps({"rows": found}))
        return 0
    print("| b, m, n, k | device | measured ms | table ms | TFLOP/s | table error |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for r in found:
        print(
            f"| {r['shape']} | {r['device']} | {1e3 * r['measured_s']:.3f} | "
            f"{1e3 * r['table_s']:.3f} | {r['measured_tflop_s']:.1f} | {100 * r['error']:+.1f}% |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
