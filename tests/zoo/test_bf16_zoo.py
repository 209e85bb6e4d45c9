"""The zoo's mixed-precision variant: f32 master parameters, bf16 compute and
bf16 gradient all-reduces. The CLI captures it, `inspect` and the simulator
count bf16 bytes, `disco_xla.jit` runs it optimised and equal, and models whose
batch norm needs f32 are refused with one line."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import disco_xla
from disco_xla.hlo.hlo_io import load_module
from disco_xla.plan import Plan
from disco_xla.runtime.output_comparison import compare_outputs
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.zoo.jax_steps import build_jax_step
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict[str, str]:
    directory = tmp_path_factory.mktemp("bf16")
    paths = {}
    for precision in ("f32", "bf16"):
        path = str(directory / f"gpt2_{precision}.hlo.pb")
        result = run_cli(
            "capture", "--model", "gpt2_small", "--precision", precision, "-o", path, "--json"
        )
        assert result.returncode == 0, result.stderr
        paths[precision] = path
    return paths


def test_the_bf16_variant_sends_bf16_gradients_of_half_the_bytes(captures):
    summaries = {
        precision: json.loads(run_cli("inspect", "--json", path).stdout)
        for precision, path in captures.items()
    }
    f32, bf16 = summaries["f32"], summaries["bf16"]
    assert bf16["gradient_all_reduces"] == f32["gradient_all_reduces"] > 0
    assert bf16["gradient_all_reduce_bytes"] * 2 == f32["gradient_all_reduce_bytes"]
    module = load_module(captures["bf16"])
    assert {a.shape.split("[")[0] for a in module.gradient_all_reduces} == {"bf16"}
    graph = build_task_graph(module, Plan.unfused(module))
    sent = sum(
        size for (_, size, _), b in zip(graph.communications, graph.is_bucket, strict=True) if b
    )
    assert sent == bf16["gradient_all_reduce_bytes"]
    assert "bf16" in {kernel.element_type for kernel in graph.kernels}


def test_disco_xla_jit_runs_the_bf16_step_optimised_and_equal(tmp_path):
    step = build_jax_step("gpt2_small", "tiny", replicas=2, global_batch=4, precision="bf16")
    optimized = disco_xla.jit(
        step.fn, cache_dir=str(tmp_path), max_evaluations=10, check_speed=False, background=False
    )
    got = optimized(*step.args)
    (status,) = optimized.status()
    assert status.startswith("optimized"), status
    expected = step.fn(*step.args)
    left = [np.asarray(x) for x in jax.tree_util.tree_leaves(expected)]
    right = [np.asarray(x) for x in jax.tree_util.tree_leaves(got)]
    assert compare_outputs(left, right).equal
    assert all(np.isfinite(x).all() for x in right)
