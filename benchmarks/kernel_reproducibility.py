"""How well one collection of kernel times predicts another of the same kernels:
the accuracy a perfect cost model could show, judged by one collection on this
machine.

The GNN's held-out figures (`benchmarks/gnn_cost_model.py --by family`) compare
its predictions with one collection's kernel times: each distinct kernel's
median over the places it recurs in one module's profile. Those times move
between collections (the machine's speed drifts between and within the
minutes a model takes to profile), and a predictor cannot do better against
one collection than that collection's own reproducibility allows. So collect
the same modules twice (plans are sampled deterministically, so the same
kernels are timed) and treat the second collection as a model of the first,
with the same figures and the same per-family level as the GNN's table: MAPE,
median APE, Kendall τ, the level (median of second / first) and the MAPE once
divided by that level; and the same for the family's kernels that hold a dot or
a convolution (few, and the slowest).

    REPEATS=10 SIZES=tiny benchmarks/collect_cost_model_data.sh build/cc-first 3 MODELS...
    mkdir -p build/cc-second && cp -r build/cc-first/modules build/cc-second/
    REPEATS=10 SIZES=tiny benchmarks/collect_cost_model_data.sh build/cc-second 3 MODELS...
    .venv/bin/python benchmarks/kernel_reproducibility.py \
        --first build/cc-first/*.npz --second build/cc-second/*.npz [--json]

`--speed-normalised` first rescales both collections to one speed of the
machine (`profiling/speed_reference.py`: each sample's time x the median
reference / its own), which asks whether the reference follows the drift.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def kernel_medians(dataset) -> dict[tuple[str, str], tuple[str, float, bool]]:
    """{(module, structural hash): (model, median time in seconds, whether it
    holds a dot or a convolution)}, one entry per distinct kernel of each
    module, as the GNN is evaluated."""
    from disco_xla.costmodel.training import library_kernels, measured

    distinct = measured(dataset)
    columns = zip(
        distinct.module,
        distinct.structural_hash,
        distinct.model,
        distinct.time_s,
        library_kernels(distinct),
        strict=True,
    )
    return {
        (str(module), str(key)): (str(model), float(time_s), bool(library))
        for module, key, model, time_s, library in columns
    }


def reproducibility(first, second) -> list[dict]:
    """One row per family (and one for all), over the kernels both data sets
    hold: the second collection's times scored as predictions of the first's."""
    import numpy as np

    from disco_xla.costmodel.dataset import model_family
    from disco_xla.costmodel.training import error_figures

    a, b = kernel_medians(first), kernel_medians(second)
    common = sorted(set(a) & set(b))
    by_family: dict[str, list[tuple[str, str]]] = {}
    for key in common:
        by_family.setdefault(model_family(a[key][0]), []).append(key)
    rows = []
    for family, keys in sorted(by_family.items()) + [("all", common)]:
        first_s = np.array([a[key][1] for key in keys])
        second_s = np.array([b[key][1] for key in keys])
        library = np.array([a[key][2] for key in keys], bool)
        rows.append(
            {
                "family": family,
                "models": sorted({a[key][0] for key in keys}),
                "kernels": len(keys),
                **error_figures(second_s, first_s),
                "library_kernels": int(library.sum()),
                "library": error_figures(second_s[library], first_s[library])
                if library.sum() > 1
                else None,
            }
        )
    return rows


def _normalised_together(first, second):
    """Both collections at one speed: the median reference of the two together."""
    import numpy as np

    from disco_xla.profiling.speed_reference import speed_normalised

    nominal = float(np.median(np.concatenate([first.reference_s, second.reference_s])))
    return (
        speed_normalised(first, nominal, "the first collection"),
        speed_normalised(second, nominal, "the second collection"),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first", nargs="+", required=True, help="the first collection's .npz")
    parser.add_argument("--second", nargs="+", required=True, help="the second collection's .npz")
    parser.add_argument(
        "--speed-normalised",
        action="store_true",
        help="rescale both collections' times to one speed reference (their median)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = parser.parse_args()
    from disco_xla.costmodel.dataset import load_datasets
    from disco_xla.errors import DiscoInputError

    try:
        first, second = load_datasets(args.first), load_datasets(args.second)
        if args.speed_normalised:
            first, second = _normalised_together(first, second)
        rows = reproducibility(first, second)
    except DiscoInputError as error:
        print(f"kernel_reproducibility: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        "| family | kernels | MAPE | median APE | τ | level | MAPE at level"
        " | dot/conv kernels | their τ | their MAPE at level |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        library = row["library"] or {"kendall_tau": float("nan"), "mape_at_level": float("nan")}
        print(
            f"| {row['family']} | {row['kernels']} | {row['mape']:.1%} | {row['median_ape']:.1%}"
            f" | {row['kendall_tau']:.3f} | {row['level']:.2f} | {row['mape_at_level']:.1%}"
            f" | {row['library_kernels']} | {library['kendall_tau']:.3f}"
            f" | {library['mape_at_level']:.1%} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
