"""`disco-xla train-cost-model DATA... --out DIR`: train the GNN kernel cost
model (`costmodel/training.py`)."""

from __future__ import annotations

import argparse
import json
import sys

from disco_xla.costmodel.dataset import load_datasets
from disco_xla.costmodel.training import train_and_save


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    train = commands.add_parser(
        "train-cost-model", parents=[common], help="train the GNN kernel cost model"
    )
    train.add_argument("datasets", nargs="+", help="data sets from `disco-xla profile`")
    train.add_argument("--out", required=True, help="model directory to write")
    train.add_argument("--epochs", type=int, default=60, help="at most this many epochs")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--hold-out", help="leave this model's kernels out of training")
    train.add_argument(
        "--max-seconds", type=float, help="stop after the epoch that reaches this wall time"
    )
    train.add_argument(
        "--feature-set",
        type=int,
        choices=[1, 2, 3],
        default=None,
        help="node features: 1 plain; 2 with structural attributes (window, groups, ...); "
        "3 with those and a dot's or convolution's matrix-product shape and layout "
        "(default: the latest set)",
    )
    train.add_argument("--json", action="store_true", help="print one JSON object")
    train.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    dataset = load_datasets(args.datasets)
    chosen = {} if args.feature_set is None else {"feature_set": args.feature_set}
    report = train_and_save(
        dataset,
        args.out,
        epochs=args.epochs,
        seed=args.seed,
        hold_out_model=args.hold_out,
        max_seconds=args.max_seconds,
        **chosen,
        verbose=not args.json and sys.stderr.isatty(),
    )
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"wrote {args.out}: trained on {report['train_samples']} kernels, "
            f"validation MAPE {report['validation_mape']:.1%} after {report['epochs']} epochs, "
            f"{report['seconds']:.0f} s"
        )
    return 0
