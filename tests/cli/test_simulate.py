"""`disco-xla simulate` as a user runs it: on a captured step, several plans in
one run, and a plan for another module refused."""

from __future__ import annotations

import dataclasses
import json

from disco_xla.plan import Plan
from tests.conftest import run_cli, simulate_plans


def test_simulate_cli_on_a_captured_step(module_files, tmp_path):
    path = module_files["jax_pmap_step"]
    result = run_cli(
        "simulate",
        path,
        "--cluster",
        "a100-2x8-100g",
        "--json",
        "--trace",
        str(tmp_path / "t.json"),
        "--plot",
        str(tmp_path / "g.png"),
    )
    assert result.returncode == 0, result.stderr
    none = json.loads(result.stdout)
    for key in ("iteration_s", "compute_s", "comm_s", "exposed_comm_s", "ideal_s"):
        assert none[key] > 0
    assert none["buckets"] == 4 and none["cost_model"] == "roofline"
    assert json.load(open(tmp_path / "t.json"))["traceEvents"]
    # The same step with every gradient in one bucket is a different, legal plan.
    from disco_xla import load_module

    plan = Plan.unfused(load_module(path))
    merged = dataclasses.replace(
        plan, all_reduce_buckets=(tuple(n for b in plan.all_reduce_buckets for n in b),)
    )
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(merged.to_json())
    one = json.loads(
        run_cli(
            "simulate", path, "--cluster", "a100-2x8-100g", "--plan", str(plan_path), "--json"
        ).stdout
    )
    assert one["buckets"] == 1 and one["iteration_s"] != none["iteration_s"]


def test_simulate_refuses_a_plan_for_another_module(module_files, tmp_path):
    from disco_xla import load_module

    other = Plan.unfused(load_module(module_files["jax_shard_map_step"]))
    plan_path = tmp_path / "other.json"
    plan_path.write_text(other.to_json())
    result = run_cli(
        "simulate",
        module_files["jax_pmap_step"],
        "--cluster",
        "cpu-local",
        "--plan",
        str(plan_path),
    )
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "another module" in result.stderr and str(plan_path) in result.stderr


def test_simulate_cli_runs_several_plans_in_one_run_as_each_runs_alone(module_files, tmp_path):
    path = module_files["jax_pmap_step"]
    plans = ("xla", "none", "xla-nocombine")
    together = simulate_plans(path, "cpu-local", plans)
    for plan in ("xla", "xla-nocombine"):  # XLA's compiles, shared, change nothing
        alone = simulate_plans(path, "cpu-local", [plan])[plan]
        assert together[plan] == alone
    assert together["xla"]["buckets"] < together["none"]["buckets"]
    # As text, each plan is reported; the Gantt chart has every plan.
    chart = tmp_path / "gantt.png"
    text = run_cli(
        "simulate", path, "--cluster", "cpu-local", "--plan", "none", "--plan", "xla",
        "--plot", str(chart),
    )  # fmt: skip
    assert text.returncode == 0, text.stderr[-1500:]
    assert "plan none," in text.stdout and "plan xla," in text.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A trace is one plan's: asked of two, a one-line error naming the file.
    trace = str(tmp_path / "t.json")
    refused = run_cli(
        "simulate", path, "--cluster", "cpu-local", "--plan", "none", "--plan", "xla",
        "--trace", trace,
    )  # fmt: skip
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert trace in refused.stderr and "--trace" in refused.stderr
