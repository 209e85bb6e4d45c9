"""The partitioner's all-reduce + dynamic-slice pairs made reduce-scatters, as
XLA:GPU's creator makes them: on the tiny Llama FSDP step, every proven pair
becomes a reduce-scatter under the all-reduce's name, the gradients stay the
same gradients, the step computes the same on 4 CPU devices, and what
`disco-xla optimize` writes sends them as reduce-scatters."""

from __future__ import annotations

from disco_xla.driver.planning import prepared
from disco_xla.hlo.graph import HloModule
from disco_xla.hlo.hlo_io import load_module
from disco_xla.hlo.xla_gpu_patterns import scattered_dimensions
from disco_xla.hlo_passes.create_reduce_scatters import CreateReduceScatters
from disco_xla.runtime.candidate_timing import verify_rewrite
from tests.conftest import run_cli


def _copy(module: HloModule) -> HloModule:
    return HloModule.from_bytes(module.to_bytes(), module.source, module.file_format)


def test_each_proven_pair_becomes_a_reduce_scatter_computing_the_same(fsdp_step):
    pairs = scattered_dimensions(fsdp_step)
    assert pairs
    created = _copy(fsdp_step)
    assert CreateReduceScatters().run(created)
    for name, dimension in pairs.items():
        scatter = created.instruction(name)
        assert scatter.opcode == "reduce-scatter"
        assert list(scatter.proto.dimensions) == [dimension]
        # The device's own quarter (groups of 4), as the slice kept.
        assert scatter.shape.bytes * 4 == fsdp_step.instruction(name).shape.bytes
    assert scattered_dimensions(created) == {}
    assert not CreateReduceScatters().run(created)  # nothing left to create
    kinds = {a.name: a.kind for a in created.gradient_all_reduces}
    assert set(kinds) == {a.name for a in fsdp_step.gradient_all_reduces}
    assert {kinds[n] for n in pairs if n in kinds} == {"reduce-scatter"}
    checked = verify_rewrite(fsdp_step, created, devices=4, rounds=1)
    assert checked.equal


def test_plans_are_made_for_the_module_with_its_reduce_scatters(fsdp_step, tmp_path):
    assert scattered_dimensions(prepared(fsdp_step)) == {}
    path = tmp_path / "fsdp.hlo.pb"
    path.write_bytes(fsdp_step.to_bytes())
    out = tmp_path / "out.hlo.pb"
    args = [str(path), "--cluster", "h100-32x8-ib400", "--max-evals", "60"]
    result = run_cli("optimize", *args, "-o", str(out), "--no-check", timeout_s=600)
    assert result.returncode == 0, result.stderr[-2000:]
    written = load_module(out)
    opcodes = [i.opcode for i in written.instructions()]
    assert "reduce-scatter" in opcodes
    assert scattered_dimensions(written) == {}


def test_a_data_parallel_all_reduce_of_a_created_block_stays_a_gradient():
    from disco_xla.zoo import capture_model

    # Data parallel over 2 x FSDP over 2: each gradient is reduce-scattered
    # over its FSDP pair, then its block all-reduced over the data pair.
    module = capture_model("llama", "jax", 4, mode="sharded", fsdp=2).module
    pairs = scattered_dimensions(module)
    assert pairs
    created = _copy(module)
    assert CreateReduceScatters().run(created)
    before = {a.name: a.kind for a in module.gradient_all_reduces}
    after = {a.name: a.kind for a in created.gradient_all_reduces}
    assert set(after) == set(before)
    assert {after[name] for name in pairs if name in after} == {"reduce-scatter"}
    chained = [
        a.name
        for a in created.gradient_all_reduces
        if a.kind == "all-reduce"
        and any(o.opcode == "reduce-scatter" for o in created.instruction(a.name).operands)
    ]
    assert chained, "the data-parallel all-reduces of the blocks are gradients"
