"""The GPU collective prices against published nccl-tests points.

    .venv/bin/python benchmarks/collective_prices.py [--json]

Prices each published all-reduce with the shipped H100 InfiniBand profile
(`h100-32x8-ib400` at the point's node count; `simulator.nccl`: XLA's measured
table inside a node, NCCL's tuning model with published achieved bandwidths
across nodes) and prints the error, point by point. The points and their
sources (bus bandwidth, busbw = S/t x 2(n-1)/n, as nccl-tests prints it):

- inside one node: Azure ND H100 v5, NVLS forced, NCCL 2.18.5
  (Azure/AI-benchmarking-guide, Azure Results/ND_H100_v5_results.md); ring
  with NVLS off, 368.76 GB/s at its plateau (NVIDIA/nccl-tests #309);
- across nodes: AWS p5.48xlarge (8 H100s, 3.2 Tbit/s of EFA a node), NCCL
  2.28.7 (crazyguitar/aws-gpu-communication-benchmark data/nccl_all_reduce.csv);
  2 x 8 H100 on InfiniBand, NCCL 2.20.5, through PyTorch
  (drmysore/nebius-h100-16gpu-benchmark README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from disco_xla.simulator.comm import all_reduce_s  # noqa: E402
from disco_xla.simulator.profiles import load_profile  # noqa: E402

GiB = 2**30
# (source, nodes, bytes, published bus bandwidth in GB/s)
POINTS = [
    *(
        ("azure-nvls", 1, size, busbw)
        for size, busbw in (
            (1 << 20, 43.70),
            (4 << 20, 128.73),
            (16 << 20, 234.45),
            (64 << 20, 361.78),
            (256 << 20, 423.38),
            (GiB, 466.35),
            (8 * GiB, 478.87),
        )
    ),
    ("nccl-tests-309-ring", 1, 8 * GiB, 368.76),
    *(
        ("aws-p5", nodes, size, busbw)
        for nodes, row in {
            2: (147.3, 305.1, 396.0, 435.1, 465.8, 477.7),
            4: (95.4, 229.5, 278.4, 280.3, 354.5, 357.0),
            8: (86.7, 156.3, 272.6, 274.5, 351.3, 355.4),
            16: (74.9, 129.2, 223.8, 269.2, 306.2, 356.3),
            32: (66.3, 115.8, 156.8, 220.1, 302.8, 321.1),
        }.items()
        for size, busbw in zip((32e6, 128e6, 512e6, 1e9, 4e9, 8e9), row, strict=True)
    ),
    *(
        ("nebius-ib", 2, size, size / seconds * 2 * 15 / 16 / 1e9)
        for size, seconds in ((1e6, 88e-6), (10e6, 157e-6), (100e6, 647e-6), (1e9, 4.52e-3))
    ),
]


def rows() -> list[dict]:
    profile = load_profile("h100-32x8-ib400")
    found = []
    for source, nodes, size, busbw in POINTS:
        ranks = 8 * nodes
        published = size * 2 * (ranks - 1) / ranks / (busbw * 1e9)
        predicted = all_reduce_s(size, replace(profile, nodes=nodes))
        found.append(
            {
                "source": source,
                "nodes": nodes,
                "bytes": size,
                "published_us": published * 1e6,
                "predicted_us": predicted * 1e6,
                "error": predicted / published - 1,
            }
        )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = rows()
    by_source = {}
    for row in found:
        by_source.setdefault(row["source"], []).append(abs(row["error"]))
    totals = {
        source: {"points": len(e), "median_abs_error": statistics.median(e), "worst": max(e)}
        for source, e in by_source.items()
    }
    large = [abs(r["error"]) for r in found if r["bytes"] >= 4e9]
    totals["all_at_4GB_or_more"] = {"points": len(large), "worst": max(large)}
    if args.json:
        print(json.dumps({"rows": found, "summary": totals}))
        return 0
    print("| source | nodes | bytes | published us | predicted us | error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in found:
        print(
            f"| {r['source']} | {r['nodes']} | {r['bytes']:.3g} | {r['published_us']:.1f} | "
            f"{r['predicted_us']:.1f} | {100 * r['error']:+.1f}% |"
        )
    print(json.dumps(totals, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
