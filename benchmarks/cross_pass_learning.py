"""Does learning collective costs from one measured run rank the programs of
another run better? (issue 16, items 1 and 3)

Reads the JSON rows of `rank_fidelity.py --passes 2 --json` (each model's
programs measured in two independent passes). For each model it makes the same
plans again (the search and the sampling are deterministic), and for the
programs the run measured it counts the collectives and tuple tensors each
sends (`step_time_fit.message_counts`) and simulates it with neither cost.
Then, for each direction (learn from pass 1, judge on pass 2, and back), it
ranks the programs three ways and gives Kendall τ and top-1 regret against the
pass not learned from:

- `profile`: the profile as shipped, nothing learned;
- `one cost`: one cost per message, a tuple's every tensor a message, the
  calibrated tuple tensor cost kept (how `step_time_fit` learned until session
  21);
- `two costs`: a cost per collective and a cost per tuple tensor after the
  first, fitted together (`step_time_fit.fit_collective_costs`, as `planning`
  learns them now).

With --tuple-tensor-s X (repeatable), also `tuple X`: the profile with its
tuple tensor cost set to X and nothing learned, to judge a calibrated figure
against another on the same measured programs.

Beside them, the first pass's times ranked against the second's: the figures
of the measurement itself, the ceiling for any simulator here.

    .venv/bin/python benchmarks/cross_pass_learning.py build/rf-keras-2pass.json [--json]
        [--tuple-tensor-s 7.1e-5 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
DEVICES = 4
MAX_EVALUATIONS = 300  # rank_fidelity.py's default
PLANS = 8


def programs_of(
    row: dict, tuple_tensor_s: tuple[float, ...] = ()
) -> tuple[dict[str, tuple[int, int, float, float]], dict[str, dict[str, float]]]:
    """({label: (collectives, tuple tensors, simulated bare, simulated with the
    profile)} for the programs of `row` (one model of a rank_fidelity run),
    {`tuple X`: {label: simulated with the profile's tuple tensor cost X}})."""
    from fusion_boundary_cost import captured
    from rank_fidelity import candidate_plans

    from disco_xla.driver.checked_rewrite import xla_own_groups
    from disco_xla.runtime.xla_runner import NO_COMBINER, compile_module
    from disco_xla.search import optimize
    from disco_xla.search.baselines import captured_baselines
    from disco_xla.simulator.cost_models import RooflineCostModel, boundary_charged
    from disco_xla.simulator.events import simulate
    from disco_xla.simulator.kernels import build_task_graph
    from disco_xla.simulator.profiles import load_profile
    from disco_xla.simulator.step_time_fit import message_counts

    module = captured(row["model"])
    compiled = compile_module(module, NO_COMBINER)
    profile = load_profile(row["cluster"], row.get("priced_at_workers"))  # as rank_fidelity
    bare = dataclasses.replace(profile, collective_message_s=0.0, tuple_all_reduce_element_s=0.0)
    baselines = captured_baselines(module, compiled, profile, RooflineCostModel(profile))
    found = optimize(module, row["cluster"], max_evaluations=MAX_EVALUATIONS, compiled=compiled)
    plans = candidate_plans(module, baselines, found, PLANS)
    model = boundary_charged(RooflineCostModel(profile), profile, xla_own_groups(module))
    rows, alternatives = {}, {f"tuple {x * 1e6:.1f} us": {} for x in tuple_tensor_s}
    for label in row["passes_s"][0]:
        if label == "xla":
            graph = baselines["xla"].task_graph()
        else:
            graph = build_task_graph(module, plans[label])
        collectives, tensors = message_counts(graph)
        rows[label] = (
            collectives,
            tensors,
            simulate(graph, bare, model).iteration_s,
            simulate(graph, profile, model).iteration_s,
        )
        for cost_s, way in zip(tuple_tensor_s, alternatives, strict=True):
            priced = dataclasses.replace(profile, tuple_all_reduce_element_s=cost_s)
            alternatives[way][label] = simulate(graph, priced, model).iteration_s
    return rows, alternatives


def rankings(
    programs: dict, learned_from: dict[str, float], calibrated_tensor_s: float
) -> dict[str, dict]:
    """{way: {label: simulated seconds}} for the three ways, learning from the
    measured times `learned_from`; a cost the fit cannot tell keeps the
    profile's, as `planning` does."""
    from disco_xla.simulator.step_time_fit import StepTime, fit_collective_costs

    one = fit_collective_costs(
        [
            StepTime("m", label, c + t, shipped, learned_from[label])
            for label, (c, t, _, shipped) in programs.items()
        ]
    )
    one_s = one.message_s or 0.0
    two = fit_collective_costs(
        [
            StepTime("m", label, c, bare, learned_from[label], t)
            for label, (c, t, bare, _) in programs.items()
        ]
    )
    message_s = two.message_s or 0.0
    tensor_s = calibrated_tensor_s if two.tuple_element_s is None else two.tuple_element_s
    return {
        "profile": {label: shipped for label, (_, _, _, shipped) in programs.items()},
        "one cost": {
            label: shipped + one_s * (c + t) for label, (c, t, _, shipped) in programs.items()
        },
        "two costs": {
            label: bare + message_s * c + tensor_s * t
            for label, (c, t, bare, _) in programs.items()
        },
        "learned": {"one cost": one_s, "two costs": (message_s, tensor_s)},
    }


def model_row(row: dict, tuple_tensor_s: tuple[float, ...] = ()) -> dict:
    from disco_xla.search.ranking import rank_fidelity
    from disco_xla.simulator.profiles import load_profile

    programs, alternatives = programs_of(row, tuple_tensor_s)
    priced = load_profile(row["cluster"], row.get("priced_at_workers"))
    calibrated_tensor_s = priced.tuple_all_reduce_element_s
    first, second = row["passes_s"]
    out = {"model": row["model"], "between_passes": _figures(rank_fidelity(first, second))}
    for name, learn, judge in (("1->2", first, second), ("2->1", second, first)):
        ways = {**rankings(programs, learn, calibrated_tensor_s), **alternatives}
        out[name] = {
            way: _figures(rank_fidelity(times, judge))
            for way, times in ways.items()
            if way != "learned"
        }
        out[name]["learned"] = ways["learned"]
    out["alternatives"] = list(alternatives)
    # Nothing is learned by the profile's ways: they are judged on both passes' mean too.
    mean = {label: (first[label] + second[label]) / 2 for label in first}
    shipped = {label: simulated for label, (_, _, _, simulated) in programs.items()}
    out["against the mean"] = {
        way: _figures(rank_fidelity(times, mean))
        for way, times in {"profile": shipped, **alternatives}.items()
    }
    return out


def _figures(fidelity) -> dict:
    return {
        "kendall_tau": fidelity.kendall_tau,
        "top1_regret": fidelity.top1_regret,
        "choice": fidelity.simulator_choice,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", help="rank_fidelity.py --passes 2 --json output")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--tuple-tensor-s",
        type=float,
        action="append",
        default=[],
        help="also rank with the profile's tuple tensor cost set to this (seconds)",
    )
    args = parser.parse_args()
    try:
        with open(args.rows) as file:
            rows = [row for row in json.load(file) if "passes_s" in row]
    except (OSError, ValueError, TypeError) as error:
        print(
            f"cross_pass_learning: {args.rows}: not rank_fidelity JSON rows ({error})",
            file=sys.stderr,
        )
        sys.exit(2)
    if not rows:
        print(
            f"cross_pass_learning: {args.rows}: no rows measured with --passes 2", file=sys.stderr
        )
        sys.exit(2)
    if any(row["model"].startswith("keras:") for row in rows):
        os.environ["KERAS_BACKEND"] = "jax"
    import jax

    jax.config.update("jax_num_cpu_devices", DEVICES)
    results = [model_row(row, tuple(args.tuple_tensor_s)) for row in rows]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        between = result["between_passes"]
        print(
            f"{result['model']}: between passes tau {between['kendall_tau']:.2f}, "
            f"regret {between['top1_regret']:.1%}"
        )
        for way, figures in result["against the mean"].items():
            print(
                f"  {way} against the passes' mean: tau {figures['kendall_tau']:.2f}, "
                f"regret {figures['top1_regret']:.1%} (chose {figures['choice']})"
            )
        for direction in ("1->2", "2->1"):
            learned = result[direction]["learned"]
            message_s, tensor_s = learned["two costs"]
            print(
                f"  learn {direction}: one cost {learned['one cost'] * 1e6:.1f} us; two costs "
                f"{message_s * 1e6:.1f} us a collective, {tensor_s * 1e6:.1f} us a tuple tensor"
            )
            for way in ("profile", "one cost", "two costs", *result["alternatives"]):
                figures = result[direction][way]
                print(
                    f"    {way:10s} tau {figures['kendall_tau']:5.2f}  regret "
                    f"{figures['top1_regret']:6.1%}  (chose {figures['choice']})"
                )


if __name__ == "__main__":
    main()
