"""Where the GNN's error on a held-out model lies: its kernels split by kind
(holding a dot or a convolution or not), by measured time and by op class, with
each part's MAPE, Kendall τ, level and share of the absolute error, and the
kernels it misses most. A diagnosis for `gnn_cost_model.py`'s held-out figures
(issue 16, item 4): one training without `--hold-out`'s models, then these
figures on their kernels alone.

    .venv/bin/python benchmarks/gnn_error_breakdown.py benchmarks/data/h200/gpu.*.npz \
        --hold-out resnet50 [--epochs 25 --max-steps 1500] [--worst 10] [--json]
"""

from __future__ import annotations

import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# Measured-time bins, in seconds: [low, high).
TIME_BINS_S = ((0.0, 2e-6), (2e-6, 5e-6), (5e-6, 20e-6), (20e-6, float("inf")))


def part_figures(predicted_s, measured_s, mask) -> dict | None:
    """The error figures of the kernels in `mask`, and their share of the
    held-out kernels' summed absolute error (None for fewer than two)."""
    import numpy as np

    from disco_xla.costmodel.training import error_figures

    if int(mask.sum()) < 2:
        return None
    error = np.abs(predicted_s - measured_s)
    figures = error_figures(predicted_s[mask], measured_s[mask])
    figures["kernels"] = int(mask.sum())
    figures["share_of_error"] = float(error[mask].sum() / error.sum())
    return figures


def breakdown(data, predicted_s, worst: int = 10) -> dict:
    """Error figures of the held-out kernels `data` (one per distinct kernel,
    `training.measured`) against `predicted_s`, by part."""
    import numpy as np

    from disco_xla.costmodel.training import error_figures, library_kernels

    measured_s = data.time_s
    library = library_kernels(data)
    parts = {
        "dot or convolution": library,
        "other": ~library,
        **{
            f"measured {low * 1e6:g}-{high * 1e6:g} us": (measured_s >= low) & (measured_s < high)
            for low, high in TIME_BINS_S
        },
        **{f"op class {c}": data.op_class == c for c in sorted(set(data.op_class.tolist()))},
    }
    relative = np.abs(predicted_s - measured_s) / measured_s
    misses = []
    for index in np.argsort(-relative, kind="stable")[:worst]:  # ties: data order
        graph = data.graph(int(index))
        misses.append(
            {
                "measured_us": float(measured_s[index] * 1e6),
                "predicted_us": float(predicted_s[index] * 1e6),
                "op_class": str(data.op_class[index]),
                "kernels_emitted": int(data.kernel_count[index]),
                "opcodes": sorted(set(graph.opcodes)),
                "flops": float(data.kernel_flops[index]),
                "bytes_in": float(data.kernel_bytes_in[index]),
            }
        )
    return {
        "all": error_figures(predicted_s, measured_s) | {"kernels": len(measured_s)},
        "parts": {
            name: figures
            for name, mask in parts.items()
            if (figures := part_figures(predicted_s, measured_s, mask)) is not None
        },
        "worst": misses,
    }


def print_report(model: str, report: dict) -> None:
    print(f"held out: {model}, {report['all']['kernels']} kernels")
    print("| part | kernels | MAPE | median APE | τ | level | share of the error |")
    print("|---|---|---|---|---|---|---|")
    for name, f in [("all", report["all"] | {"share_of_error": 1.0}), *report["parts"].items()]:
        print(
            f"| {name} | {f['kernels']} | {f['mape']:.1%} | {f['median_ape']:.1%} | "
            f"{f['kendall_tau']:.3f} | {f['level']:.2f} | {f['share_of_error']:.0%} |"
        )
    print("\nworst kernels (measured us, predicted us, class, opcodes):")
    for miss in report["worst"]:
        print(
            f"  {miss['measured_us']:8.2f} {miss['predicted_us']:8.2f} {miss['op_class']:12s} "
            f"{' '.join(miss['opcodes'])}"
        )


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="+")
    parser.add_argument("--hold-out", required=True, nargs="+", help="model(s) to hold out")
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--feature-set", type=int, choices=[1, 2, 3], default=3)
    parser.add_argument("--worst", type=int, default=10, help="kernels missed most to list")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    import numpy as np

    from disco_xla.costmodel.dataset import load_datasets
    from disco_xla.costmodel.training import measured, train
    from disco_xla.errors import DiscoInputError

    try:
        dataset = load_datasets(args.datasets)
        missing = sorted(set(args.hold_out) - set(dataset.model.tolist()))
        if missing:
            raise DiscoInputError(" ".join(args.datasets[:1]), f"no kernels of {missing}")
        gnn, training = train(
            dataset,
            epochs=args.epochs,
            max_steps=args.max_steps,
            hold_out_models=args.hold_out,
            feature_set=args.feature_set,
        )
    except DiscoInputError as error:
        print(f"gnn_error_breakdown.py: error: {error}", file=sys.stderr)
        return 2
    data = measured(dataset)
    data = data.subset(np.flatnonzero(np.isin(data.model, args.hold_out)))
    predicted_s = gnn.predict_features(gnn.config.featurize(data))
    report = breakdown(data, predicted_s, args.worst)
    report["held_out"] = args.hold_out
    report["train_models"] = training["models"]
    if args.json:
        print(json.dumps(report))
    else:
        print_report(", ".join(args.hold_out), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
