"""Kernel predictions per second of the GNN cost model on this machine's CPU.

Kernels: the fusion groups of sampled plans (XLA-like, unfused, random merges) of
tiny zoo models. After one warm-up pass (jit compiles the padded batch shapes),
we time:
- `uncached`: `predict_kernels` on every kernel with an empty cache (and no
  instruction's part of the structural hash computed yet): structural hashing,
  graph extraction, featurising, padding and the network, batched;
- `network only`: the same kernels' prepared features through the network;
- `cached`: the same call again, every kernel a cache hit (what the search sees
  for the kernels a move did not change).

    .venv/bin/python benchmarks/gnn_speed.py [--model DIR] [--plans 6]
"""

from __future__ import annotations

import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

MODELS = ("gpt2_small", "resnet50", "bert_base")


def main() -> int:
    import argparse

    import jax

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GNN model directory (default: the shipped CPU weights)")
    parser.add_argument("--plans", type=int, default=6, help="sampled plans per zoo model")
    args = parser.parse_args()
    jax.config.update("jax_num_cpu_devices", 2)
    from disco_xla.costmodel.features import kernel_graph
    from disco_xla.costmodel.network import GnnCostModel, stack_graphs
    from disco_xla.costmodel.weights import default_model_directory
    from disco_xla.profiling.sample_plans import group_kernels, sample_plans
    from disco_xla.zoo import capture_model

    model = GnnCostModel.load(args.model or default_model_directory())
    kernels, modules = [], []
    for name in MODELS:
        module = capture_model(name, "jax", replicas=2).module
        modules.append(module)
        for _, plan in sample_plans(module, args.plans, seed=0):
            kernels += group_kernels(module, plan)
    distinct = len({k.structural_hash for k in kernels})

    model.predict_kernels(kernels)  # warm-up: compiles the batch shapes
    model.clear_cache()
    for module in modules:  # the instructions' signatures, among the module's analyses
        module.analyses.clear()
    start = time.perf_counter()
    model.predict_kernels(kernels)
    uncached_s = time.perf_counter() - start

    features = model.config.featurize(stack_graphs([kernel_graph(k) for k in kernels]))
    model.predict_features(features)
    start = time.perf_counter()
    model.predict_features(features)
    network_s = time.perf_counter() - start

    start = time.perf_counter()
    model.predict_kernels(kernels)
    cached_s = time.perf_counter() - start
    report = {
        "kernels": len(kernels),
        "distinct_kernels": distinct,
        "uncached_kernels_per_s": len(kernels) / uncached_s,
        "uncached_distinct_per_s": distinct / uncached_s,
        "network_only_kernels_per_s": len(kernels) / network_s,
        "cached_kernels_per_s": len(kernels) / cached_s,
        "cpu_cores": os.cpu_count(),
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
