"""`disco-xla eval-cost-model DATA... --model DIR`: the GNN's and the roofline's
errors on a data set, side by side."""

from __future__ import annotations

import argparse
import json

from disco_xla.costmodel.dataset import load_datasets
from disco_xla.costmodel.network import GnnCostModel
from disco_xla.costmodel.training import evaluate
from disco_xla.settings import DEFAULTS
from disco_xla.simulator.profiles import load_profile


def add_parser(commands, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "eval-cost-model", parents=[common], help="GNN and roofline errors on a data set"
    )
    parser.add_argument("datasets", nargs="+", help="data sets from `disco-xla profile`")
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--only-model", help="evaluate this model's kernels only")
    parser.add_argument(
        "--cluster", default=DEFAULTS.cluster, help="profile of the roofline shown beside the GNN"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model = GnnCostModel.load(args.model)
    dataset = load_datasets(args.datasets)
    report = evaluate(model, dataset, load_profile(args.cluster), args.only_model)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{report['samples']} kernels ({args.only_model or 'all models'}), model {args.model}")
    print("{:<10}{:>9}{:>13}{:>14}".format("", "MAPE", "median APE", "Kendall tau"))
    for name in ("gnn", "roofline"):
        row = report[name]
        print(f"{name:<10}{row['mape']:>9.1%}{row['median_ape']:>13.1%}{row['kendall_tau']:>14.3f}")
    return 0
