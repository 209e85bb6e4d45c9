"""Leave-one-model-out accuracy of the GNN kernel cost model, beside the roofline.

For each model in the data sets (the model is the file name up to its first '.',
so `gpt2_small.tiny` and `gpt2_small.medium` are one model), train the GNN on
every other model's kernels and evaluate on the held-out model's kernels: MAPE,
median APE and Kendall τ of the GNN and of the roofline (`--cluster` profile).
Each distinct kernel of a module counts once, with the median of its measured
times. `--noise` adds the measurement's own spread: the APE of each repeated
measurement of a kernel (same module and structural hash, other plans or
layers) against that kernel's median.

    .venv/bin/python benchmarks/gnn_cost_model.py build/costmodel-data/*.npz \
        [--epochs 60] [--cluster cpu-local] [--out build/gnn-lomo.json]
"""

from __future__ import annotations

import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def measurement_noise(dataset) -> dict:
    import numpy as np

    keep = (dataset.kernel_count > 0) & (dataset.time_s > 0)
    groups: dict[tuple[str, str], list[float]] = {}
    for module, key, time_s in zip(
        dataset.module[keep], dataset.structural_hash[keep], dataset.time_s[keep], strict=True
    ):
        groups.setdefault((str(module), str(key)), []).append(float(time_s))
    errors = [
        abs(t - np.median(times)) / np.median(times)
        for times in groups.values()
        if len(times) > 1
        for t in times
    ]
    if not errors:
        return {"repeated_samples": 0}
    return {
        "repeated_samples": len(errors),
        "mape": float(np.mean(errors)),
        "median_ape": float(np.median(errors)),
    }


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--cluster", default="cpu-local")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    from disco_xla.profiling.dataset import load_datasets
    from disco_xla.profiling.train_cost_model import evaluate, measured, train
    from disco_xla.simulator.profiles import load_profile

    dataset = load_datasets(args.datasets)
    profile = load_profile(args.cluster)
    distinct = measured(dataset)
    models = sorted(set(dataset.model.tolist()))
    rows = []
    for model in models:
        gnn, report = train(dataset, epochs=args.epochs, hold_out_model=model)
        figures = evaluate(gnn, dataset, profile, only_model=model)
        rows.append(
            {
                "held_out": model,
                "train_kernels": report["train_samples"],
                "epochs": report["epochs"],
                "train_s": round(report["seconds"], 1),
                **{k: figures[k] for k in ("samples", "gnn", "roofline")},
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "samples": len(dataset),
        "samples_with_kernels": int((dataset.kernel_count > 0).sum()),
        "distinct_kernels": len(distinct),
        "models": models,
        "cluster": profile.name,
        "epochs": args.epochs,
        "noise": measurement_noise(dataset),
        "leave_one_model_out": rows,
    }
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=1)
    print("| held-out model | kernels | GNN MAPE | GNN median APE | GNN τ |"
          " roofline MAPE | roofline median APE | roofline τ |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        gnn, roof = row["gnn"], row["roofline"]
        print(
            f"| {row['held_out']} | {row['samples']} | {gnn['mape']:.1%} | "
            f"{gnn['median_ape']:.1%} | {gnn['kendall_tau']:.3f} | {roof['mape']:.1%} | "
            f"{roof['median_ape']:.1%} | {roof['kendall_tau']:.3f} |"
        )
    print(json.dumps({k: v for k, v in result.items() if k != "leave_one_model_out"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
