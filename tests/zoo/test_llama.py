"""The Llama-style zoo model (scan over layers with checkpointing, bf16 parameters
with an f32 optimizer state, jax.jit over a data x FSDP mesh): its module has the
loops and collectives of real large-model training, every CLI verb works on it,
XLA's dump after partitioning is read as the same module as the one captured,
and `disco_xla.jit` runs it optimised and equal to JAX's own program."""

from __future__ import annotations

import json
import os
from collections import Counter

import jax
import numpy as np
import pytest

import disco_xla
from disco_xla import capture_jax, save_module
from disco_xla.hlo.collectives import device_groups
from disco_xla.hlo.hlo_io import load_module
from disco_xla.plan import Plan
from disco_xla.runtime.output_comparison import compare_outputs
from disco_xla.search.baselines import BASELINES
from disco_xla.simulator.comm import collective_s, group_profile
from disco_xla.simulator.cost_models import RooflineCostModel
from disco_xla.simulator.events import simulate, to_ps
from disco_xla.simulator.kernels import build_task_graph
from disco_xla.simulator.profiles import load_profile
from disco_xla.zoo.llama import LLAMA3_8B, LLAMA_1B, build_llama_step
from tests.conftest import run_cli, simulate_plans


@pytest.fixture(scope="module")
def step():
    return build_llama_step("tiny", devices=4, global_batch=8, fsdp=2)


@pytest.fixture(scope="module")
def forms(step, tmp_path_factory) -> dict[str, str]:
    """The module as disco-xla captures it, and the module XLA dumped after its
    SPMD partitioner (`--xla_dump_hlo_pass_re=spmd-partitioning`)."""
    fn, args, _, _ = step
    directory = tmp_path_factory.mktemp("llama")
    captured = str(directory / "captured.hlo.pb")
    save_module(capture_jax(fn, *args), captured)
    dump = directory / "dump"
    fn.lower(*args).compile(
        compiler_options={
            "xla_dump_to": str(dump),
            "xla_dump_hlo_pass_re": "spmd-partitioning",
            "xla_dump_hlo_as_proto": True,
        }
    )
    return {"captured": captured, "dump": str(dump)}


def test_the_step_has_loops_bf16_parameters_and_the_partitioners_collectives(step, forms):
    fn, args, tensors, _ = step
    params, (master, adam), _ = args
    assert {str(leaf.dtype) for leaf in jax.tree_util.tree_leaves(params)} == {"bfloat16"}
    assert {str(leaf.dtype) for leaf in jax.tree_util.tree_leaves(master)} == {"float32"}
    module = load_module(forms["captured"])
    assert module.already_partitioned
    opcodes = Counter(i.opcode for i in module.instructions())
    assert opcodes["while"] >= 2  # the scan, forward and backward
    assert opcodes["all-gather"] > 0  # FSDP's parameter gathers
    # Gradients reduced inside the backward loop's body are found as gradients.
    loops = {c.name for c in module.computations if c.role == "program"} - {module.entry.name}
    inside = [a for a in module.gradient_all_reduces if a.computation in loops]
    assert inside, [(a.name, a.computation) for a in module.gradient_all_reduces]
    assert len(module.gradient_all_reduces) >= tensors
    assert any("bf16" in a.shape for a in module.gradient_all_reduces)


def test_the_full_size_has_about_a_billion_parameters_and_lowers_from_shapes():
    fn, args, tensors, count = build_llama_step("full", 4, 8, 2, concrete=False)
    assert 1.0e9 < count < 1.2e9, count  # TinyLlama's 1.1B
    assert LLAMA_1B.layers == 22 and tensors == 12  # layer parameters stacked
    text = fn.lower(*args).as_text()
    assert "stablehlo.while" in text and "bf16" in text


def test_every_verb_works_on_it(forms, tmp_path):
    # On the captured form; the dump is read as the same module (tested below).
    path = forms["captured"]
    summary = run_cli("inspect", "--json", path)
    assert summary.returncode == 0, summary.stderr[-1500:]
    assert json.loads(summary.stdout)["partitioning"] == "one partition's program"
    simulate_plans(path, "cpu-local", BASELINES)
    out = str(tmp_path / "out.hlo.pb")
    result = run_cli(
        "optimize",
        path,
        "--cluster",
        "cpu-local",
        "--max-evals",
        "30",
        "--candidates",
        "1",
        "-o",
        out,
        "--json",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["measured"]["equal"]
    applied = run_cli(
        "apply", path, out + ".plan.json", "-o", str(tmp_path / "applied.hlo.pb"), "--json"
    )
    assert applied.returncode == 0, applied.stderr[-2000:]
    verified = run_cli("verify", path, out, "--devices", "4", "--json")
    assert verified.returncode == 0, verified.stderr[-2000:]
    assert json.loads(verified.stdout)["equal"]


def test_disco_xla_jit_runs_it_optimised_and_bit_equal_to_jax(tmp_path):
    # Built afresh: the module fixture's arrays are shared with other tests.
    fn, args, _, _ = build_llama_step("tiny", devices=4, global_batch=8, fsdp=2)
    optimized = disco_xla.jit(
        fn, cache_dir=str(tmp_path), max_evaluations=20, check_speed=False, background=False
    )
    optimized(*args)
    assert optimized.status() == ["optimized"], optimized.status()
    got, expected = optimized(*args), fn(*args)
    leaves = [jax.tree_util.tree_leaves(t) for t in (expected, got)]
    assert all(a.sharding == b.sharding for a, b in zip(*leaves, strict=True))
    verdict = compare_outputs(
        [np.asarray(a) for a in leaves[0]], [np.asarray(b) for b in leaves[1]]
    )
    assert verdict.bit_equal, verdict


def test_the_dump_directory_is_read_at_its_module_after_partitioning(forms):
    names = os.listdir(forms["dump"])
    assert any("after_spmd-partitioning" in n for n in names)
    summary = json.loads(run_cli("inspect", "--json", forms["dump"]).stdout)
    assert "after_spmd-partitioning" in summary["file"]
    assert summary["partitioning"] == "one partition's program"
    # The same program as the one disco-xla captures: same ops, same gradients.
    captured, dumped = load_module(forms["captured"]), load_module(forms["dump"])
    assert dumped.already_partitioned
    assert Counter(i.opcode for i in dumped.instructions()) == Counter(
        i.opcode for i in captured.instructions()
    )
    shapes = [sorted(a.shape for a in m.gradient_all_reduces) for m in (captured, dumped)]
    assert shapes[0] == shapes[1] and shapes[0]


def test_llama3_8b_has_its_8_billion_parameters_and_lowers_from_shapes():
    fn, args, tensors, count = build_llama_step(
        "full", 4, 4, 2, concrete=False, model="llama3_8b", sequence=64
    )
    assert 8.0e9 < count < 8.1e9, count  # Llama-3 8B: 8.03B
    assert LLAMA3_8B.kv_heads == 8 and LLAMA3_8B.vocab == 128256 and tensors == 12
    text = fn.lower(*args).as_text()
    assert "stablehlo.while" in text and "64x128256" in text


def test_capture_on_a_mesh_puts_fsdp_gathers_inside_a_node_and_the_data_axis_across(tmp_path):
    """16 devices as 2 nodes of 8: FSDP over a node's 8, data over the 2 nodes.
    Each collective's groups are the mesh axis it reduces over, and the
    simulator prices each over the nodes its groups span."""
    path = str(tmp_path / "llama.hlo.pb")
    common = ["--model", "llama3_8b", "--mode", "sharded", "--replicas", "16"]
    result = run_cli(
        "capture", *common, "--fsdp", "8", "--sequence", "8", "-o", path, "--json", timeout_s=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    module = load_module(path)
    gathers = [i for i in module.instructions() if i.opcode.startswith("all-gather")]
    assert gathers
    for gather in gathers:  # inside one node
        groups = device_groups(gather.proto)
        assert all(len({d // 8 for d in g}) == 1 and len(g) == 8 for g in groups)
    spans = {len({d // 8 for d in g}) for a in module.gradient_all_reduces for g in a.groups}
    assert 2 in spans  # some gradients are reduced across the two nodes
    profile = load_profile("a100-2x8-100g")  # 2 nodes of 8: the capture's own count
    graph = build_task_graph(module, Plan.unfused(module))
    result = simulate(graph, profile, RooflineCostModel(profile))
    inside = group_profile(profile, tuple(range(8)), 16)
    assert (inside.nodes, inside.devices_per_node) == (1, 8)
    spans = result.spans_ps
    gathered_ps = sum(end - start for _, _, kind, start, end in spans if kind == "all-gather")
    gather_tasks = [
        (size, graph.communication_runs[task])
        for task, (_, size, _) in enumerate(graph.communications)
        if graph.communication_kind(task) == "all-gather"
    ]

    def priced_ps(over) -> int:
        return sum(runs * to_ps(collective_s("all-gather", s, over)) for s, runs in gather_tasks)

    expected_ps, everyone_ps = priced_ps(inside), priced_ps(profile)
    assert gathered_ps == expected_ps > 0
    assert gathered_ps < everyone_ps  # over every worker, each would cross the nodes
    # The search runs on it for that profile (its buckets used to deadlock the
    # stream schedule: `streams.issue_order`), never slower than a baseline.
    plan = str(tmp_path / "plan.json")
    optimized = run_cli(
        "optimize", path, "--cluster", "a100-2x8-100g", "--max-evals", "40", "-o", plan, "--json"
    )
    assert optimized.returncode == 0, optimized.stderr[-2000:]
    report = json.loads(optimized.stdout)
    assert all(report["plan_s"] <= seconds for seconds in report["baselines"].values())
    # Refused in one line: an FSDP axis that does not divide the devices, and
    # the mesh options on a model that has no mesh.
    refused = run_cli("capture", *common, "--fsdp", "3", "-o", path)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    refused = run_cli("capture", "--model", "resnet50", "--fsdp", "2", "-o", path)
    assert refused.returncode == 2 and "--fsdp" in refused.stderr
