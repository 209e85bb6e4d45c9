"""The zoo at full size: parameters, gradient bytes, all-reduces, HLO size, capture time.

Each capture runs `disco-xla capture --json` in its own process on this machine's
CPU devices (lowering only: nothing full-size is run), and we read that process's
own peak memory from the kernel. Prints a Markdown table.

    .venv/bin/python benchmarks/zoo_table.py [--replicas 4] [--framework jax|tf|all]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from tqdm import tqdm

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from disco_xla.zoo import ZOO  # noqa: E402

# Global batch per replica: 32 images, or 8 sequences of 128 tokens.
_PER_REPLICA_BATCH = {"cnn": 32, "text": 8}
_TEXT_MODELS = {"bert_base", "bert_large", "transformer_base", "gpt2_small", "bert_encoder"}


def capture_one(name: str, framework: str, replicas: int, directory: str) -> dict:
    per_replica = _PER_REPLICA_BATCH["text" if name in _TEXT_MODELS else "cnn"]
    command = [
        os.path.join(os.path.dirname(sys.executable), "disco-xla"),
        "capture",
        "--model",
        name,
        "--framework",
        framework,
        "--size",
        "full",
        "--replicas",
        str(replicas),
        "--batch",
        str(per_replica * replicas),
        "--json",
        "-o",
        os.path.join(directory, f"{framework}_{name}.hlo.pb"),
    ]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - start
    stdout, stderr = process.stdout.read(), process.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{framework} {name} failed: {stderr.strip().splitlines()[-1:]}")
    report = json.loads(stdout)
    report["process_s"] = wall_s
    report["peak_memory_bytes"] = usage.ru_maxrss * 1024
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--framework", choices=["jax", "tf", "all"], default="all")
    args = parser.parse_args()
    entries = [e for e in ZOO if args.framework in ("all", e.framework)]
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for entry in tqdm(entries, disable=not sys.stderr.isatty(), desc="capturing"):
            rows.append(capture_one(entry.name, entry.framework, args.replicas, directory))
    print(f"Full-size captures on {args.replicas} CPU devices (`--replicas {args.replicas}`).\n")
    print(
        "| framework | model | parameters | gradient MB | gradient all-reduces | "
        "HLO instructions | capture s | process s | peak memory GB |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['framework']} | {row['model']} | {row['parameters']:,} | "
            f"{row['gradient_bytes'] / 1e6:.1f} | {row['gradient_all_reduces']} | "
            f"{row['instructions']:,} | {row['capture_s']:.1f} | {row['process_s']:.1f} | "
            f"{row['peak_memory_bytes'] / 1e9:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
