"""The search against every baseline on the zoo's full-size JAX models (issue 6).

For each model x cluster profile: every baseline's simulated iteration time, the
two ablations, the found plan, its speedup over `xla`, T/T_ideal, exposed
communication, bucket count, evaluations and search seconds; geo-means at the end.
The speedup is also given against `xla-overlap` (XLA with its latency-hiding
scheduler on), so that what overlap alone gives is visible, and T is also given
against T_ready, a bound that accounts for when the gradients are ready
(`ready_bound_s`).
All plans are simulated over the captured module (XLA's kernels mapped back onto
it), with the roofline cost model. Captures and XLA compiles are cached under
build/ (`benchmarks/zoo_cache.py`). Each of the three searches (fusion-only,
bucketing-only, found) gets the whole budget.

Targets: geo-mean speedup vs `xla` >= 1.15x; never slower than any baseline;
geo-mean T/T_ideal <= 1.05; BERT-large's search within 60 s on this machine.

    .venv/bin/python benchmarks/search_table.py [--models ...] [--clusters ...]
        [--budget-s S] [--max-evals N] [--seed K]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import zoo_cache  # noqa: E402

MODELS = (
    "resnet50",
    "vgg19",
    "inception_v3",
    "bert_base",
    "bert_large",
    "transformer_base",
    "gpt2_small",
)
CLUSTERS = ("v100-2x8-25g", "a100-2x8-100g", "h200-8x8-ib400")


def ready_bound_s(module, comparison, profile, cost_model) -> float:
    """A bound that accounts for when gradients are ready: with XLA's fusion and
    overlapped communication on one stream, no bucketing ends before any
    gradient's ready time plus one all-reduce of every byte ready at or after it,
    nor before the compute ends. T_ideal = max(C, A) assumes instead that every
    byte could be sent while compute runs."""
    from disco_xla.search.baselines import gradients_in_ready_order
    from disco_xla.simulator.comm import all_reduce_s
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph

    plan = comparison.baselines["xla-nocombine"].plan
    result = simulate(build_task_graph(module, plan), profile, cost_model)
    ready = result.collective_ready_s
    gradients = gradients_in_ready_order(module, ready)
    remaining = sum(size for _, size in gradients)
    bound = result.compute_s
    for name, size in gradients:
        bound = max(bound, ready[name] + all_reduce_s(remaining, profile))
        remaining -= size
    return bound


def geo_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--clusters", nargs="+", default=list(CLUSTERS))
    parser.add_argument("--budget-s", type=float, default=20.0, help="per search")
    parser.add_argument("--max-evals", type=int, default=2000, help="per search")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=8)
    args = parser.parse_args()
    zoo_cache.use_devices(args.replicas)
    from disco_xla.search.fusion_source import compiled_fusion
    from disco_xla.search.pipeline import ROWS, Pricing, plan_module
    from disco_xla.settings import OptimizeSettings
    from disco_xla.simulator.cost_models import RooflineCostModel
    from disco_xla.simulator.profiles import load_profile

    columns = [*ROWS]
    short = {
        "xla-nocombine": "xla-nc",
        "xla-overlap": "xla-ov",
        "horovod-legacy": "hvd-old",
        "horovod": "hvd",
    }
    print(
        f"Simulated iteration ms; {args.replicas}-replica full-size captures; roofline cost "
        f"model; each search at most {args.max_evals} evaluations and {args.budget_s:g} s.\n"
    )
    head = ["model", "cluster"] + [short.get(c, c) for c in columns]
    head += ["vs xla", "vs xla-ov", "T/T_ideal", "T/T_ready", "exposed ms", "buckets"]
    head += ["evals", "search s"]
    print("| " + " | ".join(head) + " |")
    print("| " + " | ".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + " |")
    speedups, overlap_speedups, ratios, slower, bert_large_s = [], [], [], [], []
    ready_ratios = []
    for model in args.models:
        module, compiled, prepare_s = zoo_cache.captured_and_compiled(model, args.replicas)
        if prepare_s > 1:
            print(f"<!-- {model}: capture and compile {prepare_s:.0f} s -->")
        for cluster in args.clusters:
            profile = load_profile(cluster)
            started = time.perf_counter()
            settings = OptimizeSettings(
                cluster=cluster,
                budget_s=args.budget_s,
                max_evaluations=args.max_evals,
                seed=args.seed,
            )
            prices = Pricing(profile, RooflineCostModel(profile))  # the cluster's full size
            fusion = compiled_fusion(module, compiled)
            comparison = plan_module(module, settings, prices, fusion, ablations=True)
            total_s = time.perf_counter() - started
            results = comparison.results
            found = results["found"]
            speedup = results["xla"].iteration_s / found.iteration_s
            speedups.append(speedup)
            overlap_speedup = results["xla-overlap"].iteration_s / found.iteration_s
            overlap_speedups.append(overlap_speedup)
            ratios.append(found.t_over_ideal)
            cost_model = RooflineCostModel(profile)
            ready_ratios.append(
                found.iteration_s / ready_bound_s(module, comparison, profile, cost_model)
            )
            slower += [
                (model, cluster, name)
                for name in ROWS
                if results[name].iteration_s < found.iteration_s
            ]
            if model == "bert_large":
                bert_large_s.append(comparison.found.search_s)
            row = [model, cluster] + [f"{results[c].iteration_s * 1e3:.2f}" for c in columns]
            row += [
                f"{speedup:.3f}x",
                f"{overlap_speedup:.3f}x",
                f"{found.t_over_ideal:.3f}",
                f"{ready_ratios[-1]:.3f}",
                f"{found.exposed_comm_s * 1e3:.2f}",
                str(found.buckets),
                str(comparison.found.evaluations),
                f"{comparison.found.search_s:.1f} ({total_s:.0f})",
            ]
            print("| " + " | ".join(row) + " |", flush=True)
    print(
        f"\ngeo-mean speedup vs xla {geo_mean(speedups):.3f}x (target >= 1.15x); "
        f"vs xla-overlap {geo_mean(overlap_speedups):.3f}x; "
        f"geo-mean T/T_ideal {geo_mean(ratios):.3f} (target <= 1.05); "
        f"geo-mean T/T_ready {geo_mean(ready_ratios):.3f}; "
        f"rows slower than a baseline: {len(slower)} (target 0)"
        + (
            f"; BERT-large search s: {', '.join(f'{s:.1f}' for s in bert_large_s)}"
            if bert_large_s
            else ""
        )
    )
    for model, cluster, name in slower:
        print(f"  slower than {name}: {model} on {cluster}")
    print("search s: the full search's seconds (in brackets: all three searches and simulations)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
