"""The `disco-xla` command as a user runs it: inspect, convert, bad input, flags' defaults."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

REQUIRED_KEYS = {"instructions", "computations", "all_reduces", "all_reduce_bytes", "flops"}


def test_inspect_json_reports_the_pmap_step(module_files):
    result = run_cli("inspect", module_files["jax_pmap_step"], "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert REQUIRED_KEYS <= summary.keys()
    assert summary["all_reduces"] == 5 and summary["gradient_all_reduces"] == 4
    assert summary["gradient_all_reduce_bytes"] == (64 * 256 + 256 + 256 * 10 + 10) * 4
    assert summary["num_partitions"] == 4 and summary["num_replicas"] == 1
    assert summary["opcodes"]["all-reduce"] == 5
    assert summary["flops"] > 2 * 32 * 64 * 256  # at least the first layer's forward dot
    assert summary["format"] == "pb"


def test_inspect_prints_a_readable_summary(module_files):
    result = run_cli("inspect", module_files["tf_train_step"])
    assert result.returncode == 0, result.stderr
    assert "instructions" in result.stdout and "all-reduces   0" in result.stdout
    assert "dot 3" in result.stdout or "dot " in result.stdout


def test_convert_between_formats_keeps_the_module(module_files, tmp_path):
    text = tmp_path / "step.txt"
    packed = tmp_path / "step.pb.gz"
    assert run_cli("convert", module_files["jax_pmap_step"], str(text)).returncode == 0
    assert text.read_text().startswith("HloModule")
    assert run_cli("convert", str(text), str(packed)).returncode == 0
    summaries = [
        json.loads(run_cli("inspect", str(path), "--json").stdout)
        for path in (module_files["jax_pmap_step"], text, packed)
    ]
    assert [s["format"] for s in summaries] == ["pb", "txt", "pb.gz"]
    for key in ("instructions", "computations", "all_reduces", "gradient_all_reduces", "flops"):
        assert len({s[key] for s in summaries}) == 1, key


BAD_INPUTS = {
    "truncated.pb": None,  # filled from a real module below
    "empty.pb": b"",
    "wrong_type.pb": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10",
    "notes.md": b"# a markdown file\n\nnot a module\n",
    "bad.txt": b"HloModule m\n\nENTRY main {\n  ROOT p = f32[2] parameter(0\n}\n",
    "aborts_xla.hlo": b"HloModule m\n\nENTRY main {\n  p = f32[5,4] parameter(0)\n"
    b"  ROOT r = f32[3,4] reshape(p)\n}\n",
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS) + ["missing.pb"])
def test_bad_input_gives_one_line_naming_the_file_and_exit_2(module_files, tmp_path, name):
    path = tmp_path / name
    if name == "truncated.pb":
        data = open(module_files["jax_pmap_step"], "rb").read()
        path.write_bytes(data[: len(data) * 2 // 3])
    elif name != "missing.pb":
        path.write_bytes(BAD_INPUTS[name])
    result = run_cli("inspect", str(path))
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("disco-xla: error: ") and str(path) in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_verbose_shows_the_traceback(tmp_path):
    path = tmp_path / "empty.pb"
    path.write_bytes(b"")
    result = run_cli("inspect", str(path), "--verbose")
    assert result.returncode == 2
    assert "Traceback" in result.stderr and "the file is empty" in result.stderr


def test_convert_to_an_unknown_format_exits_2(module_files, tmp_path):
    result = run_cli("convert", module_files["tf_train_step"], str(tmp_path / "out.json"))
    assert result.returncode == 2
    assert "unknown output format" in result.stderr and len(result.stderr.splitlines()) == 1


def test_demo_captures_inspects_and_finds_every_gradient(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "disco_xla.demo"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": REPO_ROOT},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "4 gradient all-reduces found for 4 parameter tensors (as expected)" in result.stdout
    # Step 6: the sharded jax.jit form on 4 processes, checked equal on every rank.
    assert "[0]    outputs against jax.jit's own program, on every rank: equal" in result.stdout
    assert "[0]    disco_xla.jit runs: " in result.stdout
    assert (tmp_path / "build" / "demo" / "mlp_step.hlo.pb").exists()
    _check_demo_pricing(result.stdout, tmp_path / "build" / "demo" / "report.html")


def _check_demo_pricing(stdout: str, report_path) -> None:
    """Each step of the demo is priced with the profile calibrated on the
    runtime it measures, names it, and prints simulated beside measured."""
    import re

    steps = dict(re.findall(r"^(\d)\. (.*?)(?=^\d\. |\Z)", stdout, re.S | re.M))
    assert set(steps) == {"1", "2", "3", "4", "5", "6"}, stdout[-3000:]
    assert steps["2"].startswith("searching with the cpu-local-inprocess profile")
    for number in ("3", "4"):  # measured in this process, on 4 CPU devices
        assert "   profile: cpu-local-inprocess (" in steps[number], steps[number]
        assert "simulated ms   measured ms" in steps[number]
    assert "priced with cpu-local-inprocess" in steps["5"]
    assert "on cpu-local-inprocess" in report_path.read_text()
    # Measured on 4 gloo processes: the multi-process profile, on rank 0's lines.
    assert "[0]    profile: cpu-local (" in steps["6"], steps["6"]
    assert "cpu-local-inprocess" not in steps["6"]
    for number, row in (("4", "jax.pmap (XLA)"), ("6", "jax.jit (XLA)")):
        line = next(x for x in steps[number].splitlines() if x.strip(" [0]").startswith(row))
        simulated_ms, measured_ms = (float(x) for x in line.split()[-2:])
        # A load on the machine only makes the measured time longer; priced with
        # the other runtime's profile, step 4 was simulated at 21x its measured time.
        assert simulated_ms < 10 * measured_ms, line
        jit = next(x for x in steps[number].splitlines() if "disco_xla.jit (" in x)
        assert len(re.findall(r"\d+\.\d{3}", jit)) == 2, jit


def test_a_reader_that_stops_early_is_not_an_internal_error(module_files):
    """`disco-xla inspect ... | head`: the reader has gone when we write."""
    import os
    import subprocess
    import sys

    command = os.path.join(os.path.dirname(sys.executable), "disco-xla")
    child = subprocess.Popen(
        [command, "inspect", module_files["jax_pmap_step"]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child.stdout.close()  # no reader: every write fails with a broken pipe
    _, errors = child.communicate(timeout=120)
    assert "internal error" not in errors and "Traceback" not in errors, errors
    assert child.returncode == 141


def test_optimize_flags_default_to_the_shared_settings():
    from disco_xla.cli import build_parser
    from disco_xla.settings import DEFAULTS

    args = build_parser().parse_args(["optimize", "step.pb", "--cluster", "c", "-o", "p.json"])
    assert (args.budget_s, args.max_evals, args.alpha, args.seed) == (
        DEFAULTS.budget_s,
        DEFAULTS.max_evaluations,
        DEFAULTS.alpha,
        DEFAULTS.seed,
    )
    assert (args.cost_model, args.candidates, args.measure_budget_s) == (
        DEFAULTS.cost_model,
        DEFAULTS.candidates,
        DEFAULTS.measure_budget_s,
    )


def test_python_dash_m_runs_the_same_command_line():
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "disco_xla.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_cli("--help").stdout
    for command in ("inspect", "capture", "calibrate", "optimize", "profile", "eval-cost-model"):
        assert command in result.stdout


def test_optimize_measure_times_the_candidates_and_writes_only_a_plan(module_files, tmp_path):
    from disco_xla import load_module
    from disco_xla.plan import Plan, verify_plan

    plan_path = tmp_path / "plan.json"
    result = run_cli(
        "optimize",
        module_files["jax_pmap_step"],
        "--cluster",
        "cpu-local",
        "--max-evals",
        "40",
        "--candidates",
        "2",
        "--measure",
        "-o",
        str(plan_path),
        "--json",
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    measured, written = summary["measured"], summary["written"]
    timed = {label: e for label, e in measured["candidates"].items() if "seconds" in e}
    assert "plan" in timed and all(e["equal"] for e in timed.values()), measured
    faster = {
        label: e["seconds"] for label, e in timed.items() if e["seconds"] < measured["original_s"]
    }
    assert written == (min(faster, key=faster.get) if faster else "original")
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no module written
    verify_plan(Plan.from_json(plan_path.read_text()), load_module(module_files["jax_pmap_step"]))
    refused = run_cli(
        "optimize",
        module_files["jax_pmap_step"],
        "--cluster",
        "cpu-local",
        "--measure",
        "--no-check",
        "-o",
        str(plan_path),
    )
    assert refused.returncode == 2 and "--measure" in refused.stderr
