"""Every planning verb, run as a user runs it, on modules of the kinds a user
hands us: the zoo's captures (JAX pmap and shard_map, TF), and hand-written HLO
from production GPU jobs (`tests/data/hlo_corpus/`: GPU-only library calls,
bf16, scheduled async collectives, collectives in loops and conditionals,
collective-permute pipelines, a computation called twice). Each verb gives a
result, or one line `FILE: unsupported: ...` with exit 2; never an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from disco_xla.hlo.hlo_io import load_module
from tests.conftest import run_cli

CORPUS = Path(__file__).parent / "data" / "hlo_corpus"
HAND_WRITTEN = sorted(CORPUS.glob("*.hlo.txt"))
CLUSTER = "h200-8x8-ib400"
SEARCH = ("--max-evals", "30", "--budget-s", "5")


def _result(result, path: str) -> dict | None:
    """The verb's JSON, or None for a one-line `unsupported` refusal."""
    assert "internal error" not in result.stderr, result.stderr[-1500:]
    if result.returncode == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and ": unsupported: " in lines[0], result.stderr[-800:]
        return None
    assert result.returncode == 0, result.stderr[-1500:]
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")][-1]


def _every_verb(path: str, tmp_path) -> dict:
    """inspect, simulate (no fusion, XLA, XLA with overlap), optimize writing the
    module unmeasured, apply of its plan: each verb's JSON by name."""
    found = {"inspect": _result(run_cli("inspect", path, "--json"), path)}
    plans = ("--plan", "none", "--plan", "xla", "--plan", "xla-overlap")
    found["simulate"] = _result(
        run_cli("simulate", path, "--cluster", CLUSTER, *plans, "--json"), path
    )
    written = str(tmp_path / "written.hlo.txt")
    optimize = ("optimize", path, "--cluster", CLUSTER, *SEARCH, "--no-check", "-o", written)
    found["optimize"] = _result(run_cli(*optimize, "--json"), path)
    if found["optimize"] is not None:
        again = str(tmp_path / "applied.hlo.pb")
        apply = ("apply", path, written + ".plan.json", "-o", again, "--no-check", "--json")
        found["apply"] = _result(run_cli(*apply), path)
        found["written"] = load_module(written)
    return found


@pytest.mark.parametrize("path", HAND_WRITTEN, ids=[p.name.split(".")[0] for p in HAND_WRITTEN])
def test_every_verb_on_hand_written_production_modules(path, tmp_path):
    found = _every_verb(str(path), tmp_path)
    assert found["inspect"]["instructions"] > 0
    rows = found["optimize"]["rows"]
    # The plan is never slower than XLA with its latency-hiding scheduler.
    assert rows["found"]["iteration_s"] <= rows["xla-overlap"]["iteration_s"]
    original = load_module(path)
    written = found["written"]
    calls = {i.name: i for i in written.instructions() if i.opcode == "custom-call"}
    for instr in original.instructions():
        if instr.opcode == "custom-call":  # every library call kept as it was
            kept = calls[instr.name]
            assert kept.proto.custom_call_target == instr.proto.custom_call_target
            assert kept.proto.backend_config == instr.proto.backend_config
            assert [o.shape for o in kept.operands] == [o.shape for o in instr.operands]


@pytest.mark.parametrize("name", ["jax_pmap_step", "jax_shard_map_step", "tf_train_step"])
def test_every_verb_on_the_zoo_captures(module_files, name, tmp_path):
    found = _every_verb(module_files[name], tmp_path)
    assert found["optimize"]["fusion_source"] == "compile"


def test_a_module_that_does_not_compile_here_is_planned_from_the_fusion_model(tmp_path):
    path = str(CORPUS / "gpu_custom_calls.hlo.txt")
    found = _every_verb(path, tmp_path)
    assert found["optimize"]["fusion_source"] == "model"
    assert "modelled" in found["simulate"]["plan_note"]  # the xla-overlap baseline's
    written = str(tmp_path / "written.hlo.pb")
    result = run_cli("optimize", path, "--cluster", CLUSTER, *SEARCH, "-o", written)
    assert result.returncode == 0, result.stderr[-1500:]
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith(f"wrote {written}: ") and "not measured" in line


def test_a_gradient_all_reduce_in_a_computation_called_twice_is_one_collective_per_call(
    tmp_path,
):
    path = str(CORPUS / "cycle_repro.hlo.txt")
    result = run_cli("simulate", path, "--cluster", CLUSTER, "--json")
    summary = _result(result, path)
    assert summary["collectives"] == 2 and summary["buckets"] == 0
