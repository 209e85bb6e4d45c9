"""The GNN kernel cost model trained on XLA's measured GEMM table and the
project's H200 kernel data, held out two ways, beside the tables and the
roofline (issue 56, "The GNN on the same measurements").

The table (openxla/xla `xla/service/gpu/model/matmul_interpolator_data.h`,
Apache License 2.0, The OpenXLA Authors; `simulator/gpu_tables.py`) becomes one
one-dot kernel sample per grid point (`costmodel/table_samples.py`).

**Shapes the GNN did not see** (`--axes`): for each axis, the points whose size
on it is 512 or 2048 (b: 2) are held out (two fifths of the points; a third for
b). The GNN trains on the other points of the H100 table (bf16 and f32), and
the table's own interpolation is rebuilt from the same other points
(`table_samples.gemm_table_of`): both then predict the held-out points.
`--mixed-axis` adds, for one axis, a GNN trained on those points and on every
H200 data set kernel too (the model that would ship for an H200).

**Model families the GNN did not see**: leave-one-family-out on the H200 data
(`benchmarks/data/h200/gpu.*.npz`, as `gnn_cost_model.py --by family`), the
GNN trained on the other families' kernels alone and with the whole H100 table
beside them (its times divided by the profile's `measured.compute_scale`, 1.0
for the H200: the `tables` cost model's own reading of the H100 table for an
H200), scored on the held-out family's kernels beside the `tables` cost model
(`table_samples.tables_seconds`) and the roofline of the same profile; and on
the held-out kernels that hold a dot.

    .venv/bin/python benchmarks/gnn_on_tables.py [--epochs 60] [--points N]
        [--axes m n k b] [--cluster h200-1x8-nvlink] [--json] [--out FILE]

`--points N` keeps N points of each element type's table, spread over it, and
`--max-steps` caps each training's optimizer steps: a test's tiny run.
`--patience P` sets the trainer's early-stopping patience (`training.PATIENCE`,
8 epochs) for this run: a table-only training has 3-5 steps an epoch.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# Held-out sizes per axis: every other interior grid size, so the kept sizes
# still bracket each held-out one and the table interpolates between them.
HELD_SIZES = {"b": (2,), "m": (512, 2048), "n": (512, 2048), "k": (512, 2048)}
DEFAULT_DATA = os.path.join(REPO_ROOT, "benchmarks", "data", "h200", "gpu.*.npz")


def _figures(predicted, measured) -> dict:
    """`training.error_figures` and the worst APE."""
    import numpy as np

    from disco_xla.costmodel.training import error_figures

    figures = error_figures(np.asarray(predicted), np.asarray(measured))
    figures["worst_ape"] = float(np.max(np.abs(predicted / measured - 1)))
    return figures


def spread_points(points, count: int | None):
    """`count` points of each element type, spread over its sorted table (all if None)."""
    import numpy as np

    if count is None:
        return list(points)
    chosen = []
    for element_type in sorted({p.element_type for p in points}):
        of_type = [p for p in points if p.element_type == element_type]
        picks = np.unique(np.linspace(0, len(of_type) - 1, min(count, len(of_type))).astype(int))
        chosen += [of_type[i] for i in picks]
    return chosen


def shape_rows(
    table_points, points, samples, axes, epochs, train_options, h200=None, mixed_axis=None
) -> list[dict]:
    """One row per held-out axis (and one more, with the H200 kernels in
    training, for `mixed_axis`): GNN and interpolated-table figures on the
    held-out `points` (`samples` are theirs). The interpolation knows every
    point of `table_points` (the whole table) off the held-out sizes; the
    GNN, those of `points` (all of them, or a spread subset)."""
    import numpy as np

    from disco_xla.costmodel.dataset import concatenate
    from disco_xla.costmodel.table_samples import gemm_table_of, held_out_along
    from disco_xla.costmodel.training import train

    position = {p.key: n for n, p in enumerate(points)}
    runs = [(axis, False) for axis in axes]
    if mixed_axis is not None and h200 is not None:
        runs.append((mixed_axis, True))
    rows = []
    for axis, mixed in runs:
        kept, held = held_out_along(points, axis, HELD_SIZES[axis])
        if not kept or not held:
            continue
        train_data = samples.subset([position[p.key] for p in kept])
        if mixed:
            train_data = concatenate([train_data, h200])
        test = samples.subset([position[p.key] for p in held])
        started = time.perf_counter()
        gnn, report = train(train_data, epochs=epochs, **train_options)
        train_s = time.perf_counter() - started
        predicted = gnn.predict_features(gnn.config.featurize(test))
        table = gemm_table_of(held_out_along(table_points, axis, HELD_SIZES[axis])[0])
        interpolated = np.array([table.seconds(p.b, p.m, p.n, p.k, p.element_type) for p in held])
        row = {
            "held_out_axis": axis,
            "held_out_sizes": list(HELD_SIZES[axis]),
            "trained_on": "table + H200 kernels" if mixed else "table",
            "train_points": len(kept),
            "train_kernels": report["train_samples"],
            "held_out_points": len(held),
            "epochs": report["epochs"],
            "steps": report["steps"],
            "train_s": round(train_s, 1),
            "gnn": _figures(predicted, test.time_s),
            "table_interpolation": _figures(interpolated, test.time_s),
        }
        for element_type in sorted({p.element_type for p in held}):
            chosen = np.array([p.element_type == element_type for p in held])
            row[f"gnn_{element_type}"] = _figures(predicted[chosen], test.time_s[chosen])
            row[f"table_interpolation_{element_type}"] = _figures(
                interpolated[chosen], test.time_s[chosen]
            )
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def family_rows(h200, table, profile, epochs, train_options, families=None) -> list[dict]:
    """Leave-one-family-out on `h200`: the GNN without and with `table` in
    training, the `tables` cost model and the roofline, on the held-out kernels
    (all of them, and those holding a dot)."""
    import numpy as np

    from benchmarks.gnn_cost_model import held_out_groups
    from disco_xla.costmodel.dataset import concatenate
    from disco_xla.costmodel.table_samples import tables_seconds
    from disco_xla.costmodel.training import library_kernels, measured, roofline_s, train

    kernels = measured(h200)
    with_table = concatenate([h200, table])
    rows = []
    for family, models in held_out_groups(h200, "family").items():
        if families and family not in families:
            continue
        held = kernels.subset(np.flatnonzero(np.isin(kernels.model, models)))
        dots = library_kernels(held)
        predictions = {
            "tables": tables_seconds(held, profile),
            "roofline": roofline_s(held, profile),
        }
        row = {"held_out": family, "held_out_models": models, "kernels": len(held)}
        for name, data in (("gnn", h200), ("gnn_with_table", with_table)):
            started = time.perf_counter()
            gnn, report = train(data, epochs=epochs, hold_out_models=models, **train_options)
            leaked = sorted(set(report["models"]) & set(models))
            if leaked:  # never expected: the split would not be honest
                raise AssertionError(f"held-out family {family}: {leaked} in training")
            predictions[name] = gnn.predict_features(gnn.config.featurize(held))
            row[f"{name}_train_kernels"] = report["train_samples"]
            row[f"{name}_epochs"] = report["epochs"]
            row[f"{name}_train_s"] = round(time.perf_counter() - started, 1)
        row["dot_kernels"] = int(dots.sum())
        for name, predicted in predictions.items():
            row[name] = _figures(predicted, held.time_s)
            row[f"{name}_dots"] = (
                _figures(predicted[dots], held.time_s[dots]) if dots.sum() > 1 else None
            )
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def _cell(figures: dict | None) -> str:
    if figures is None:
        return "-"
    return f"{figures['mape']:.1%} / {figures['median_ape']:.1%} / {figures['kendall_tau']:.3f}"


def print_tables(result: dict) -> None:
    if result["shapes"]:
        print("Held-out GEMM table points (MAPE / median APE / τ; worst APE)\n")
        print("| held-out axis (sizes) | trained on | train points | held-out points |"
              " GNN | GNN worst | table interpolation | table worst |")  # fmt: skip
        print("| --- | --- | ---: | ---: | --- | ---: | --- | ---: |")
        for row in result["shapes"]:
            gnn, table = row["gnn"], row["table_interpolation"]
            sizes = ", ".join(str(s) for s in row["held_out_sizes"])
            print(
                f"| {row['held_out_axis']} ({sizes}) | {row['trained_on']} | "
                f"{row['train_points']} | {row['held_out_points']} | {_cell(gnn)} | "
                f"{gnn['worst_ape']:.1%} | {_cell(table)} | {table['worst_ape']:.1%} |"
            )
        print()
    if result["families"]:
        print("Held-out H200 families (MAPE / median APE / τ)\n")
        print("| held-out family | kernels | GNN | GNN + table | tables | roofline |"
              " dot kernels | GNN, dots | GNN + table, dots | tables, dots |")  # fmt: skip
        print("| --- | ---: | --- | --- | --- | --- | ---: | --- | --- | --- |")
        for row in result["families"]:
            print(
                f"| {row['held_out']} | {row['kernels']} | {_cell(row['gnn'])} | "
                f"{_cell(row['gnn_with_table'])} | {_cell(row['tables'])} | "
                f"{_cell(row['roofline'])} | {row['dot_kernels']} | {_cell(row['gnn_dots'])} | "
                f"{_cell(row['gnn_with_table_dots'])} | {_cell(row['tables_dots'])} |"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", nargs="*", help=f"H200 data sets (default {DEFAULT_DATA})")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--max-steps", type=int, help="optimizer steps per training (tests)")
    parser.add_argument("--patience", type=int, help="early-stopping patience, epochs")
    parser.add_argument("--points", type=int, help="table points of each element type kept")
    parser.add_argument("--arch", default="sm_90", help="the GEMM table's architecture")
    parser.add_argument("--axes", nargs="*", default=["m", "n", "k", "b"], choices=HELD_SIZES)
    parser.add_argument("--mixed-axis", choices=HELD_SIZES, help="also train with H200 data")
    parser.add_argument("--families", nargs="*", help="only these held-out families")
    parser.add_argument("--no-families", action="store_true", help="skip the H200 part")
    parser.add_argument("--cluster", default="h200-1x8-nvlink")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()

    from disco_xla.costmodel import training
    from disco_xla.costmodel.dataset import load_datasets
    from disco_xla.costmodel.table_samples import gemm_points, table_samples
    from disco_xla.errors import DiscoInputError
    from disco_xla.simulator.profiles import load_profile

    if args.patience is not None:
        training.PATIENCE = args.patience
    train_options = {"max_steps": args.max_steps, "seed": args.seed}
    started = time.perf_counter()
    try:
        profile = load_profile(args.cluster)
        if profile.measured is None:
            raise DiscoInputError(args.cluster, "the profile has no measured GPU figures")
        table_points = gemm_points(args.arch)
        points = spread_points(table_points, args.points)
        samples = table_samples(points)  # the table's own times: the shapes part
        samples_s = time.perf_counter() - started
        paths = args.datasets or sorted(glob.glob(DEFAULT_DATA))
        needs_h200 = not args.no_families or args.mixed_axis
        h200 = load_datasets(paths) if needs_h200 else None
        shapes = shape_rows(
            table_points,
            points,
            samples,
            args.axes,
            args.epochs,
            train_options,
            h200,
            args.mixed_axis,
        )
        families = []
        if not args.no_families:
            scale = profile.measured.compute_scale
            table = samples if scale == 1.0 else table_samples(points, compute_scale=scale)
            families = family_rows(h200, table, profile, args.epochs, train_options, args.families)
    except DiscoInputError as error:
        print(f"gnn_on_tables.py: error: {error}", file=sys.stderr)
        return 2
    result = {
        "arch": args.arch,
        "table_points": len(points),
        "cluster": profile.name,
        "compute_scale": profile.measured.compute_scale,
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "patience": training.PATIENCE,
        "seed": args.seed,
        "samples_s": round(samples_s, 1),
        "total_s": round(time.perf_counter() - started, 1),
        "shapes": shapes,
        "families": families,
    }
    if args.out:
        with open(args.out, "w") as file:
            json.dump(result, file, indent=1)
    if args.json:
        print(json.dumps(result))
    else:
        print_tables(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
